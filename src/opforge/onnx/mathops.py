"""Converters of ONNX's math ops that exported transformer and CNN models
use beyond the arithmetic of elementwise.py: the trigonometric and
hyperbolic functions (Sin ... Atanh; rotary position embeddings take Sin and
Cos of a frequency table), CumSum, Trilu (causal attention masks), Range,
EyeLike and the bitwise integer ops (BitwiseAnd, BitwiseOr, BitwiseXor,
BitwiseNot, BitShift).

float16 and bfloat16 inputs of the trigonometric functions are computed in
float32 and cast back, as elementwise.py's unary ops are.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from ..spec import UNKNOWN_RANK
from .elementwise import FLOATS, NUMERIC, dims_of, dtype_of, ones_like, same_dtype, unary
from .load import onnx_dtype
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


def one_integer(node: NodeContext, value: Any, name: str) -> int:
    """An input that becomes an attribute: a 0-d or one-element int tensor known when the model loads."""
    array = np.asarray(node.constant(value, f"input '{name}'"))
    if array.size != 1 or array.dtype.kind not in "iu":
        raise node.error(f"input '{name}' must be one integer; it has shape {list(array.shape)} and dtype "
                         f"{array.dtype}")
    return int(array.reshape(-1)[0])


# -- CumSum ----------------------------------------------------------------------------

@converter("CumSum", since=11)
def cumsum(node: NodeContext, x: Any, axis: Any) -> Any:
    """The axis (a 0-d or one-element int tensor) must be known when the model loads: it is the op's attribute."""
    rank = dims_of(x)
    axis_value = one_integer(node, axis, "axis")
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
        offset = one_integer(node, k, "k")
    rank = dims_of(x)
    if rank != UNKNOWN_RANK and len(rank) < 2:
        raise node.error(f"input 'input' has rank {len(rank)}; Trilu needs rank >= 2")
    return ops.trilu(x, upper=bool(node.attr("upper", 1)), k=offset)


# -- Range, EyeLike ----------------------------------------------------------------------

def range_scalar(node: NodeContext, value: Any, name: str) -> Any:
    if not isinstance(value, np.ndarray):
        raise node.unknown(f"input '{name}' must be known when the model is loaded (an initializer, a Constant or "
                         "computed from them): the length of Range's output depends on its value, and opforge "
                         "graphs have shapes fixed by their inputs' shapes; it is computed at run time")
    if value.size != 1:
        raise node.error(f"input '{name}' must be a scalar; it has shape {list(value.shape)}")
    return value.reshape(())


@converter("Range", since=11)
def range_(node: NodeContext, start: Any, limit: Any, delta: Any) -> Any:
    """A constant: start + i * delta for i below max(ceil((limit - start) / delta), 0).  Integers are
    computed exactly; floats in float64 (float16 and bfloat16 in float32 when stash_type is FLOAT), each value
    rounded to the inputs' dtype once, as np.arange and torch.arange do (onnxruntime adds delta step by step in
    the dtype, so its later float values may differ from these in the last bits)."""
    first, last, step = (range_scalar(node, v, n) for v, n in ((start, "start"), (limit, "limit"), (delta, "delta")))
    dtype = first.dtype
    if len({first.dtype, last.dtype, step.dtype}) > 1:
        raise node.error(f"inputs have dtypes {[first.dtype.name, last.dtype.name, step.dtype.name]}; Range takes "
                         "one dtype")
    if step == 0:
        raise node.error("input 'delta' is 0; the range would never reach its limit")
    if dtype.kind in "iu":
        a, b, d = int(first), int(last), int(step)
        count = max(-((a - b) // d), 0)  # ceil((b - a) / d), exactly
        return (a + d * np.arange(count, dtype=np.int64)).astype(dtype)
    wide = np.float32 if node.attr("stash_type") == 1 and dtype.itemsize == 2 else np.float64
    a, b, d = (wide(float(v)) for v in (first, last, step))
    count = max(int(np.ceil((b - a) / d)), 0)
    return (a + np.arange(count, dtype=wide) * d).astype(dtype)


@converter("EyeLike", since=9)
def eye_like(node: NodeContext, x: Any) -> Any:
    """Ones on diagonal k of a matrix of x's shape, zeros elsewhere, in the dtype the attribute names (x's
    by default).  A constant when x's dims are known at load time; else built from x's shape at run time (row
    and column indices by exclusive cumsums of ones, compared)."""
    dims = dims_of(x)
    if dims != UNKNOWN_RANK and len(dims) != 2:
        raise node.error(f"input 'input' has rank {len(dims)}; EyeLike takes a matrix (rank 2)")
    to = node.attr("dtype")
    dtype = dtype_of(x) if to is None else onnx_dtype(to, f"{node!r}: attribute 'dtype'")
    k = int(node.attr("k", 0))
    if dims != UNKNOWN_RANK and -1 not in dims:
        return np.eye(dims[0], dims[-1], k, dtype=dtype)  # (rank 2: the first dim and the last)
    # (ones_like compares x with itself: a dtype the comparisons have no kernel for is cast first, its values
    # do not matter)
    ones = ones_like(x if dtype_of(x) in NUMERIC else ops.cast(x, dtype="float32"), "int64")
    rows = ops.cumsum(ones, axis=0, exclusive=True)
    columns = ops.cumsum(ones, axis=1, exclusive=True)
    diagonal = ops.equal(ops.add(rows, np.asarray(k, np.int64)), columns)
    return ops.cast(diagonal, dtype=dtype)


# -- bitwise ----------------------------------------------------------------------------

def bitwise(op_type: str, fn: Any, since: int) -> None:
    @converter(op_type, since=since)
    def convert(node: NodeContext, a: Any, b: Any) -> Any:
        same_dtype(node, a, b)
        return fn(a, b)

    convert.__name__ = op_type.lower()


bitwise("BitwiseAnd", ops.bitwise_and, 18)
bitwise("BitwiseOr", ops.bitwise_or, 18)
bitwise("BitwiseXor", ops.bitwise_xor, 18)


@converter("BitwiseNot", since=18)
def bitwise_not(node: NodeContext, x: Any) -> Any:
    return ops.bitwise_not(x)


@converter("BitShift", since=11)
def bit_shift(node: NodeContext, x: Any, y: Any) -> Any:
    """Unsigned integers from opset 11, signed ones (arithmetic right shifts) from 28: opforge's shifts take both."""
    same_dtype(node, x, y)
    direction = node.attr("direction")
    if direction not in ("LEFT", "RIGHT"):
        raise node.error(f"attribute 'direction' is {direction!r}; it must be 'LEFT' or 'RIGHT'")
    return (ops.left_shift if direction == "LEFT" else ops.right_shift)(x, y)
