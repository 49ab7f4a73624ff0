"""Converters of ONNX's softmax and reductions: Softmax, ReduceSum,
ReduceMean, ReduceSumSquare, ReduceL1, ReduceL2, ReduceLogSum.

Softmax before opset 13 flattens its input at ``axis`` (default 1) into a
matrix and normalises each row, so it runs over every dim from ``axis`` on;
from opset 13 it runs along ``axis`` alone (default -1).  Reductions take
their axes from an attribute, and from an input (which must be known when
the model loads) from opset 13 (ReduceSum) or 18 (the others); ``keepdims``
defaults to 1, and ``noop_with_empty_axes=1`` with no axes is the identity.
"""
from __future__ import annotations

import numpy as np

import opforge
from ..spec import UNKNOWN_RANK
from .elementwise import FLOATS, dims_of, dtype_of, widened
from .registry import converter

ops = opforge.ops


# -- Softmax ------------------------------------------------------------------------------

def flattened_softmax(node, x):
    """Softmax over the dims from ``axis`` on (opsets 1-12): a reshape to [outer, inner], softmax along
    the rows, and a reshape back, unless axis is already the last dim."""
    dims = dims_of(x)
    if dims == UNKNOWN_RANK:
        raise node.error("the rank of input 'input' must be known when the model is loaded (softmax before "
                         "opset 13 flattens at 'axis')")
    rank = len(dims)
    axis = node.attr("axis", 1)
    if not -max(rank, 1) <= axis < max(rank, 1):
        raise node.error(f"attribute 'axis' {axis} is out of range for input 'input' of rank {rank}")
    axis %= max(rank, 1)
    if rank == 0 or axis == rank - 1:
        return ops.softmax(x, axis=-1)
    inner = dims[axis:]
    if -1 in inner:
        raise node.error(f"softmax before opset 13 over dims {list(inner)} of input 'input' (from axis {axis}) "
                         "needs them known when the model is loaded")
    size = int(np.prod(inner))
    if size == 0:
        return ops.softmax(x, axis=axis)  # no elements: nothing to normalise
    if list(dims[:axis]).count(-1) > 1:
        raise node.error(f"input 'input' of shape {list(dims)} has more than one unknown dim before axis {axis}; "
                         "opforge's reshape back takes one")
    rows = ops.reshape(x, shape=[-1 if axis else 1, size])
    return ops.reshape(ops.softmax(rows, axis=1), shape=list(dims))


@converter("Softmax", since=1)
def softmax_v1(node, x):
    return widened(node, lambda v: flattened_softmax(node, v), [x], FLOATS)


@converter("Softmax", since=13)
def softmax_v13(node, x):
    return widened(node, lambda v: ops.softmax(v, axis=node.attr("axis", -1)), [x], FLOATS)


# -- reductions ---------------------------------------------------------------------------

def reduction_axes(node, x, axes, axes_from_input):
    """The axes to reduce (a list, empty = all), or None when the node is the identity."""
    if axes_from_input:
        axes = [] if axes is None else [int(a) for a in np.asarray(node.constant(axes, "input 'axes'")).reshape(-1)]
    else:
        axes = list(node.attr("axes", []))
    if not axes and node.attr("noop_with_empty_axes", 0):
        return None
    dims = dims_of(x)
    if dims != UNKNOWN_RANK:
        for axis in axes:
            if not -len(dims) <= axis < max(len(dims), 1) or (not dims and axis):
                raise node.error(f"axis {axis} is out of range for input 'data' of rank {len(dims)}")
    return axes


def reducer(op_type, reduce, *, input_since):
    """Register ``reduce(x, axes, keep_dims)`` for op_type: axes from the attribute before opset
    ``input_since``, from the second input after."""
    def convert(node, x, axes=None):
        chosen = reduction_axes(node, x, axes, node.opset >= input_since)
        if chosen is None:
            return x
        return reduce(x, chosen, bool(node.attr("keepdims", 1)))

    converter(op_type, since=1)(convert)
    converter(op_type, since=input_since)(convert)
    convert.__name__ = op_type.lower()


def in_float(fn):
    """``fn`` run on a floating-point x: other dtypes go through float64 and come back (integers
    truncate toward zero)."""
    def run(x, axes, keep):
        dtype = dtype_of(x)
        if np.dtype(dtype).kind in "iub":
            return ops.cast(fn(ops.cast(x, dtype="float64"), axes, keep), dtype=dtype)
        if dtype not in FLOATS:
            return ops.cast(fn(ops.cast(x, dtype="float32"), axes, keep), dtype=dtype)
        return fn(x, axes, keep)

    return run


def reduce_sum(x, axes, keep):
    return ops.reduce_sum(x, axes=axes, keep_dims=keep)


def sum_square(x, axes, keep):
    return ops.reduce_sum(ops.mul(x, x), axes=axes, keep_dims=keep)


reducer("ReduceSum", reduce_sum, input_since=13)
reducer("ReduceMean", in_float(lambda x, axes, keep: ops.mean(x, axes=axes, keep_dims=keep)), input_since=18)
reducer("ReduceSumSquare", sum_square, input_since=18)
reducer("ReduceL1", in_float(lambda x, axes, keep: ops.reduce_sum(ops.abs(x), axes=axes, keep_dims=keep)),
        input_since=18)
reducer("ReduceL2", in_float(lambda x, axes, keep: ops.sqrt(sum_square(x, axes, keep))), input_since=18)
reducer("ReduceLogSum", in_float(lambda x, axes, keep: ops.log(reduce_sum(x, axes, keep))), input_since=18)
