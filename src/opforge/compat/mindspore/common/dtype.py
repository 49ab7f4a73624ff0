"""MindSpore-style dtype objects (``mstype.float32``), each naming a NumPy dtype."""
from __future__ import annotations


class Type:
    def __init__(self, name: str, numpy_dtype: str) -> None:
        self.name = name
        self.numpy_dtype = numpy_dtype

    def __repr__(self) -> str:
        return self.name[0].upper() + self.name[1:]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Type) and other.numpy_dtype == self.numpy_dtype

    def __hash__(self) -> int:
        return hash(self.numpy_dtype)


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
