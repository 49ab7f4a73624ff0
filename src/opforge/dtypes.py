"""Data types: one name per dtype, shared by NumPy and the kernel ABI.

A kernel sees a dtype as the string the aot ABI defines ("float32", "int64",
"bool", ...).  Python code may name a dtype any way NumPy understands, or with
the ABI's aliases ("float" is float32, "int" int32, "uint" uint32).
"""
from __future__ import annotations

from typing import Any, TypeAlias

import numpy as np

from .errors import DTypeError

#: What opforge takes as a dtype: an ABI name or alias, a NumPy dtype or scalar type, or a framework's dtype object
#: (anything with a ``numpy_dtype``); anything else raises DTypeError at run time.
DTypeLike: TypeAlias = Any

# ABI name -> NumPy dtype.  Order matters only for documentation.
_ABI_TO_NUMPY: dict[str, np.dtype[Any]] = {
    "bool": np.dtype(np.bool_),
    "int8": np.dtype(np.int8),
    "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "uint8": np.dtype(np.uint8),
    "uint16": np.dtype(np.uint16),
    "uint32": np.dtype(np.uint32),
    "uint64": np.dtype(np.uint64),
    "float16": np.dtype(np.float16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
}
_ALIASES = {"float": "float32", "int": "int32", "uint": "uint32", "double": "float64", "half": "float16"}

try:  # bfloat16 is not a NumPy type; ml_dtypes provides it when installed.
    import ml_dtypes

    _ABI_TO_NUMPY["bfloat16"] = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    pass

_NUMPY_TO_ABI = {dt: name for name, dt in _ABI_TO_NUMPY.items()}

#: Every dtype name a kernel can be handed.
ABI_DTYPES = tuple(_ABI_TO_NUMPY)


def to_numpy(dtype: DTypeLike) -> np.dtype[Any]:
    """The NumPy dtype for ``dtype`` (an ABI name, alias, NumPy dtype or scalar type)."""
    if isinstance(dtype, str):
        name = _ALIASES.get(dtype, dtype)
        if name in _ABI_TO_NUMPY:
            return _ABI_TO_NUMPY[name]
    if dtype is None:  # NumPy reads None as float64; here it is a forgotten dtype
        raise DTypeError(f"None is not a dtype; expected one of {', '.join(ABI_DTYPES)}")
    numpy_name = getattr(dtype, "numpy_dtype", None)  # framework dtype objects (compat layers)
    if numpy_name is not None:
        dtype = numpy_name
    try:
        result = np.dtype(dtype)
    except Exception:  # NumPy parses strings as it likes: "i4,," is a SyntaxError, "(2)i4" a TypeError
        raise DTypeError(f"{dtype!r} is not a dtype; expected one of {', '.join(ABI_DTYPES)}") from None
    if result not in _NUMPY_TO_ABI:
        raise DTypeError(f"dtype {result} is not supported by the kernel ABI; expected one of {', '.join(ABI_DTYPES)}")
    return result


def abi_name(dtype: DTypeLike) -> str:
    """The kernel ABI's name for ``dtype`` ("float32", "int64", ...)."""
    return _NUMPY_TO_ABI[to_numpy(dtype)]


def normalize(dtype: DTypeLike) -> str:
    """Canonical dtype name used throughout opforge (the ABI name)."""
    return abi_name(dtype)
