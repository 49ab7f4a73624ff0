"""Converters of ONNX ops whose output sizes depend on their inputs' values:
NonZero, NonMaxSuppression, Unique, Compress.

An opforge graph's shapes follow from its inputs' shapes, so these ops are
graph nodes only where their values are known when the model loads: on
arrays (initializers, constants, or every input while a ``DynamicModel``
runs the model node by node) each computes its exact ONNX result with NumPy
here; on a traced value each says so with ``node.unknown``, and the model
runs node by node on each call's arrays.  Compress with a condition known at
load time is a gather with constant indices, so it stays in the graph.
Attributes are checked first either way, so a bad one is a ModelError when
the model loads.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from ..spec import UNKNOWN_RANK
from .elementwise import dims_of, dtype_of
from .registry import converter

if TYPE_CHECKING:
    import numpy.typing as npt

    from .registry import NodeContext

# Tensors here are traced Values, or np.ndarrays known when the model loads: typed Any.
ops = opforge.ops
FLOATS = ("float16", "bfloat16", "float32", "float64")


def traced(*inputs: Any) -> bool:
    """Whether any of the inputs is a traced value (not an array known now)."""
    return any(x is not None and not isinstance(x, (np.ndarray, np.generic)) for x in inputs)


def value_sized(node: NodeContext, what: str) -> Exception:
    return node.unknown(f"its output size depends on the values of {what}, which the model computes at run time "
                        "(the model runs node by node on each call's arrays)")


def checked_axis(node: NodeContext, x: Any, axis: Any) -> int | None:
    """Attribute 'axis' normalized against x's rank (None when absent); ModelError when out of range."""
    if axis is None:
        return None
    if not isinstance(axis, int):
        raise node.error(f"attribute 'axis' is {axis!r}; it must be an integer")
    dims = dims_of(x)
    if dims == UNKNOWN_RANK:
        return axis
    rank = len(dims)
    if not -rank <= axis < rank:
        raise node.error(f"attribute 'axis' {axis} is out of range for input of rank {rank} "
                         f"(valid: {-rank}..{rank - 1})")
    return axis % rank


# -- NonZero ---------------------------------------------------------------------------------

@converter("NonZero", since=9)
def non_zero(node: NodeContext, x: Any) -> Any:
    if traced(x):
        raise value_sized(node, "input 'X' (how many of its elements are non-zero)")
    x = np.asarray(x)
    # a 0-d tensor counts as one element of a 1-d one, as onnxruntime has it: [[0]] or a [1, 0] result
    return np.stack(np.nonzero(x.reshape(1) if x.ndim == 0 else x)).astype(np.int64).reshape(max(x.ndim, 1), -1)


# -- Compress --------------------------------------------------------------------------------

@converter("Compress", since=9)
def compress(node: NodeContext, data: Any, condition: Any) -> Any:
    axis = checked_axis(node, data, node.attr("axis"))
    if dtype_of(condition) != "bool":
        raise node.error(f"input 'condition' has dtype {dtype_of(condition)}; Compress takes a bool condition")
    cond_dims = dims_of(condition)
    if cond_dims != UNKNOWN_RANK and len(cond_dims) != 1:
        raise node.error(f"input 'condition' has shape {list(cond_dims)}; Compress takes a 1-d condition")
    if traced(condition):
        raise value_sized(node, "input 'condition' (how many of its entries are true)")
    dims = dims_of(data)
    if axis is None:  # the flattened input
        size = -1 if dims == UNKNOWN_RANK or -1 in dims else int(np.prod(dims, dtype=np.int64))
    else:
        size = -1 if dims == UNKNOWN_RANK else int(dims[axis])
    if size < 0:
        raise node.unknown(f"Compress keeps the entries of input 'condition' up to the size of "
                           f"{'the flattened input' if axis is None else f'axis {axis}'}, unknown until the model "
                           "runs (each input signature converts it again)")
    # Entries past the size are ignored, true or not (as onnxruntime does).
    indices = np.flatnonzero(np.asarray(condition)[:size]).astype(np.int64)
    if axis is None:
        data = np.asarray(data).reshape(-1) if isinstance(data, np.ndarray) else ops.reshape(data, shape=[-1])
    if isinstance(data, np.ndarray):
        return np.take(data, indices, axis=axis or 0)
    return ops.gather(data, indices, axis=axis or 0)


# -- Unique ----------------------------------------------------------------------------------

