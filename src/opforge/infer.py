"""Inference helpers for the common rules; each returns an infer function.

    op.def_infer(opforge.infer.same_as(0))           # shape, dtype and layout of input 0
    op.def_infer(opforge.infer.broadcast())           # broadcast of all inputs, dtype of the first
    op.def_infer(opforge.infer.reduce(axes_attr="axes", keep_dims_attr="keep_dims"))

Unknown dims (-1) and unknown rank ([-2]) propagate.
"""
from __future__ import annotations

from .errors import ShapeError
from .spec import UNKNOWN_RANK, TensorSpec


def same_as(input_index=0, dtype=None):
    """Output has the shape and dtype of input ``input_index`` (dtype overridable)."""

    def infer(*specs, **attrs):
        spec = specs[input_index]
        return TensorSpec(spec.shape, dtype or spec.dtype, spec.layout)

    return infer


def broadcast_shapes(*shapes):
    """NumPy broadcasting over shapes that may hold -1 dims or be [-2]."""
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


def broadcast(dtype=None):
    """Output shape is the broadcast of all inputs; dtype that of the first input."""

    def infer(*specs, **attrs):
        return TensorSpec(broadcast_shapes(*[s.shape for s in specs]), dtype or specs[0].dtype)

    return infer


def normalize_axes(axes, rank, op_name="op"):
    axes = [axes] if isinstance(axes, int) else list(axes)
    result = []
    for axis in axes:
        if not -rank <= axis < max(rank, 1):
            raise ShapeError(f"op '{op_name}': axis {axis} is out of range for rank {rank}")
        result.append(axis % rank if rank else 0)
    return sorted(set(result))


def reduce_shape(shape, axes, keep_dims, op_name="op"):
    """Shape after reducing ``axes`` (empty = all axes)."""
    if shape == UNKNOWN_RANK:
        return UNKNOWN_RANK
    rank = len(shape)
    axes = normalize_axes(axes, rank, op_name) if len(axes) else list(range(rank))
    if keep_dims:
        return tuple(1 if k in axes else d for k, d in enumerate(shape))
    return tuple(d for k, d in enumerate(shape) if k not in axes)


def reduce(axes_attr="axes", keep_dims_attr="keep_dims"):
    """Reduction of input 0 over the attribute ``axes_attr`` (empty = all)."""

    def infer(x, *rest, **attrs):
        return TensorSpec(reduce_shape(x.shape, attrs[axes_attr], attrs[keep_dims_attr]), x.dtype)

    return infer
