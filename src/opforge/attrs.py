"""Typed operator attributes.

An attribute has a name, a type and optionally a default.  Values are
normalised to plain Python (bool, int, float, str, tuples of numbers, tuples
of tuples) so that they hash, compare, and cross into C++ unchanged.
"""
from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias, cast

import numpy as np

from .dtypes import ABI_DTYPES, normalize
from .errors import AttrError, DTypeError

REQUIRED = object()  # default of an attribute that must be given

#: An attribute value after ``check_attr``: plain Python, hashable, as it crosses into C++.
AttrValue: TypeAlias = "bool | int | float | str | tuple[AttrValue, ...]"

ATTR_TYPES = ("any", "bool", "int", "float", "str", "int[]", "float[]", "int[][]", "float[][]", "Shape", "DType")


@dataclass(frozen=True)
class AttrDef:
    """An attribute of a schema: its name, type (one of ``ATTR_TYPES``) and default."""

    name: str
    type: str = "any"
    default: object = REQUIRED
    positional: bool = False  # may follow the tensor inputs positionally (MindSpore's value-less attrs)

    def __post_init__(self) -> None:
        if self.type not in ATTR_TYPES:
            raise AttrError(f"attribute '{self.name}': unknown type {self.type!r}; expected one of {', '.join(ATTR_TYPES)}")

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


def _plain(value: object) -> object:
    """NumPy scalars and arrays, lists and tuples -> plain, hashable Python values."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, str):
        return value
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        return np.dtype(value).name
    return value


def _is_list_of(value: object, kind: type | tuple[type, ...], depth: int) -> bool:
    if not isinstance(value, tuple):
        return False
    if depth == 1:
        return all(isinstance(v, kind) and not isinstance(v, bool) for v in value)
    return all(_is_list_of(v, kind, depth - 1) for v in value)


INT64_MIN, INT64_MAX = -2**63, 2**63 - 1


def _out_of_range(t: str, value: object) -> str | None:
    """Why a well-typed value cannot cross into C++ (ints are int64_t, floats double), or None."""
    if isinstance(value, tuple):
        return next(filter(None, (_out_of_range(t, v) for v in value)), None)
    if type(value) is not int:  # _plain made every integer a plain int (and left bools alone)
        return None
    if t in ("float", "float[]", "float[][]"):
        try:
            float(value)
        except OverflowError:
            return f"{_show(value)} is too large for a double"
    elif not INT64_MIN <= value <= INT64_MAX:
        return f"{_show(value)} is outside int64 [{INT64_MIN}, {INT64_MAX}]"
    return None


def _show(value: object) -> str:
    """repr for a message: Python refuses to print ints of more than 4300 digits, and long values are cut."""
    if type(value) is int and value.bit_length() > 128:
        return f"{'-' if value < 0 else ''}an int of {value.bit_length()} bits"
    try:
        text = repr(value)
    except ValueError:
        return f"a {type(value).__name__} holding huge ints"
    return text if len(text) <= 200 else text[:200] + "..."


def check_attr(op_name: str, attr: AttrDef, value: object) -> AttrValue:
    """Normalise ``value`` and check it against the attribute's declared type and range."""
    t = attr.type
    try:
        value = _plain(value)
    except (OverflowError, ValueError, RecursionError):  # float(Fraction(10**400)), a list that holds itself
        raise AttrError(f"op '{op_name}': attribute '{attr.name}' expects {t}, got {_show(value)}") from None
    checks: dict[str, Callable[[Any], bool]] = {
        "any": lambda v: isinstance(v, (bool, int, float, str, tuple)),
        "bool": lambda v: isinstance(v, bool),
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "str": lambda v: isinstance(v, str),
        "int[]": lambda v: _is_list_of(v, int, 1),
        "float[]": lambda v: _is_list_of(v, (int, float), 1),
        "int[][]": lambda v: _is_list_of(v, int, 2),
        "float[][]": lambda v: _is_list_of(v, (int, float), 2),
        "Shape": lambda v: _is_list_of(v, int, 1),
        "DType": lambda v: isinstance(v, str),
    }
    if not checks[t](value):
        raise AttrError(f"op '{op_name}': attribute '{attr.name}' expects {t}, "
                        f"got {_show(value)} ({type(value).__name__})")
    problem = _out_of_range(t, value)
    if problem:
        raise AttrError(f"op '{op_name}': attribute '{attr.name}' ({t}): {problem}")
    checked = cast(AttrValue, value)  # the check above held
    if t == "float" and isinstance(checked, int):
        checked = float(checked)
    if t == "float[]":
        checked = tuple(float(v) for v in cast("tuple[float, ...]", checked))
    if t == "float[][]":
        checked = tuple(tuple(float(v) for v in row) for row in cast("tuple[tuple[float, ...], ...]", checked))
    if t == "DType":
        try:
            checked = normalize(checked)
        except DTypeError:
            raise AttrError(f"op '{op_name}': attribute '{attr.name}' expects a dtype name, got {_show(checked)}; "
                            f"supported: {', '.join(ABI_DTYPES)}") from None
    return checked


def _typed(value: object) -> object:
    if isinstance(value, tuple):
        return tuple(_typed(v) for v in value)
    return (type(value).__name__, value)


def attr_key(attrs: Mapping[str, object]) -> tuple[tuple[str, object], ...]:
    """A hashable key of attribute values that tells 1, 1.0 and True apart
    (they compare equal in Python, but a kernel reads them differently)."""
    return tuple((name, _typed(value)) for name, value in sorted(attrs.items()))
