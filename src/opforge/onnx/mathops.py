"""Converters of ONNX's math ops that exported transformer and CNN models
use beyond the arithmetic of elementwise.py: the trigonometric and
hyperbolic functions (Sin ... Atanh; rotary position embeddings take Sin and
Cos of a frequency table), CumSum and Trilu (causal attention masks).

float16 and bfloat16 inputs of the trigonometric functions are computed in
float32 and cast back, as elementwise.py's unary ops are.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from ..spec import UNKNOWN_RANK
from .elementwise import FLOATS, dims_of, unary
from .registry import converter

if TYPE_CHECKING:
    from .registry import NodeContext

ops = opforge.ops

# ONNX op type -> (opforge op, the opset that introduced it)
TRIGONOMETRIC = {
    "Sin": (ops.sin, 7), "Cos": (ops.cos, 7), "Tan": (ops.tan, 7), "Asin": (ops.asin, 7), "Acos": (ops.acos, 7),
    "Atan": (ops.atan, 7), "Sinh": (ops.sinh, 9), "Cosh": (ops.cosh, 9), "Asinh": (ops.asinh, 9),
    "Acosh": (ops.acosh, 9), "Atanh": (ops.atanh, 9),
}
for _op_type, (_fn, _since) in TRIGONOMETRIC.items():
    unary(_op_type, _fn, FLOATS, since=_since)
del _op_type, _fn, _since


# -- CumSum ----------------------------------------------------------------------------

@converter("CumSum", since=11)
def cumsum(node: NodeContext, x: Any, axis: Any) -> Any:
    """The axis (a 0-d or one-element int tensor) must be known when the model loads: it is the op's attribute."""
    value = np.asarray(node.constant(axis, "input 'axis'"))
    if value.size != 1 or value.dtype.kind not in "iu":
        raise node.error(f"input 'axis' must be one integer; it has shape {list(value.shape)} and dtype {value.dtype}")
    rank = dims_of(x)
    axis_value = int(value.reshape(-1)[0])
    if rank != UNKNOWN_RANK and not -len(rank) <= axis_value < len(rank):
        raise node.error(f"input 'axis' is {axis_value}, out of range for input 'x' of rank {len(rank)}")
    return ops.cumsum(x, axis=axis_value, exclusive=bool(node.attr("exclusive", 0)),
                      reverse=bool(node.attr("reverse", 0)))


# -- Trilu -----------------------------------------------------------------------------

@converter("Trilu", since=14)
def trilu(node: NodeContext, x: Any, k: Any = None) -> Any:
    """The diagonal offset k (a 0-d or one-element int64 tensor, default 0) must be known when the model loads."""
    offset = 0
    if k is not None:
        value = np.asarray(node.constant(k, "input 'k'"))
        if value.size != 1 or value.dtype.kind not in "iu":
            raise node.error(f"input 'k' must be one integer; it has shape {list(value.shape)} and dtype "
                             f"{value.dtype}")
        offset = int(value.reshape(-1)[0])
    rank = dims_of(x)
    if rank != UNKNOWN_RANK and len(rank) < 2:
        raise node.error(f"input 'input' has rank {len(rank)}; Trilu needs rank >= 2")
    return ops.trilu(x, upper=bool(node.attr("upper", 1)), k=offset)
