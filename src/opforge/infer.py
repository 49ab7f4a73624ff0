"""Inference helpers for the common rules; each returns an infer function.

    op.def_infer(opforge.infer.same_as(0))           # shape, dtype and layout of input 0
    op.def_infer(opforge.infer.broadcast())           # broadcast of all inputs, dtype of the first
    op.def_infer(opforge.infer.reduce(axes_attr="axes", keep_dims_attr="keep_dims"))

Unknown dims (-1) and unknown rank ([-2]) propagate.
"""
from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable
from typing import Any, TypeGuard

from .dtypes import DTypeLike
from .errors import InferenceError, ShapeError
from .spec import UNKNOWN_RANK, ShapeLike, TensorSpec, normalize_shape


def same_as(input_index: int = 0, dtype: DTypeLike = None) -> Callable[..., TensorSpec]:
    """Output has the shape and dtype of input ``input_index`` (dtype overridable)."""

    def infer(*specs: TensorSpec | None, **attrs: Any) -> TensorSpec:
        spec = specs[input_index] if -len(specs) <= input_index < len(specs) else None
        if spec is None:
            raise InferenceError(f"same_as({input_index}): the op has no input {input_index} here "
                                 f"(got {len(specs)} input spec(s): {list(specs)})")
        return TensorSpec(spec.shape, dtype or spec.dtype, spec.layout)

    return infer


def broadcast_shapes(*given: ShapeLike) -> tuple[int, ...]:
    """NumPy broadcasting over shapes that may hold -1 dims or be [-2] (None is [-2])."""
    shapes = [normalize_shape(s) for s in given]
    if any(s == UNKNOWN_RANK for s in shapes):
        return UNKNOWN_RANK
    rank = max((len(s) for s in shapes), default=0)
    result = []
    for axis in range(rank):
        dims = [s[len(s) - rank + axis] for s in shapes if len(s) - rank + axis >= 0]
        known = {d for d in dims if d not in (1, -1)}
        if len(known) > 1:
            raise ShapeError(f"shapes {[list(s) for s in shapes]} do not broadcast (axis {axis}: {sorted(known)})")
        if known:
            result.append(known.pop())
        elif -1 in dims:
            result.append(-1)
        else:
            result.append(1)
    return tuple(result)


def broadcast(dtype: DTypeLike = None) -> Callable[..., TensorSpec]:
    """Output shape is the broadcast of the inputs given (an absent optional one
    takes no part); dtype that of the first."""

    def infer(*specs: TensorSpec | None, **attrs: Any) -> TensorSpec:
        present = [s for s in specs if s is not None]
        if not present:
            raise InferenceError("broadcast(): the op was given no input")
        return TensorSpec(broadcast_shapes(*[s.shape for s in present]), dtype or present[0].dtype)

    return infer


def _is_int(value: object) -> TypeGuard[int]:  # any Integral but bool (NumPy ints too), used as an int
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def normalize_axes(axes: int | Iterable[int], rank: int, op_name: str = "op") -> list[int]:
    """``axes`` (an int or ints, negative ones from the end) as sorted distinct axes of a rank-``rank`` tensor."""
    if not _is_int(rank) or rank < 0:
        raise ShapeError(f"op '{op_name}': a rank is an int >= 0, got {rank!r}")
    if _is_int(axes):
        axes = [axes]
    elif isinstance(axes, (str, bytes)) or not isinstance(axes, Iterable):
        raise ShapeError(f"op '{op_name}': axes are an int or a sequence of ints, got {axes!r}")
    result = []
    for axis in axes:
        if not _is_int(axis):
            raise ShapeError(f"op '{op_name}': axes are ints, got {axis!r} in {axes!r}")
        if not -rank <= axis < max(rank, 1):
            raise ShapeError(f"op '{op_name}': axis {axis} is out of range for rank {rank}")
        result.append(axis % rank if rank else 0)
    return sorted(set(result))


def reduce_shape(shape: ShapeLike, axes: int | Iterable[int], keep_dims: bool, op_name: str = "op") -> tuple[int, ...]:
    """Shape after reducing ``axes`` (an int, or a sequence: empty = all axes)."""
    dims = normalize_shape(shape)
    if dims == UNKNOWN_RANK:
        return UNKNOWN_RANK
    rank = len(dims)
    reduced = normalize_axes(axes, rank, op_name) or list(range(rank))
    if keep_dims:
        return tuple(1 if k in reduced else d for k, d in enumerate(dims))
    return tuple(d for k, d in enumerate(dims) if k not in reduced)


def reduce(axes_attr: str = "axes", keep_dims_attr: str = "keep_dims") -> Callable[..., TensorSpec]:
    """Reduction of input 0 over the attribute ``axes_attr`` (empty = all)."""

    def infer(x: TensorSpec, *rest: TensorSpec | None, **attrs: Any) -> TensorSpec:
        missing = [name for name in (axes_attr, keep_dims_attr) if name not in attrs]
        if missing:
            raise InferenceError(f"reduce(): the op has no attribute {' or '.join(map(repr, missing))} "
                                 f"(attributes: {', '.join(attrs) or 'none'})")
        return TensorSpec(reduce_shape(x.shape, attrs[axes_attr], attrs[keep_dims_attr]), x.dtype)

    return infer
