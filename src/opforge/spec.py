"""TensorSpec: what is known about a tensor before its data exists.

A shape is a tuple of ints where -1 marks an unknown dim; an unknown rank is
the one-element shape ``(-2,)``, as in the kernel ABI.  ``None`` in a shape
given by the user means -1.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import dtypes as _dtypes
from .errors import ShapeError

UNKNOWN_DIM = -1
UNKNOWN_RANK = (-2,)


def normalize_shape(shape) -> tuple[int, ...]:
    if shape is None:
        return UNKNOWN_RANK
    try:
        dims = tuple(UNKNOWN_DIM if d is None else int(d) for d in shape)
    except TypeError:
        raise ShapeError(f"a shape must be a sequence of ints (None or -1 for unknown dims), got {shape!r}") from None
    if dims == UNKNOWN_RANK:
        return dims
    for d in dims:
        if d < -1:
            raise ShapeError(f"invalid dim {d} in shape {dims}: dims are >= 0, -1 (unknown), or the shape is [-2]")
    return dims


@dataclass(frozen=True)
class TensorSpec:
    """Shape (with -1 / [-2] for unknowns), dtype name and data layout of a tensor."""

    shape: tuple
    dtype: str = "float32"
    layout: str = "ndarray"

    def __init__(self, shape, dtype="float32", layout="ndarray"):
        object.__setattr__(self, "shape", normalize_shape(shape))
        object.__setattr__(self, "dtype", _dtypes.normalize(dtype))
        object.__setattr__(self, "layout", layout)

    @classmethod
    def of(cls, array) -> "TensorSpec":
        """The exact spec of an array-like (anything with .shape and .dtype)."""
        return cls(tuple(array.shape), array.dtype)

    @property
    def rank(self):
        """Number of dims, or None when unknown."""
        return None if self.shape == UNKNOWN_RANK else len(self.shape)

    @property
    def is_static(self) -> bool:
        return self.rank is not None and all(d >= 0 for d in self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes a tensor of this (static) spec occupies in its layout; nchw16c pads C to 16."""
        import numpy as np

        shape = list(self.shape)
        if self.layout == "nchw16c" and len(shape) >= 2:
            shape[1] = -(-shape[1] // 16) * 16
        count = int(np.prod(shape)) if shape else 1
        return count * np.dtype(self.dtype).itemsize

    def empty(self):
        """An uninitialised buffer for this spec: the array itself for ndarray
        layout, the flat physical buffer for blocked layouts."""
        import numpy as np

        if self.layout == "ndarray":
            return np.empty(self.shape, self.dtype)
        return np.empty(self.nbytes // np.dtype(self.dtype).itemsize, self.dtype)

    def matches(self, shape, dtype=None) -> bool:
        """Whether a concrete shape (and dtype) is an instance of this spec."""
        if dtype is not None and _dtypes.normalize(dtype) != self.dtype:
            return False
        if self.rank is None:
            return True
        shape = tuple(shape)
        return len(shape) == len(self.shape) and all(s == -1 or s == d for s, d in zip(self.shape, shape))

    def __repr__(self):
        dims = "unknown rank" if self.rank is None else \
            "[" + ", ".join("?" if d == -1 else str(d) for d in self.shape) + "]"
        layout = "" if self.layout == "ndarray" else f", {self.layout}"
        return f"TensorSpec({dims}, {self.dtype}{layout})"
