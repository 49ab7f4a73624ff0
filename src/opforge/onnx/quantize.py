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


# -- integer products: MatMulInteger, QLinearMatMul, ConvInteger, QLinearConv ---------------------------

EIGHT_BIT = ("int8", "uint8")


def centered(node: NodeContext, x: Any, zero_point: Any, what: str, per_row: bool = False) -> Any:
    """x - zero_point in float64 (exact).  A zero point is per tensor, or per row of A (a vector as long as
    A's rows: a column here) / per column of B (a vector that broadcasts as it is) / per output channel of W
    (``per_row`` too: one value per leading index), or shaped to broadcast against x."""
    if dtype_of(x) not in EIGHT_BIT:
        raise node.error(f"input '{what}' has dtype {dtype_of(x)}; {node.op_type} takes int8 or uint8")
    wide = ops.cast(x, dtype="float64")
    if zero_point is None:
        return wide
    if dtype_of(zero_point) != dtype_of(x):
        raise node.error(f"the zero point of input '{what}' has dtype {dtype_of(zero_point)}, the input has "
                         f"{dtype_of(x)}; they must match")
    zero = ops.cast(zero_point, dtype="float64")
    dims, zdims = dims_of(x), dims_of(zero_point)
    if per_row and zdims != UNKNOWN_RANK and len(zdims) == 1 and dims != UNKNOWN_RANK and len(dims) >= 2:
        zero = ops.reshape(zero, shape=[-1] + [1] * (len(dims) - 1 if "Conv" in node.op_type else 1))
    return ops.sub(wide, zero)


def integer_matmul(node: NodeContext, a: Any, a_zero_point: Any, b: Any, b_zero_point: Any) -> Any:
    """(A - a_zp) @ (B - b_zp) in float64: exact integers (the module says why), with ONNX MatMul's ranks."""
    from .linear import matmul

    return matmul(node, centered(node, a, a_zero_point, "A", per_row=True), centered(node, b, b_zero_point, "B"))


@converter("MatMulInteger", since=10)
def matmul_integer(node: NodeContext, a: Any, b: Any, a_zero_point: Any = None, b_zero_point: Any = None) -> Any:
    return ops.cast(integer_matmul(node, a, a_zero_point, b, b_zero_point), dtype="int32")


def requantized(node: NodeContext, acc: Any, multiplier: Any, y_zero_point: Any, out_dtype: str) -> Any:
    """saturate(round_half_even(acc * multiplier) + y_zero_point), acc and multiplier float64."""
    if y_zero_point is None:
        y_zero_point = np.zeros((), out_dtype)
    if dtype_of(y_zero_point) not in EIGHT_BIT:
        raise node.error(f"the output zero point has dtype {dtype_of(y_zero_point)}; expected int8 or uint8")
    return ops.quantize_linear(ops.mul(acc, multiplier), np.ones((), np.float64),
                               ops.reshape(y_zero_point, shape=[]))


def wide(node: NodeContext, scale: Any, what: str) -> Any:
    if dtype_of(scale) not in SCALES + NARROW_FLOATS:
        raise node.error(f"input '{what}' has dtype {dtype_of(scale)}; expected a float scale")
    return ops.cast(scale, dtype="float64")


@converter("QLinearMatMul", since=10)
def qlinear_matmul(node: NodeContext, a: Any, a_scale: Any, a_zero_point: Any, b: Any, b_scale: Any,
                   b_zero_point: Any, y_scale: Any, y_zero_point: Any = None) -> Any:
    """A's scale per tensor or per row, B's per tensor or per column; the multiplier a_scale * b_scale /
    y_scale is taken in float64 (opset 21 adds float16 and bfloat16 scales)."""
    acc = integer_matmul(node, a, a_zero_point, b, b_zero_point)
    a_s = wide(node, a_scale, "a_scale")
    if dims_of(a_scale) != UNKNOWN_RANK and len(dims_of(a_scale)) == 1:
        a_s = ops.reshape(a_s, shape=[-1, 1])  # per row of A: a column
    multiplier = ops.div(ops.mul(a_s, wide(node, b_scale, "b_scale")), wide(node, y_scale, "y_scale"))
    return requantized(node, acc, multiplier, y_zero_point,
                       dtype_of(a) if y_zero_point is None else dtype_of(y_zero_point))


def integer_conv(node: NodeContext, x: Any, x_zero_point: Any, w: Any, w_zero_point: Any, bias: Any = None) -> Any:
    """conv of (x - x_zp) by (w - w_zp) in float64 (exact), plus an int32 bias; the padding is 0 after the
    shift, i.e. the zero point before it, as ONNX says."""
    from .linear import conv

    if x_zero_point is not None and np.prod(dims_of(x_zero_point)) not in (1,):
        raise node.error(f"the zero point of input 'x' has shape {list(dims_of(x_zero_point))}; it is per tensor "
                         "(one element)")
    xs = centered(node, x, None if x_zero_point is None else ops.reshape(x_zero_point, shape=[]), "x")
    if bias is not None:
        if dtype_of(bias) != "int32":
            raise node.error(f"input 'B' has dtype {dtype_of(bias)}; expected int32")
        bias = ops.cast(bias, dtype="float64")
    return conv(node, xs, centered(node, w, w_zero_point, "w", per_row=True), bias)


@converter("ConvInteger", since=10)
def conv_integer(node: NodeContext, x: Any, w: Any, x_zero_point: Any = None, w_zero_point: Any = None) -> Any:
    return ops.cast(integer_conv(node, x, x_zero_point, w, w_zero_point), dtype="int32")


@converter("QLinearConv", since=10)
def qlinear_conv(node: NodeContext, x: Any, x_scale: Any, x_zero_point: Any, w: Any, w_scale: Any,
                 w_zero_point: Any, y_scale: Any, y_zero_point: Any = None, bias: Any = None) -> Any:
    """w's scale per tensor or per output channel; the bias is int32, in the accumulator's units."""
    acc = integer_conv(node, x, x_zero_point, w, w_zero_point, bias)
    w_s = wide(node, w_scale, "w_scale")
    rank = len(node.static_shape(w, "input 'w'")) if dims_of(w) == UNKNOWN_RANK else len(dims_of(w))
    if dims_of(w_scale) != UNKNOWN_RANK and len(dims_of(w_scale)) == 1:
        w_s = ops.reshape(w_s, shape=[-1] + [1] * (rank - 2))  # per output channel: dim 1 of y
    multiplier = ops.div(ops.mul(wide(node, x_scale, "x_scale"), w_s), wide(node, y_scale, "y_scale"))
    return requantized(node, acc, multiplier, y_zero_point,
                       dtype_of(x) if y_zero_point is None else dtype_of(y_zero_point))
