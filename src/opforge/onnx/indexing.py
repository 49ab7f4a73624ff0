"""Converters of ONNX's element indexing and layout ops: GatherElements,
ScatterElements (and Scatter, its older name), ScatterND, GatherND, Einsum,
DepthToSpace, SpaceToDepth, OneHot.

GatherElements, ScatterElements, ScatterND and GatherND map onto built-ins
of their own (their kernels check every index); Einsum, DepthToSpace,
SpaceToDepth and OneHot compose existing ops, from an equation, a block size
or a depth known when the model loads.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from ..spec import UNKNOWN_RANK
from .elementwise import NUMERIC, dims_of, dtype_of, widened
from .registry import converter
from .shape import rank_of, reshaped

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from .registry import NodeContext

# Tensors here are traced Values, or np.ndarrays known when the model loads: typed Any.
ops = opforge.ops


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def check_range(node: NodeContext, indices: Any, sizes: Sequence[int], what: str | Callable[[int], str]) -> None:
    """Indices known at load time, checked against the sizes they index (each column of the last axis
    against its own size, or all against one), so an index out of range is a ModelError now rather
    than a KernelError at run time."""
    if not isinstance(indices, np.ndarray) or indices.dtype.kind not in "iu" or not indices.size:
        return
    columns = indices.reshape(-1, len(sizes)) if len(sizes) > 1 else indices.reshape(-1, 1)
    for j, size in enumerate(sizes):
        if size < 0:
            continue
        bad = columns[:, j][(columns[:, j] < -size) | (columns[:, j] >= size)]
        if bad.size:
            raise node.error(f"input 'indices' holds {bad[0]}, out of range for {what(j) if callable(what) else what}"
                             f" of size {size} (valid: {-size}..{size - 1})")


def axis_size(data: Any, axis: int) -> int:
    dims = dims_of(data)
    return -1 if dims == UNKNOWN_RANK or not -len(dims) <= axis < len(dims) else int(dims[axis])


# -- GatherElements, ScatterElements, Scatter ----------------------------------------------

@converter("GatherElements", since=11)
def gather_elements(node: NodeContext, data: Any, indices: Any) -> Any:
    axis = node.attr("axis", 0)
    check_range(node, indices, [axis_size(data, axis)], f"axis {axis}")
    return ops.gather_elements(data, indices, axis=axis)


@converter("ScatterElements", since=11)
def scatter_elements(node: NodeContext, data: Any, indices: Any, updates: Any) -> Any:
    check_range(node, indices, [axis_size(data, node.attr("axis", 0))], f"axis {node.attr('axis', 0)}")
    # reduction: add and mul from opset 16, max and min from 18; the op's check names a wrong one
    return ops.scatter_elements(data, indices, updates, axis=node.attr("axis", 0),
                                reduction=text(node.attr("reduction", "none")))


converter("Scatter", since=9)(scatter_elements)  # ScatterElements before opset 11 (no reduction)


# -- GatherND, ScatterND -------------------------------------------------------------------

def check_tuples(node: NodeContext, data: Any, indices: Any, batch_dims: int) -> None:
    if isinstance(indices, np.ndarray) and indices.ndim > batch_dims:
        sizes = [axis_size(data, batch_dims + j) for j in range(indices.shape[-1])]
        if sizes:
            check_range(node, indices, sizes, lambda j: f"dim {batch_dims + j} of input 'data'")


@converter("GatherND", since=11)
def gather_nd(node: NodeContext, data: Any, indices: Any) -> Any:
    batch_dims = node.attr("batch_dims", 0)  # from opset 12
    check_tuples(node, data, indices, batch_dims)
    return ops.gather_nd(data, indices, batch_dims=batch_dims)


@converter("ScatterND", since=11)
def scatter_nd(node: NodeContext, data: Any, indices: Any, updates: Any) -> Any:
    check_tuples(node, data, indices, 0)
    return ops.scatter_nd(data, indices, updates, reduction=text(node.attr("reduction", "none")))


# -- Einsum ----------------------------------------------------------------------------------
# Parsed when the model loads into opforge ops: a label repeated within one operand (a diagonal)
# keeps the entries an identity mask selects, summed over one of the two axes; a label only one operand
# has and the output lacks is summed away; operands then combine left to right, each pair as one
# matmul: [batch, kept of A, contracted] @ [batch, contracted, kept of B] (a broadcast multiply when
# nothing is contracted); a transpose puts the result's labels in the output's order.  Ellipsis dims
# are labels of their own (".0", ".1", ... counted from the left of the widest ellipsis).

def einsum_labels(node: NodeContext, equation: str, ranks: Sequence[int]) -> tuple[list[list[str]], list[str]]:
    """The labels of each operand's dims, and of the output's."""
    equation = "".join(equation.split())
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise node.error(f"equation {equation!r} names {len(terms)} operands; the node has {len(ranks)} inputs")
    widths, found = [], []
    for k, (term, rank) in enumerate(zip(terms, ranks)):
        head, marked, tail = term.partition("...")
        letters = head + tail
        if not all(c.isalpha() for c in letters) or "." in letters:
            raise node.error(f"equation {equation!r}: term {term!r} holds characters other than letters and one "
                             "'...'")
        width = rank - len(letters) if marked else 0
        if width < 0 or (not marked and len(letters) != rank):
            raise node.error(f"equation {equation!r}: term {term!r} does not fit input {k} of rank {rank}")
        widths.append(width)
        found.append((head, width, tail))
    ellipsis = max(widths, default=0)
    operands = [list(head) + [f".{ellipsis - width + j}" for j in range(width)] + list(tail)
                for head, width, tail in found]
    dots = [f".{j}" for j in range(ellipsis)]
    if arrow:
        before, has_dots, after = rhs.partition("...")
        if not all(c.isalpha() for c in before + after):
            raise node.error(f"equation {equation!r}: output {rhs!r} holds characters other than letters and one "
                             "'...'")
        output = list(before) + (dots if has_dots else []) + list(after)
        every = {label for labels in operands for label in labels}
        if len(set(output)) != len(output) or not set(output) <= every:
            raise node.error(f"equation {equation!r}: output {rhs!r} repeats a label or names one no input has")
    else:  # implicit: the ellipsis dims, then the letters seen once, in alphabetical order
        counts: dict[str, int] = {}
        for labels in operands:
            for label in labels:
                counts[label] = counts.get(label, 0) + 1
        output = dots + sorted(label for label, n in counts.items() if n == 1 and not label.startswith("."))
    return operands, output


def einsum_size(node: NodeContext, x: Any, axis: int, label: str) -> int:
    size = int(dims_of(x)[axis])
    if size < 0:
        raise node.unknown(f"Einsum needs the size of label {label!r} known when the model is loaded; it is unknown")
    return size


def regrouped(node: NodeContext, x: Any, batch: int, groups: Sequence[Sequence[str]]) -> Any:
    """x (its first ``batch`` dims kept) reshaped so each group of its following dims is one dim of their
    product (a size unknown at load time only as a group's one dim)."""
    dims = list(dims_of(x))
    target, at = [0] * batch, batch
    for group in groups:
        sizes = dims[at:at + len(group)]
        target.append(-1 if -1 in sizes else int(np.prod(sizes, dtype=np.int64)))
        at += len(group)
    if target[batch:] == dims[batch:]:
        return x
    return reshaped(node, x, target, allowzero=True, copies=range(batch))


def einsum_pair(node: NodeContext, a: Any, la: list[str], b: Any, lb: list[str],
                keep: set[str]) -> tuple[Any, list[str]]:
    batch = [label for label in la if label in lb and label in keep]
    contracted = [label for label in la if label in lb and label not in keep]
    a_only = [label for label in la if label not in lb]
    b_only = [label for label in lb if label not in la]
    for label in contracted:
        sizes = (dims_of(a)[la.index(label)], dims_of(b)[lb.index(label)])
        if -1 not in sizes and sizes[0] != sizes[1]:
            raise node.error(f"Einsum label {label!r} has sizes {sizes[0]} and {sizes[1]} in two operands")
    a = moved(a, la, batch + a_only + contracted)
    b = moved(b, lb, batch + contracted + b_only)
    n = len(batch)
    if not contracted:  # an outer product over the batch: a broadcast multiply, nothing summed
        a = ops.unsqueeze(a, axes=list(range(n + len(a_only), n + len(a_only) + len(b_only)))) if b_only else a
        b = ops.unsqueeze(b, axes=list(range(n, n + len(a_only)))) if a_only else b
        return ops.mul(a, b), batch + a_only + b_only
    y = ops.matmul(regrouped(node, a, n, [a_only, contracted]), regrouped(node, b, n, [contracted, b_only]))
    kept = [dims_of(a)[n + k] for k in range(len(a_only))] + [dims_of(b)[n + len(contracted) + k]
                                                            for k in range(len(b_only))]
    if len(a_only) != 1 or len(b_only) != 1:
        y = reshaped(node, y, [0] * n + [int(s) for s in kept], allowzero=True, copies=range(n))
    return y, batch + a_only + b_only


def moved(x: Any, labels: list[str], order: list[str]) -> Any:
    perm = [labels.index(label) for label in order]
    return x if perm == sorted(perm) else ops.transpose(x, perm=perm)


@converter("Einsum", since=12)
def einsum(node: NodeContext, *inputs: Any) -> Any:
    if not inputs or any(x is None for x in inputs):
        raise node.error("Einsum needs at least one input, and none omitted")
    equation = node.attr("equation")
    if equation is None:
        raise node.error("attribute 'equation' is required")
    ranks = [rank_of(node, x, f"input {k}") for k, x in enumerate(inputs)]
    operand_labels, output = einsum_labels(node, text(equation), ranks)
    operands = []
    for x, labels in zip(inputs, operand_labels):
        labels = list(labels)
        while len(set(labels)) < len(labels):  # a diagonal: keep the entries where the two axes agree
            label = next(label for label in labels if labels.count(label) > 1)
            p = labels.index(label)
            q = labels.index(label, p + 1)
            size = einsum_size(node, x, p, label)
            mask = np.eye(size, dtype=bool).reshape([size if k in (p, q) else 1 for k in range(len(labels))])
            # a select, not a product with the mask: inf * 0 off the diagonal would be NaN
            x = ops.reduce_sum(ops.where(mask, x, np.zeros((), dtype_of(x))), axes=[q])
            labels.pop(q)
        operands.append([x, labels])
    for k, (x, labels) in enumerate(operands):  # labels only this operand has, and the output lacks
        elsewhere = set(output).union(*(other for j, (_, other) in enumerate(operands) if j != k))
        gone = [axis for axis, label in enumerate(labels) if label not in elsewhere]
        if gone:
            operands[k] = [ops.reduce_sum(x, axes=gone), [label for label in labels if label in elsewhere]]
    y, labels = operands[0]
    for k in range(1, len(operands)):
        keep = set(output).union(*(other for _, other in operands[k + 1:]))
        y, labels = einsum_pair(node, y, labels, operands[k][0], operands[k][1], keep)
    return moved(y, labels, output)


# -- DepthToSpace, SpaceToDepth ------------------------------------------------------------------
# A reshape that splits the moving dims into blocks, a transpose, a reshape that joins them: the block
# size and the dims split must be known when the model loads (the batch dim may be unknown).

def blocks_of(node: NodeContext, x: Any) -> tuple[int, str, tuple[int, int, int]]:
    """(block size, mode, (C, H, W)) of a DepthToSpace / SpaceToDepth node on x, checked."""
    dims = dims_of(x)
    if rank_of(node, x, "input 'input'") != 4:
        raise node.error(f"input 'input' has shape {list(dims)}; {node.op_type} takes [N, C, H, W]")
    size = node.attr("blocksize")
    if size is None or int(size) < 1:
        raise node.error(f"attribute 'blocksize' is {size}; it is required and must be >= 1")
    mode = text(node.attr("mode", "DCR"))
    if mode not in ("DCR", "CRD"):
        raise node.error(f"attribute 'mode' is {mode!r}; expected 'DCR' or 'CRD'")
    c, h, w = (int(d) for d in dims[1:])
    if -1 in (c, h, w):
        raise node.unknown(f"{node.op_type} needs dims C, H and W of input 'input' known when the model is loaded; "
                         f"its shape is {list(dims)}")
    return int(size), mode, (c, h, w)


@converter("DepthToSpace", since=1)
def depth_to_space(node: NodeContext, x: Any) -> Any:
    b, mode, (c, h, w) = blocks_of(node, x)
    if c % (b * b):
        raise node.error(f"input 'input' has {c} channels, not a multiple of blocksize^2 = {b * b}")
    if mode == "DCR":  # channels are [row in block, column in block, output channel]
        split, perm = [b, b, c // (b * b), h, w], [0, 3, 4, 1, 5, 2]
    else:  # [output channel, row in block, column in block]
        split, perm = [c // (b * b), b, b, h, w], [0, 1, 4, 2, 5, 3]
    blocks = ops.transpose(reshaped(node, x, [0] + split, allowzero=True, copies=[0]), perm=perm)
    return reshaped(node, blocks, [0, c // (b * b), h * b, w * b], allowzero=True, copies=[0])


@converter("SpaceToDepth", since=1)
def space_to_depth(node: NodeContext, x: Any) -> Any:
    b, mode, (c, h, w) = blocks_of(node, x)
    if h % b or w % b:
        raise node.error(f"input 'input' has H {h} and W {w}; both must be multiples of blocksize {b}")
    split = reshaped(node, x, [0, c, h // b, b, w // b, b], allowzero=True, copies=[0])
    blocks = ops.transpose(split, perm=[0, 3, 5, 1, 2, 4] if mode == "DCR" else [0, 1, 3, 5, 2, 4])
    return reshaped(node, blocks, [0, c * b * b, h // b, w // b], allowzero=True, copies=[0])


# -- OneHot --------------------------------------------------------------------------------------
# equal(indices, a range along the new axis), then where(on, off): depth and values are known at load.

def one_hot(node: NodeContext, indices: Any, depth: Any, values: Any, wrap: bool) -> Any:
    count = np.asarray(node.constant(depth, "input 'depth'"))
    pair = np.asarray(node.constant(values, "input 'values'"))
    if count.size != 1 or float(count.reshape(-1)[0]) < 1:
        raise node.error(f"input 'depth' must be one value >= 1; it is {count.reshape(-1).tolist()}")
    if pair.size != 2:
        raise node.error(f"input 'values' must hold two values [off, on]; it holds {pair.size}")
    n = int(count.reshape(-1)[0])
    rank = rank_of(node, indices, "input 'indices'") + 1
    axis = node.attr("axis", -1)
    if not -rank <= axis < rank:
        raise node.error(f"attribute 'axis' {axis} is out of range for an output of rank {rank} "
                         f"(valid: {-rank}..{rank - 1})")
    axis %= rank
    at = indices if dtype_of(indices) == "int64" else ops.cast(indices, dtype="int64")  # floats: truncated
    if wrap:  # negative indices count from the end
        at = ops.where(ops.less(at, np.int64(0)), ops.add(at, np.int64(n)), at)
    places = np.arange(n, dtype=np.int64).reshape([n if k == axis else 1 for k in range(rank)])
    hot = ops.equal(ops.unsqueeze(at, axes=[axis]), places)
    off, on = pair.reshape(-1)
    return widened(node, lambda a, b: ops.where(hot, a, b), [np.asarray(on), np.asarray(off)], NUMERIC + ("bool",))


@converter("OneHot", since=9)
def one_hot_v9(node: NodeContext, indices: Any, depth: Any, values: Any) -> Any:
    return one_hot(node, indices, depth, values, wrap=False)  # an index below 0 is out of range: all off


@converter("OneHot", since=11)
def one_hot_v11(node: NodeContext, indices: Any, depth: Any, values: Any) -> Any:
    return one_hot(node, indices, depth, values, wrap=True)
