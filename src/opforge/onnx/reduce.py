"""Converters of ONNX's softmax and reductions: Softmax, LogSoftmax,
ReduceSum, ReduceMean, ReduceSumSquare, ReduceL1, ReduceL2, ReduceLogSum,
ReduceMax, ReduceMin, ReduceProd, ReduceLogSumExp, ArgMax, ArgMin, Hardmax,
LpNormalization and MeanVarianceNormalization.

Softmax before opset 13 flattens its input at ``axis`` (default 1) into a
matrix and normalises each row, so it runs over every dim from ``axis`` on;
from opset 13 it runs along ``axis`` alone (default -1).  Reductions take
their axes from an attribute, and from an input (which must be known when
the model loads) from opset 13 (ReduceSum) or 18 (the others); ``keepdims``
defaults to 1, and ``noop_with_empty_axes=1`` with no axes is the identity.

opforge has no max-, min- or product-reduction op: ReduceMax, ReduceMin
and ReduceProd fold halves of the reduced dims together with maximum,
minimum or mul (log2(n) steps per axis),
so those dims must be known when the model loads; LogSoftmax and
ReduceLogSumExp subtract that maximum before exponentiating; ArgMax / ArgMin
take the smallest (or, with ``select_last_index``, largest) index where the
extreme occurs.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from ..spec import UNKNOWN_RANK
from .elementwise import FLOATS, NUMERIC, dims_of, dtype_of, rounded_back, widened
from .registry import converter
from .shape import ints, rank_of

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from .registry import NodeContext

# Tensors here are traced Values, or np.ndarrays known when the model loads: typed Any.
ops = opforge.ops


# -- Softmax ------------------------------------------------------------------------------

def flattened_softmax(node: NodeContext, x: Any) -> Any:
    """Softmax over the dims from ``axis`` on (opsets 1-12): a reshape to [outer, inner], softmax along
    the rows, and a reshape back, unless axis is already the last dim."""
    dims = dims_of(x)
    if dims == UNKNOWN_RANK:
        raise node.unknown("the rank of input 'input' must be known when the model is loaded (softmax before "
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
        raise node.unknown(f"softmax before opset 13 over dims {list(inner)} of input 'input' (from axis {axis}) "
                         "needs them known when the model is loaded")
    size = int(np.prod(inner))
    if size == 0:
        return ops.softmax(x, axis=axis)  # no elements: nothing to normalise
    if list(dims[:axis]).count(-1) > 1:  # no reshape back to two unknown dims: reduce over the dims instead
        axes = list(range(axis, rank))
        e = ops.exp(ops.sub(x, extreme(node, x, axes, True, True)))
        return ops.div(e, ops.reduce_sum(e, axes=axes, keep_dims=True))
    rows = ops.reshape(x, shape=[-1 if axis else 1, size])
    return ops.reshape(ops.softmax(rows, axis=1), shape=list(dims))


@converter("Softmax", since=1)
def softmax_v1(node: NodeContext, x: Any) -> Any:
    return widened(node, lambda v: flattened_softmax(node, v), [x], FLOATS)


@converter("Softmax", since=13)
def softmax_v13(node: NodeContext, x: Any) -> Any:
    return widened(node, lambda v: ops.softmax(v, axis=node.attr("axis", -1)), [x], FLOATS)


# -- reductions ---------------------------------------------------------------------------

def reduction_axes(node: NodeContext, x: Any, axes: object, axes_from_input: bool) -> list[int] | None:
    """The axes to reduce (a list, empty = all), or None when the node is the identity."""
    if axes_from_input:
        axes = [] if axes is None else ints(node, axes, "input 'axes'")
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


def reducer(op_type: str, reduce: Callable[[NodeContext, Any, list[int], bool], Any], *, input_since: int) -> None:
    """Register ``reduce(node, x, axes, keep_dims)`` for op_type: axes from the attribute before opset
    ``input_since``, from the second input after (one converter reads the node's opset)."""
    def convert(node: NodeContext, x: Any, axes: Any = None) -> Any:
        chosen = reduction_axes(node, x, axes, node.opset >= input_since)
        if chosen is None:
            return x
        return reduce(node, x, chosen, bool(node.attr("keepdims", 1)))

    converter(op_type, since=1)(convert)
    convert.__name__ = op_type.lower()


def in_float(fn: Callable[[Any, list[int], bool], Any]) -> Callable[[NodeContext, Any, list[int], bool], Any]:
    """``fn`` run on a floating-point x: other dtypes go through float64 and come back (integers
    truncate toward zero)."""
    def run(node: NodeContext, x: Any, axes: list[int], keep: bool) -> Any:
        dtype = dtype_of(x)
        if np.dtype(dtype).kind in "iub":
            return ops.cast(fn(ops.cast(x, dtype="float64"), axes, keep), dtype=dtype)
        if dtype not in FLOATS:
            return rounded_back(fn(ops.cast(x, dtype="float32"), axes, keep), dtype)
        return fn(x, axes, keep)

    return run


def sum_square(x: Any, axes: list[int], keep: bool) -> Any:
    return ops.reduce_sum(ops.mul(x, x), axes=axes, keep_dims=keep)


reducer("ReduceSum", lambda node, x, axes, keep: ops.reduce_sum(x, axes=axes, keep_dims=keep), input_since=13)
reducer("ReduceMean", in_float(lambda x, axes, keep: ops.mean(x, axes=axes, keep_dims=keep)), input_since=18)
reducer("ReduceSumSquare", lambda node, x, axes, keep: sum_square(x, axes, keep), input_since=18)
reducer("ReduceL1", in_float(lambda x, axes, keep: ops.reduce_sum(ops.abs(x), axes=axes, keep_dims=keep)),
        input_since=18)
reducer("ReduceL2", in_float(lambda x, axes, keep: ops.sqrt(sum_square(x, axes, keep))), input_since=18)
reducer("ReduceLogSum", in_float(lambda x, axes, keep: ops.log(ops.reduce_sum(x, axes=axes, keep_dims=keep))),
        input_since=18)


# -- ReduceMax, ReduceMin, ReduceLogSumExp, LogSoftmax -------------------------------------

def normalized_axes(node: NodeContext, x: Any, axes: Sequence[int]) -> tuple[tuple[int, ...], list[int]]:
    rank = rank_of(node, x)
    return dims_of(x), sorted({a % rank for a in axes}) if axes else list(range(rank))


def fold_axes(node: NodeContext, x: Any, axes: Sequence[int], keep: bool, fold: Callable[[Any, Any], Any],
              empty: float, idempotent: bool) -> Any:
    """x reduced over ``axes`` by folding halves together with the binary op ``fold``: log2(n) steps per
    axis.  An idempotent fold (maximum, minimum) takes the first and the last ceil(n / 2) entries, which
    overlap by one when n is odd; another (mul) pairs the first 2 * floor(n / 2) and carries the odd one
    over.  Over no elements, ``empty``."""
    dims, axes = normalized_axes(node, x, axes)
    unknown = [a for a in axes if dims[a] == -1]
    if unknown:
        raise node.unknown(f"{node.op_type} over axes {unknown} of input 'data' of shape {list(dims)} needs those "
                         "dims known when the model is loaded")
    if any(dims[a] == 0 for a in axes):
        kept = [1 if k in axes else d for k, d in enumerate(dims)]
        if -1 in kept:
            raise node.error(f"{node.op_type} of no elements needs the shape of input 'data' known; it is "
                             f"{list(dims)}")
        result = np.full(kept, empty, dtype_of(x))
    else:
        result = x
        for axis in axes:
            n = dims[axis]
            while n > 1:
                def part(start: int, stop: int) -> Any:
                    return ops.slice(result, starts=[start], ends=[stop], axes=[axis])

                if idempotent or n % 2 == 0:
                    half = (n + 1) // 2
                    result, n = fold(part(0, half), part(n - half, n)), half
                else:
                    half = n // 2
                    result, n = ops.concat(fold(part(0, half), part(half, 2 * half)), part(n - 1, n), axis=axis), half + 1
    if not keep and axes:
        result = ops.squeeze(result, axes=axes)
    return result


def extreme(node: NodeContext, x: Any, axes: Sequence[int], keep: bool, largest: bool) -> Any:
    """The maximum (``largest``) or minimum of x over ``axes``; over no elements -inf / +inf (the integer
    limits for integers)."""
    dtype = np.dtype(dtype_of(x))
    if dtype.kind == "f":
        empty = -np.inf if largest else np.inf
    else:
        info = np.iinfo(dtype)
        empty = info.min if largest else info.max
    return fold_axes(node, x, axes, keep, ops.maximum if largest else ops.minimum, empty, True)


def extreme_of_any_dtype(node: NodeContext, x: Any, axes: Sequence[int], keep: bool, largest: bool) -> Any:
    if dtype_of(x) == "bool":  # any / all: in int32, where no elements give false / true
        wide = ops.cast(x, dtype="int32")
        result = fold_axes(node, wide, axes, keep, ops.maximum if largest else ops.minimum, int(not largest), True)
        return ops.cast(result, dtype="bool")
    return widened(node, lambda v: extreme(node, v, axes, keep, largest), [x], NUMERIC)


def reduce_max(node: NodeContext, x: Any, axes: list[int], keep: bool) -> Any:
    return extreme_of_any_dtype(node, x, axes, keep, True)


def reduce_min(node: NodeContext, x: Any, axes: list[int], keep: bool) -> Any:
    return extreme_of_any_dtype(node, x, axes, keep, False)


def log_sum_exp(node: NodeContext, x: Any, axes: Sequence[int], keep: bool) -> Any:
    """log(sum(exp(x))) over axes, as top + log(sum(exp(x - top))), top the maximum: no overflow."""
    top = extreme(node, x, axes, True, True)
    total = ops.reduce_sum(ops.exp(ops.sub(x, top)), axes=axes, keep_dims=True)
    result = ops.add(ops.log(total), top)
    _, axes = normalized_axes(node, x, axes)
    return result if keep or not axes else ops.squeeze(result, axes=axes)


def reduce_prod(node: NodeContext, x: Any, axes: list[int], keep: bool) -> Any:
    return fold_axes(node, x, axes, keep, ops.mul, 1, False)


def reduce_log_sum_exp(node: NodeContext, x: Any, axes: list[int], keep: bool) -> Any:
    return widened(node, lambda v: log_sum_exp(node, v, axes, keep), [x], FLOATS)


reducer("ReduceMax", reduce_max, input_since=18)
reducer("ReduceMin", reduce_min, input_since=18)
reducer("ReduceProd", reduce_prod, input_since=18)
reducer("ReduceLogSumExp", reduce_log_sum_exp, input_since=18)


def log_softmax(node: NodeContext, x: Any, axes: Sequence[int]) -> Any:
    shifted = ops.sub(x, extreme(node, x, axes, True, True))
    return ops.sub(shifted, ops.log(ops.reduce_sum(ops.exp(shifted), axes=axes, keep_dims=True)))


@converter("LogSoftmax", since=1)
def log_softmax_v1(node: NodeContext, x: Any) -> Any:
    """Before opset 13, over every dim from ``axis`` (default 1) on: reduce over all of them at once."""
    ndim = rank_of(node, x, "input 'input'")
    rank = max(ndim, 1)
    axis = node.attr("axis", 1)
    if not -rank <= axis < rank:
        raise node.error(f"attribute 'axis' {axis} is out of range for input 'input' of rank {ndim}")
    axes = list(range(axis % rank, ndim))
    return widened(node, lambda v: log_softmax(node, v, axes) if axes else ops.sub(v, v), [x], FLOATS)


@converter("LogSoftmax", since=13)
def log_softmax_v13(node: NodeContext, x: Any) -> Any:
    dims = dims_of(x)
    axis = node.attr("axis", -1)
    if dims != UNKNOWN_RANK and not -max(len(dims), 1) <= axis < max(len(dims), 1):
        raise node.error(f"attribute 'axis' {axis} is out of range for input 'input' of rank {len(dims)}")
    return widened(node, lambda v: log_softmax(node, v, [axis]) if dims else ops.sub(v, v), [x], FLOATS)


def one_axis(node: NodeContext, x: Any, default_axis: int, what: str) -> tuple[tuple[int, ...], int]:
    """(x's dims, the node's ``axis`` made non-negative); x must have a known rank >= 1."""
    dims = dims_of(x)
    if dims == UNKNOWN_RANK or not dims:
        raise node.unknown(f"{what} must have a known rank >= 1 when the model is loaded")
    axis = node.attr("axis", default_axis)
    if not -len(dims) <= axis < len(dims):
        raise node.error(f"attribute 'axis' {axis} is out of range for {what} of rank {len(dims)}")
    return dims, axis % len(dims)


def arg_extreme(node: NodeContext, x: Any, largest: bool) -> Any:
    dims, axis = one_axis(node, x, 0, "input 'data'")
    n = dims[axis]
    if n == -1:
        raise node.unknown(f"{node.op_type} along axis {axis} of input 'data' of shape {list(dims)} needs that dim "
                         "known when the model is loaded")
    if n == 0:
        raise node.error(f"{node.op_type} along axis {axis}, of length 0: there is no index to give")
    last = bool(node.attr("select_last_index", 0))
    index = np.arange(n, dtype=np.int64).reshape([n] + [1] * (len(dims) - axis - 1))
    hit = ops.equal(x, extreme(node, x, [axis], True, largest))
    # the first hit: the least index among hits (others count as n); the last: the greatest (others -1)
    candidates = ops.where(hit, index, np.asarray(-1 if last else n, np.int64))
    return extreme(node, candidates, [axis], bool(node.attr("keepdims", 1)), last)


@converter("ArgMax", since=1)
def arg_max(node: NodeContext, x: Any) -> Any:
    return widened(node, lambda v: arg_extreme(node, v, True), [x], NUMERIC, cast_back=False)


@converter("ArgMin", since=1)
def arg_min(node: NodeContext, x: Any) -> Any:
    return widened(node, lambda v: arg_extreme(node, v, False), [x], NUMERIC, cast_back=False)


@converter("MeanVarianceNormalization", since=9)
def mean_variance_normalization(node: NodeContext, x: Any) -> Any:
    """(x - mean) / (std + 1e-9) over ``axes`` (default [0, 2, 3]), std from the centred values."""
    axes = list(node.attr("axes", [0, 2, 3]))

    def normalize(v: Any) -> Any:
        centred = ops.sub(v, ops.mean(v, axes=axes, keep_dims=True))
        std = ops.sqrt(ops.mean(ops.mul(centred, centred), axes=axes, keep_dims=True))
        return ops.div(centred, ops.add(std, np.asarray(1e-9, dtype_of(v))))

    return widened(node, normalize, [x], FLOATS)


def hardmax(node: NodeContext, x: Any, axes: list[int]) -> Any:
    """1 at the first maximum over ``axes`` (contiguous: [axis] or axis to the last dim, in the flattened
    order), 0 elsewhere."""
    dims = dims_of(x)
    inner = [dims[a] for a in axes]
    if -1 in inner:
        raise node.unknown(f"Hardmax over axes {axes} of input 'input' of shape {list(dims)} needs those dims "
                         "known when the model is loaded")
    count = int(np.prod(inner))
    if count == 0:
        return ops.sub(x, x)  # no elements
    index = np.arange(count, dtype=np.int64).reshape(inner + [1] * (len(dims) - axes[-1] - 1))
    hit = ops.equal(x, extreme(node, x, axes, True, True))
    first = extreme(node, ops.where(hit, index, np.asarray(count, np.int64)), axes, True, False)
    return ops.cast(ops.equal(index, first), dtype=dtype_of(x))


def hardmax_axes(node: NodeContext, x: Any, default_axis: int, flatten: bool) -> list[int]:
    dims, axis = one_axis(node, x, default_axis, "input 'input'")
    return list(range(axis, len(dims))) if flatten else [axis]


@converter("Hardmax", since=1)
def hardmax_v1(node: NodeContext, x: Any) -> Any:
    """Before opset 13, over every dim from ``axis`` (default 1) on, as if flattened there."""
    axes = hardmax_axes(node, x, 1, True)
    return widened(node, lambda v: hardmax(node, v, axes), [x], NUMERIC)


@converter("Hardmax", since=13)
def hardmax_v13(node: NodeContext, x: Any) -> Any:
    axes = hardmax_axes(node, x, -1, False)
    return widened(node, lambda v: hardmax(node, v, axes), [x], NUMERIC)


@converter("LpNormalization", since=1)
def lp_normalization(node: NodeContext, x: Any) -> Any:

    """x divided by its L1 (p=1) or L2 (p=2, the default) norm along ``axis`` (default -1); where the norm
    is 0, so is x, and the result is 0."""
    p, axis = node.attr("p", 2), node.attr("axis", -1)
    if p not in (1, 2):
        raise node.error(f"attribute 'p' is {p}; supported: 1, 2")

    def normalize(v: Any) -> Any:
        if p == 1:
            norm = ops.reduce_sum(ops.abs(v), axes=[axis], keep_dims=True)
        else:
            norm = ops.sqrt(ops.reduce_sum(ops.mul(v, v), axes=[axis], keep_dims=True))
        zero = np.zeros((), dtype_of(v))
        return ops.div(v, ops.where(ops.equal(norm, zero), np.ones((), dtype_of(v)), norm))  # zero norm: 0

    return widened(node, normalize, [x], FLOATS)