def comparable(rows: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """rows in a dtype NumPy sorts by value (bfloat16, a NumPy extension type, as float32: exact)."""
    return rows.astype(np.float32) if rows.dtype.kind not in "biuf" else rows


def unique_rows(rows: npt.NDArray[Any]) -> tuple[npt.NDArray[np.int64], ...]:
    """(first occurrence of each distinct row, in sorted order; the distinct row of each row; counts) of a
    2-d array, rows compared lexicographically (NaNs equal to each other, -0.0 equal to 0.0)."""
    n, width = rows.shape
    if n == 0:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty
    keys = comparable(rows)
    if width == 0:  # rows of no elements: all alike
        order, starts = np.arange(n), np.zeros(n, bool)
    else:
        order = np.lexsort(keys.T[::-1])  # stable: within a group of equal rows, first occurrence first
        ordered = keys[order]
        differ = ordered[1:] != ordered[:-1]
        if ordered.dtype.kind == "f":
            differ &= ~(np.isnan(ordered[1:]) & np.isnan(ordered[:-1]))
        starts = np.zeros(n, bool)
        starts[1:] = differ.any(axis=1)
    starts[0] = True
    group = np.cumsum(starts) - 1
    first = order[starts].astype(np.int64)
    inverse = np.empty(n, np.int64)
    inverse[order] = group
    counts = np.diff(np.append(np.flatnonzero(starts), n)).astype(np.int64)
    return first, inverse, counts


@converter("Unique", since=11)
def unique(node: NodeContext, x: Any) -> tuple[Any, ...]:
    is_sorted = node.attr("sorted", 1)
    if is_sorted not in (0, 1):
        raise node.error(f"attribute 'sorted' is {is_sorted!r}; it must be 0 or 1")
    axis = checked_axis(node, x, node.attr("axis"))
    if traced(x):
        raise value_sized(node, "input 'X' (how many distinct values it holds)")
    x = np.asarray(x)
    if axis is None:
        moved = x.reshape(-1)
        rows = moved.reshape(-1, 1)
    else:
        moved = np.moveaxis(x, axis, 0)
        rows = moved.reshape(moved.shape[0], -1)
    first, inverse, counts = unique_rows(rows)
    if not is_sorted:  # in order of first occurrence
        perm = np.argsort(first, kind="stable")
        rank = np.empty_like(perm)
        rank[perm] = np.arange(len(perm))
        first, counts, inverse = first[perm], counts[perm], rank[inverse].astype(np.int64)
    y = moved[first]
    if axis is not None:
        y = np.moveaxis(y, 0, axis)
    return np.ascontiguousarray(y), first, inverse, counts


# -- NonMaxSuppression ------------------------------------------------------------------------
# Greedy per (batch, class): boxes in descending score (ties: the lower index first) are taken unless a box
# taken before overlaps them by IoU > iou_threshold, up to max_output_boxes_per_class.  Every (batch, class)
# advances together: step k looks at the k-th best box of each that is still taking boxes and compares the
# ones taken with every box of their batch at once.

def one_number(node: NodeContext, x: Any, what: str, default: float | None) -> float | None:
    if x is None:
        return default
    values = np.asarray(x).reshape(-1)
    if values.size != 1:
        raise node.error(f"input '{what}' must hold one value; it holds {values.size}")
    return float(values[0].item())


def corners(boxes: npt.NDArray[Any], center: bool) -> tuple[npt.NDArray[Any], ...]:
    """(y_min, x_min, y_max, x_max) of boxes [..., 4]: [y1, x1, y2, x2] (either diagonal) or, with
    ``center``, [x_center, y_center, width, height]."""
    if center:
        half_w, half_h = boxes[..., 2] / 2, boxes[..., 3] / 2
        return (boxes[..., 1] - half_h, boxes[..., 0] - half_w, boxes[..., 1] + half_h, boxes[..., 0] + half_w)
    y1, x1, y2, x2 = boxes[..., 0], boxes[..., 1], boxes[..., 2], boxes[..., 3]
    return np.minimum(y1, y2), np.minimum(x1, x2), np.maximum(y1, y2), np.maximum(x1, x2)


def overlapping(box: tuple[npt.NDArray[Any], ...], others: tuple[npt.NDArray[Any], ...],
                threshold: np.floating[Any]) -> npt.NDArray[np.bool_]:
    """Whether each box of ``others`` overlaps ``box`` (broadcast against it) by IoU > threshold; boxes of
    no area overlap nothing."""
    y0, x0, y1, x1 = box
    oy0, ox0, oy1, ox1 = others
    inter = np.maximum(np.minimum(y1, oy1) - np.maximum(y0, oy0), 0) * \
        np.maximum(np.minimum(x1, ox1) - np.maximum(x0, ox0), 0)
    area, other_area = (y1 - y0) * (x1 - x0), (oy1 - oy0) * (ox1 - ox0)
    union = area + other_area - inter
    counted = (inter > 0) & (area > 0) & (other_area > 0) & (union > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        near: npt.NDArray[np.bool_] = counted & (inter / np.where(counted, union, 1) > threshold)
    return near


def non_max_suppression(boxes: npt.NDArray[Any], scores: npt.NDArray[Any], max_per_class: int,
                        iou_threshold: float, score_threshold: float | None,
                        center: bool) -> npt.NDArray[np.int64]:
    """ONNX NonMaxSuppression: selected [batch, class, box] rows, by batch, class, then descending score."""
    batches, count, _ = boxes.shape
    classes = scores.shape[1]
    dtype = np.float64 if boxes.dtype == np.float64 else np.float32
    edges = corners(boxes.astype(dtype), center)
    scores = scores.astype(np.float64 if scores.dtype == np.float64 else np.float32)
    if max_per_class <= 0 or not count or not classes:
        return np.zeros((0, 3), np.int64)
    order = np.argsort(-scores, axis=2, kind="stable")  # [B, C, N] box indices, best first
    limit: npt.NDArray[np.integer[Any]]
    if score_threshold is None:
        limit = np.full((batches, classes), count)
    else:  # the boxes above the threshold are a prefix of the order
        limit = (np.take_along_axis(scores, order, axis=2) > scores.dtype.type(score_threshold)).sum(axis=2)
    threshold = np.dtype(dtype).type(iou_threshold)
    taken = np.zeros((batches, classes, count), bool)  # by rank in the order
    suppressed = np.zeros((batches, classes, count), bool)  # by box index
    chosen = np.zeros((batches, classes), np.int64)
    for k in range(count):
        b, c = np.nonzero((k < limit) & (chosen < max_per_class))  # both only ever turn false
        if not b.size:
            break
        box = order[b, c, k]
        keep = ~suppressed[b, c, box]
        b, c, box = b[keep], c[keep], box[keep]
        if not b.size:
            continue
        taken[b, c, k] = True
        chosen[b, c] += 1
        near = overlapping(tuple(e[b, box][:, None] for e in edges), tuple(e[b] for e in edges), threshold)
        suppressed[b, c] |= near
    rows, columns, ranks = np.nonzero(taken)
    return np.stack([rows, columns, order[rows, columns, ranks]], axis=1).astype(np.int64)


@converter("NonMaxSuppression", since=10)
def non_max_suppression_node(node: NodeContext, boxes: Any, scores: Any, max_output_boxes_per_class: Any = None,
                             iou_threshold: Any = None, score_threshold: Any = None) -> Any:
    center = node.attr("center_point_box", 0)
    if center not in (0, 1):
        raise node.error(f"attribute 'center_point_box' is {center!r}; it must be 0 ([y1, x1, y2, x2] corners) or "
                         "1 ([x_center, y_center, width, height])")
    for x, what in ((boxes, "boxes"), (scores, "scores")):
        if dtype_of(x) not in FLOATS:
            raise node.error(f"input '{what}' has dtype {dtype_of(x)}; NonMaxSuppression takes floats")
    box_dims: tuple[int, ...] = tuple(dims_of(boxes))
    score_dims: tuple[int, ...] = tuple(dims_of(scores))
    if box_dims != UNKNOWN_RANK and (len(box_dims) != 3 or box_dims[2] not in (4, -1)):
        raise node.error(f"input 'boxes' has shape {list(box_dims)}; it must be [batch, boxes, 4]")
    if score_dims != UNKNOWN_RANK and len(score_dims) != 3:
        raise node.error(f"input 'scores' has shape {list(score_dims)}; it must be [batch, classes, boxes]")
    if box_dims != UNKNOWN_RANK and score_dims != UNKNOWN_RANK:
        boxes_batch, boxes_count, _ = list(box_dims)
        scores_batch, _, scores_count = list(score_dims)
        for at, (a, b) in (("batch", (boxes_batch, scores_batch)), ("boxes", (boxes_count, scores_count))):
            if -1 not in (a, b) and a != b:
                raise node.error(f"inputs 'boxes' {list(box_dims)} and 'scores' {list(score_dims)} disagree on "
                                 f"the number of {at} ({a} and {b})")
    if traced(boxes, scores, max_output_boxes_per_class, iou_threshold, score_threshold):
        raise value_sized(node, "its inputs (how many boxes it selects)")
    most = one_number(node, max_output_boxes_per_class, "max_output_boxes_per_class", 0)
    iou = one_number(node, iou_threshold, "iou_threshold", 0.0)
    if iou is None or not 0 <= iou <= 1:
        raise node.error(f"input 'iou_threshold' is {iou}; it must be in [0, 1]")
    return non_max_suppression(np.asarray(boxes), np.asarray(scores), int(most or 0), float(iou),
                               one_number(node, score_threshold, "score_threshold", None), bool(center))
