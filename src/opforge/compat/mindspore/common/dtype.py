"""MindSpore-style dtype objects (``mstype.float32``), each naming a NumPy dtype.

``Tensor.dtype`` is one of these, as in MindSpore, so ``x.dtype == mstype.float32``
holds; a dtype also equals the NumPy dtype, scalar type and ABI name it stands
for (``x.dtype == np.float32``), hashes as that NumPy dtype does, and NumPy
takes it wherever it takes a dtype (``np.zeros(3, mstype.float16)``).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .... import dtypes as _dtypes
from ....errors import DTypeError


class Type:
    def __init__(self, name: str, numpy_dtype: str) -> None:
        self.name = name
        self.numpy_dtype = numpy_dtype

    @property
    def dtype(self) -> np.dtype[Any]:
        """The NumPy dtype (NumPy reads a ``dtype`` attribute when handed this object as a dtype)."""
        return _dtypes.to_numpy(self.numpy_dtype)

    def __repr__(self) -> str:
        return self.name[0].upper() + self.name[1:]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Type):
            return other.numpy_dtype == self.numpy_dtype
        if isinstance(other, (str, np.dtype)) or (isinstance(other, type) and issubclass(other, np.generic)):
            try:
                return _dtypes.normalize(other) == self.numpy_dtype
            except DTypeError:  # "abc", np.object_: no dtype opforge knows, so not this one
                return False
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.dtype)


bool_ = Type("bool", "bool")
int8 = Type("int8", "int8")
int16 = Type("int16", "int16")
int32 = Type("int32", "int32")
int64 = Type("int64", "int64")
uint8 = Type("uint8", "uint8")
uint16 = Type("uint16", "uint16")
uint32 = Type("uint32", "uint32")
uint64 = Type("uint64", "uint64")
float16 = Type("float16", "float16")
float32 = Type("float32", "float32")
float64 = Type("float64", "float64")
int_ = int32
uint = uint32
float_ = float32
double = float64
half = float16

__all__ = ["bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
           "float64", "int_", "uint", "float_", "double", "half"]

if "bfloat16" in _dtypes.ABI_DTYPES:  # with ml_dtypes installed, as opforge's own bfloat16 is
    bfloat16 = Type("bfloat16", "bfloat16")
    __all__.append("bfloat16")

# name -> mstype (an alias is the same object as the name it stands for)
_BY_NAME: dict[str, Type] = {t.numpy_dtype: t for t in (globals()[name] for name in __all__)}


def of(dtype: Any) -> Type:
    """The mstype for a NumPy dtype (or anything opforge takes as one)."""
    return _BY_NAME[_dtypes.normalize(dtype)]
