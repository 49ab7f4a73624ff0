"""Converters of ONNX's quantization ops: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
MatMulInteger, QLinearMatMul, ConvInteger, QLinearConv.

QuantizeLinear and DequantizeLinear are the built-ins ``quantize_linear`` and ``dequantize_linear``
(per tensor, per axis, blocked), for int8, uint8, int16, uint16 (and int32 to dequantize); the float8,
int4 and int2 types have no opforge dtype, and ``load`` refuses them.  The built-ins divide and multiply
in float32 or float64; a float16 or bfloat16 scale (or ``precision``) is emulated exactly: the quotient is
taken in float32 and rounded to float16 before it is rounded to an integer (float32 has more than twice
float16's and bfloat16's precision, so rounding twice gives the correctly rounded float16 quotient), and
a product is taken exactly in float64 and rounded once to the output type.

The integer products (MatMulInteger, ConvInteger and the QLinear ops) run in float64: each product of
two 8-bit values (less their zero points) and every partial sum are integers below 2**53, held exactly,
so the int32 result is exact for any reduction shorter than 2**53 / 255**2 (about 10**11) terms.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from ..builtins.quantize_linear import DEQUANTIZABLE, QUANTIZED, SCALES
from ..spec import UNKNOWN_RANK
from .elementwise import dims_of, dtype_of
from .load import onnx_dtype
from .registry import converter

if TYPE_CHECKING:
    from .registry import NodeContext

ops = opforge.ops
NARROW_FLOATS = ("float16", "bfloat16")  # scales the built-ins do not take: emulated as the module says


def zeros_for(node: NodeContext, scale: Any, dtype: str) -> Any:
    """A zero point of zeros shaped as ``scale`` (the built-ins take every input)."""
    return np.zeros(node.static_shape(scale, "the scale"), dtype)


def granularity(node: NodeContext, x: Any, scale: Any) -> tuple[int, int]:
    """(axis, block_size) from the node's attributes, checked against x's rank where known."""
    axis, block = int(node.attr("axis", 1)), int(node.attr("block_size", 0))
    dims = dims_of(x)
    scale_dims = dims_of(scale)
    per_tensor = scale_dims != UNKNOWN_RANK and (len(scale_dims) == 0 or tuple(scale_dims) == (1,))
    if dims != UNKNOWN_RANK and not per_tensor and not -len(dims) <= axis < len(dims):
        raise node.error(f"attribute 'axis' {axis} is out of range for input 'x' of rank {len(dims)}")
    return axis, block


def spread(node: NodeContext, v: Any, x: Any, axis: int, block: int) -> Any:
    """A scale or zero point made to broadcast against x (for the emulated float16 paths)."""
    dims = dims_of(v)
    if dims != UNKNOWN_RANK and (len(dims) == 0 or tuple(dims) == (1,)):
        return ops.reshape(v, shape=[])
    rank = len(node.static_shape(x, "input 'x'")) if dims_of(x) == UNKNOWN_RANK else len(dims_of(x))
    axis %= rank
    if block == 0:
        return ops.reshape(v, shape=[-1] + [1] * (rank - axis - 1))
    size = node.static_shape(x, "input 'x'")[axis]
    return ops.gather(v, np.arange(size, dtype=np.int64) // block, axis=axis)


def quantize(node: NodeContext, x: Any, scale: Any, zero_point: Any, out_dtype: str, precision: str) -> Any:
    """quantize_linear with the quotient taken in ``precision``."""
    axis, block = granularity(node, x, scale)
    if zero_point is None:
        zero_point = zeros_for(node, scale, out_dtype)
    if precision in SCALES:
        if dtype_of(x) != precision:
            x = ops.cast(x, dtype=precision)
        if dtype_of(scale) != precision:
            scale = ops.cast(scale, dtype=precision)
        return ops.quantize_linear(x, scale, zero_point, axis=axis, block_size=block)
    if precision not in NARROW_FLOATS:
        raise node.error(f"the division's precision {precision} is not supported (float32, float64, float16, "
                         "bfloat16)")
    wide_x = x if dtype_of(x) == "float32" else ops.cast(x, dtype="float32")
    wide_s = ops.cast(ops.cast(scale, dtype=precision), dtype="float32")
    quotient = ops.div(wide_x, spread(node, wide_s, x, axis, block))
    quotient = ops.cast(ops.cast(quotient, dtype=precision), dtype="float32")
    ones = np.ones(node.static_shape(scale, "the scale"), np.float32)
    return ops.quantize_linear(quotient, ones, zero_point, axis=axis, block_size=block)


@converter("QuantizeLinear", since=10)
def quantize_linear(node: NodeContext, x: Any, y_scale: Any, y_zero_point: Any = None) -> Any:
    """Opset 10 per tensor; 13 per axis; 19 float8 (refused: no dtype); 21 blocks, ``output_dtype``, int16,
    uint16, int4 (refused); 25 ``precision``."""
    if y_zero_point is not None:
        out_dtype = dtype_of(y_zero_point)
    elif node.attr("output_dtype", 0):
        out_dtype = onnx_dtype(node.attr("output_dtype"), f"{node!r}: attribute 'output_dtype'")
    else:
        out_dtype = "uint8"
    if out_dtype not in QUANTIZED:
        raise node.error(f"quantizing to {out_dtype} is not supported (supported: {', '.join(QUANTIZED)})")
    if dtype_of(x) not in SCALES + NARROW_FLOATS + ("int32",):
        raise node.error(f"input 'x' has dtype {dtype_of(x)}; QuantizeLinear takes float32, float16, bfloat16, "
                         "int32 (and opforge float64)")
    precision = node.attr("precision", 0)
    if precision:
        precision = onnx_dtype(precision, f"{node!r}: attribute 'precision'")
    else:
        precision = dtype_of(y_scale) if dtype_of(y_scale) != "int32" else "float32"
    return quantize(node, x, y_scale, y_zero_point, out_dtype, precision)


@converter("DequantizeLinear", since=10)
def dequantize_linear(node: NodeContext, x: Any, x_scale: Any, x_zero_point: Any = None) -> Any:
    """y has ``output_dtype`` (opset 23) or the scale's dtype; the product is taken in that dtype."""
    if dtype_of(x) not in DEQUANTIZABLE:
        raise node.error(f"input 'x' has dtype {dtype_of(x)}; DequantizeLinear takes {', '.join(DEQUANTIZABLE)} "
                         "(float8, int4 and int2 have no opforge dtype)")
    out_dtype = dtype_of(x_scale)
    if node.attr("output_dtype", 0):
        out_dtype = onnx_dtype(node.attr("output_dtype"), f"{node!r}: attribute 'output_dtype'")
    if out_dtype not in SCALES + NARROW_FLOATS:
        raise node.error(f"output dtype {out_dtype} is not supported (float32, float64, float16, bfloat16)")
    axis, block = granularity(node, x, x_scale)
    if x_zero_point is None:
        x_zero_point = zeros_for(node, x_scale, dtype_of(x))
    compute = out_dtype if out_dtype in SCALES else "float64"  # exact, then rounded once
    if dtype_of(x_scale) != compute:
        x_scale = ops.cast(x_scale, dtype=compute)
    y = ops.dequantize_linear(x, x_scale, x_zero_point, axis=axis, block_size=block)
    return y if compute == out_dtype else ops.cast(y, dtype=out_dtype)


@converter("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(node: NodeContext, x: Any) -> Any:
    if dtype_of(x) != "float32":
        raise node.error(f"input 'x' has dtype {dtype_of(x)}; DynamicQuantizeLinear takes float32")
    return ops.dynamic_quantize_linear(x)
