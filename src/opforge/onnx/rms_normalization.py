"""Converter of ONNX's RMSNormalization (opset 23): x divided by the root mean square over its dims from
``axis`` on, then scaled.

    y = x / sqrt(mean(x * x over axis..rank-1) + epsilon) * scale

composed of opforge ops (mul, mean, add, sqrt, div; in a graph the elementwise ones fuse).  Stage one
runs in float32 for float16 and bfloat16 inputs (``stash_type`` 1, the only value ONNX defines) and in
x's own dtype for float32 and float64; the scaling is taken in that dtype too and y rounded once to the
scale's dtype (ONNX's V).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from .elementwise import dtype_of, rounded_back
from .shape import rank_of
from .registry import converter

if TYPE_CHECKING:
    from .registry import NodeContext

ops = opforge.ops
FLOAT_TYPES = ("float16", "bfloat16", "float32", "float64")


@converter("RMSNormalization", since=23)
def rms_normalization(node: NodeContext, x: Any, scale: Any) -> Any:
    if node.attr("stash_type", 1) != 1:
        raise node.error(f"attribute 'stash_type' is {node.attr('stash_type')}; ONNX defines only 1 (float32)")
    y, _ = rms_normalized(node, x, scale, int(node.attr("axis", -1)), node.attr("epsilon", 1e-5))
    return y


def rms_normalized(node: NodeContext, x: Any, scale: Any, axis: int, epsilon: float) -> tuple[Any, Any]:
    """(y, rms): x divided by its root mean square over dims axis..rank-1 (kept as 1s in rms, which has
    the compute dtype: float32 for float16 and bfloat16), times scale; y has scale's dtype."""
    for name, value in (("X", x), ("scale", scale)):
        if dtype_of(value) not in FLOAT_TYPES:
            raise node.error(f"input '{name}' has dtype {dtype_of(value)}; {node.op_type} takes "
                             f"{', '.join(FLOAT_TYPES)}")
    rank = rank_of(node, x, "input 'X'")
    if not -rank <= axis < rank:
        raise node.error(f"attribute 'axis' {axis} is out of range for input 'X' of rank {rank} "
                         f"(valid: {-rank}..{rank - 1})")
    compute = dtype_of(x) if dtype_of(x) in ("float32", "float64") else "float32"
    wide = x if dtype_of(x) == compute else ops.cast(x, dtype=compute)
    mean_square = ops.mean(ops.mul(wide, wide), axes=list(range(axis % rank, rank)), keep_dims=True)
    rms = ops.sqrt(ops.add(mean_square, np.asarray(epsilon, compute)))
    factor = scale if dtype_of(scale) == compute else ops.cast(scale, dtype=compute)
    y = ops.mul(ops.div(wide, rms), factor)
    return (y if dtype_of(scale) == compute else rounded_back(y, dtype_of(scale))), rms
