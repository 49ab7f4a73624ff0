"""TensorSpec: what is known about a tensor before its data exists.

A shape is a tuple of ints where -1 marks an unknown dim; an unknown rank is
the one-element shape ``(-2,)``, as in the kernel ABI.  ``None`` in a shape
given by the user means -1.  Anything else that is not an int below 2**63
(2.7, NaN, True) is a ShapeError, never silently converted.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, SupportsIndex, TypeAlias

import numpy as np
import numpy.typing as npt

from . import dtypes as _dtypes
from .errors import ShapeError

UNKNOWN_DIM = -1
UNKNOWN_RANK = (-2,)
#: Data layouts a tensor may have: plain row-major, or channels blocked by 16 (see builtins/reorder.py).
LAYOUTS = ("ndarray", "nchw16c")
ALLOWED_DIMS = "dims are ints >= 0 and below 2**63, -1 or None for an unknown dim, or the shape is [-2] (unknown rank)"

#: A shape as a user gives it: ints (None or -1 for an unknown dim), ``[-2]`` or None for an unknown rank.
ShapeLike: TypeAlias = "Iterable[SupportsIndex | None] | None"


def _dim(d: object, shape: Sequence[object]) -> int:
    if type(d) is int and 0 <= d < 2**63:  # the common case, first
        return d
    if d is None:
        return UNKNOWN_DIM
    if isinstance(d, (bool, np.bool_)) or not isinstance(d, numbers.Integral):
        # A float dim is a bug upstream (2.7 must not quietly become 2).
        raise ShapeError(f"dim {d} ({type(d).__name__}) in shape {list(shape)} is not an int: {ALLOWED_DIMS}")
    d = int(d)
    if not -2 <= d < 2**63:
        raise ShapeError(f"dim {d} in shape {list(shape)} is out of range: {ALLOWED_DIMS}")
    return d


def normalize_shape(shape: ShapeLike) -> tuple[int, ...]:
    if shape is None:
        return UNKNOWN_RANK
    try:
        items = None if isinstance(shape, (str, bytes)) else tuple(shape)
    except TypeError:
        items = None
    if items is None:
        raise ShapeError(f"a shape is a sequence of dims, got {shape!r} ({type(shape).__name__}): {ALLOWED_DIMS}")
    dims = tuple(_dim(d, items) for d in items)
    if dims != UNKNOWN_RANK and -2 in dims:
        raise ShapeError(f"invalid dim -2 in shape {list(dims)}: {ALLOWED_DIMS}")
    return dims


@dataclass(frozen=True)
class TensorSpec:
    """Shape (with -1 / [-2] for unknowns), dtype name and data layout of a tensor."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    layout: str = "ndarray"

    def __init__(self, shape: ShapeLike, dtype: _dtypes.DTypeLike = "float32", layout: str = "ndarray") -> None:
        object.__setattr__(self, "shape", normalize_shape(shape))
        object.__setattr__(self, "dtype", _dtypes.normalize(dtype))
        if not isinstance(layout, str) or layout not in LAYOUTS:
            raise ShapeError(f"unknown layout {layout!r}; a TensorSpec's layout is one of {', '.join(LAYOUTS)}")
        object.__setattr__(self, "layout", layout)

    @classmethod
    def of(cls, array: object) -> TensorSpec:
        """The exact spec of an array-like (anything with .shape and .dtype)."""
        shape, dtype = getattr(array, "shape", None), getattr(array, "dtype", None)
        if shape is None or dtype is None:
            raise ShapeError(f"TensorSpec.of takes an array (anything with .shape and .dtype), "
                             f"got {type(array).__name__}")
        return cls(shape, dtype)

    @property
    def rank(self) -> int | None:
        """Number of dims, or None when unknown."""
        return None if self.shape == UNKNOWN_RANK else len(self.shape)

    @property
    def is_static(self) -> bool:
        return self.rank is not None and all(d >= 0 for d in self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes a tensor of this (static) spec occupies in its layout; nchw16c pads C to 16."""
        shape = list(self.shape)
        if self.layout == "nchw16c" and len(shape) >= 2:
            shape[1] = -(-shape[1] // 16) * 16
        count = math.prod(shape)  # exact: np.prod would wrap around for huge shapes
        return int(count) * np.dtype(self.dtype).itemsize

    def empty(self) -> npt.NDArray[Any]:
        """An uninitialised buffer for this spec: the array itself for ndarray
        layout, the flat physical buffer for blocked layouts."""
        if self.layout == "ndarray":
            return np.empty(self.shape, self.dtype)
        return np.empty(self.nbytes // np.dtype(self.dtype).itemsize, self.dtype)

    def matches(self, shape: Iterable[int], dtype: _dtypes.DTypeLike = None) -> bool:
        """Whether a concrete shape (and dtype) is an instance of this spec."""
        if dtype is not None and _dtypes.normalize(dtype) != self.dtype:
            return False
        if self.rank is None:
            return True
        shape = tuple(shape)
        return len(shape) == len(self.shape) and all(s == -1 or s == d for s, d in zip(self.shape, shape))

    def __repr__(self) -> str:
        dims = "unknown rank" if self.rank is None else \
            "[" + ", ".join("?" if d == -1 else str(d) for d in self.shape) + "]"
        layout = "" if self.layout == "ndarray" else f", {self.layout}"
        return f"TensorSpec({dims}, {self.dtype}{layout})"
