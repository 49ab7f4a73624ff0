"""Converters of ONNX's elementwise ops: arithmetic (Add Sub Mul Div Pow Mod
Sum Mean Max Min Reciprocal), activations (Relu LeakyRelu PRelu Tanh Sigmoid
HardSigmoid HardSwish Elu Selu Celu Softplus Softsign ThresholdedRelu Mish
Swish Shrink Erf Gelu Clip), unary math (Exp Log Sqrt Abs Neg Sign Floor
Ceil Round), comparisons, logic (And Or Xor Not), IsNaN, IsInf, Where,
ai.onnx.ml's Binarizer and the pass-through ops (Identity, Dropout, Cast, CastLike).

Activations opforge has no op for are built from several ops (Elu from exp,
minimum and where, ...).

Binary ops broadcast NumPy-style from opset 7; before it, ``broadcast=1``
lets the second operand match a run of the first's dims starting at
``axis``, which the converters turn into NumPy broadcasting by giving it
trailing size-1 dims.  A dtype ONNX allows but an opforge op has no kernel
or reference for (float16 for div, int8 for maximum, bool for equal, ...)
is computed in a wider dtype that holds every value exactly and cast back.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

import opforge
from ..builtins.common import known_dims
from ..graph.float16 import rounds_float32_result
from ..spec import UNKNOWN_RANK
from .load import onnx_dtype
from .registry import converter

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import numpy.typing as npt

    from ..spec import TensorSpec
    from .registry import NodeContext

_F = TypeVar("_F", bound="Callable[..., Any]")

# Tensors here are traced Values, or np.ndarrays known when the model loads: typed Any.
ops = opforge.ops
FLOATS = ("float32", "float64")
NUMERIC = FLOATS + ("int32", "int64")
# A dtype with no kernel of its own -> one that holds each of its values exactly.
WIDER = {"float16": "float32", "bfloat16": "float32", "bool": "int32", "int8": "int32", "int16": "int32",
         "uint8": "int32", "uint16": "int32", "uint32": "int64"}


def dtype_of(x: Any) -> str:
    spec: TensorSpec | None = getattr(x, "spec", None)
    return spec.dtype if spec is not None else np.asarray(x).dtype.name


dims_of = known_dims  # x's shape, -1 for its unknown dims; UNKNOWN_RANK for an unknown rank


def scalar(value: Any, like: Any) -> npt.NDArray[Any]:
    """A 0-d array of ``like``'s dtype (operands of opforge ops share one dtype)."""
    return np.asarray(value, dtype_of(like))


def widened(node: NodeContext, fn: Callable[..., Any], inputs: Sequence[Any], takes: Sequence[str],
            cast_back: bool = True) -> Any:
    """``fn(*inputs)``, computed in a wider dtype when the inputs' dtype is not in ``takes`` and cast back
    (unless ``cast_back`` is false, or the result is bool, from a comparison)."""
    dtype = dtype_of(inputs[0])
    if dtype in takes:
        return fn(*inputs)
    wider = WIDER.get(dtype)
    if wider is None or wider not in takes:
        raise node.error(f"input dtype {dtype} is not supported (supported: "
                         f"{', '.join(sorted(set(takes) | {d for d, w in WIDER.items() if w in takes}))})")
    result = fn(*(ops.cast(x, dtype=wider) if x is not None and dtype_of(x) == dtype else x for x in inputs))
    return result if not cast_back or dtype_of(result) == "bool" else rounded_back(result, dtype)


def rounded_back(result: Any, dtype: str) -> Any:
    """``result``, computed in float32 for an op on float16 or bfloat16, cast back to ``dtype``; a traced
    cast is marked as that (``graph.float16.rounds_float32_result``), so float32 readers skip it."""
    return rounds_float32_result(ops.cast(result, dtype=dtype))


def same_dtype(node: NodeContext, *inputs: Any) -> None:
    dtypes = [dtype_of(x) for x in inputs]
    if len(set(dtypes)) > 1:
        raise node.error(f"inputs have dtypes {dtypes}; the op takes one dtype")


# -- binary arithmetic --------------------------------------------------------------

def legacy_operand(node: NodeContext, a: Any, b: Any) -> Any:
    """Opsets before 7: b as NumPy broadcasting sees it.  Without ``broadcast`` the shapes must match;
    with it, b's dims line up with a's from ``axis`` on (default: a's last dims), so b gets the trailing
    size-1 dims that NumPy needs."""
    ad, bd = dims_of(a), dims_of(b)
    if not node.attr("broadcast", 0):
        if UNKNOWN_RANK in (ad, bd) or len(ad) == len(bd) and all(x == y or -1 in (x, y) for x, y in zip(ad, bd)):
            return b
        raise node.error(f"inputs of shapes {list(ad)} and {list(bd)} differ and attribute 'broadcast' is 0")
    if "axis" not in node.attrs:
        return b
    if UNKNOWN_RANK in (ad, bd):
        raise node.unknown("attribute 'axis' needs the ranks of both inputs when the model is loaded")
    axis = node.attr("axis")
    axis = axis + len(ad) if axis < 0 else axis
    trailing = len(ad) - axis - len(bd)
    if axis < 0 or trailing < 0:
        raise node.error(f"attribute 'axis' {node.attr('axis')} does not fit input B of rank {len(bd)} into input A "
                         f"of rank {len(ad)}")
    return ops.unsqueeze(b, axes=list(range(len(bd), len(bd) + trailing))) if trailing else b


def binary(op_type: str, fn: Callable[[NodeContext, Any, Any], Any], *, versions: tuple[int, int] = (1, 7)) -> None:
    """Register ``fn(node, a, b)`` for op_type: before opset 7 through ``legacy_operand``."""
    old, new = versions

    @converter(op_type, since=old)
    def legacy(node: NodeContext, a: Any, b: Any) -> Any:
        return fn(node, a, legacy_operand(node, a, b))

    @converter(op_type, since=new)
    def numpy_style(node: NodeContext, a: Any, b: Any) -> Any:
        return fn(node, a, b)

    legacy.__name__ = f"{op_type.lower()}_v{old}"
    numpy_style.__name__ = f"{op_type.lower()}_v{new}"


def add(node: NodeContext, a: Any, b: Any) -> Any:
    same_dtype(node, a, b)
    return ops.add(a, b)


def sub(node: NodeContext, a: Any, b: Any) -> Any:
    same_dtype(node, a, b)
    return ops.sub(a, b)


def mul(node: NodeContext, a: Any, b: Any) -> Any:
    same_dtype(node, a, b)
    return ops.mul(a, b)


def div(node: NodeContext, a: Any, b: Any) -> Any:
    """Integers divide truncating toward zero (as C does): in float64, then cast back."""
    same_dtype(node, a, b)
    dtype = dtype_of(a)
    if np.dtype(dtype).kind in "iub":
        if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):  # exact, whatever the magnitude
            if np.any(b == 0):
                raise node.error("integer division by zero")
            quotient = np.abs(a) // np.abs(b)
            return np.where((a < 0) != (b < 0), -quotient, quotient).astype(dtype)
        # (float64 holds integers up to 2**53 exactly; beyond, a quotient may be off by one)
        wide = ops.div(ops.cast(a, dtype="float64"), ops.cast(b, dtype="float64"))
        return ops.cast(wide, dtype=dtype)
    return widened(node, ops.div, [a, b], FLOATS)


def power(node: NodeContext, a: Any, b: Any) -> Any:
    """The result has the base's dtype; the exponent may have another (cast to the base's).  Integer
    bases are raised in float64 and cast back."""
    dtype = dtype_of(a)
    if np.dtype(dtype).kind in "iu":
        wide = ops.pow(ops.cast(a, dtype="float64"), b if dtype_of(b) == "float64" else ops.cast(b, dtype="float64"))
        return ops.cast(wide, dtype=dtype)
    if dtype_of(b) != dtype:
        b = ops.cast(b, dtype=dtype)
    return widened(node, ops.pow, [a, b], FLOATS)


binary("Add", add)
binary("Sub", sub)
binary("Mul", mul)
binary("Div", div)
binary("Pow", power)


@converter("Reciprocal", since=1)
def reciprocal(node: NodeContext, x: Any) -> Any:
    return widened(node, lambda v: ops.div(scalar(1, v), v), [x], FLOATS)


# -- variadic: Sum, Mean, Max, Min ---------------------------------------------------

@converter("Sum", since=1)
def sum_(node: NodeContext, *inputs: Any) -> Any:
    """Two inputs are an add (a residual connection, say), which a graph fuses with the elementwise ops
    around it (a relu after it); sum has no such expression, having any number of inputs."""
    same_dtype(node, *inputs)
    return ops.add(*inputs) if len(inputs) == 2 else ops.sum(*inputs)


@converter("Mean", since=1)
def mean(node: NodeContext, *inputs: Any) -> Any:
    same_dtype(node, *inputs)
    total = ops.sum(*inputs)
    return widened(node, lambda t: ops.div(t, scalar(len(inputs), t)), [total], FLOATS)


def folded(node: NodeContext, fn: Callable[[Any, Any], Any], inputs: Sequence[Any]) -> Any:
    same_dtype(node, *inputs)
    if len(inputs) == 1:
        return ops.sum(inputs[0])  # a copy, as the other results are
    result = inputs[0]
    for x in inputs[1:]:
        if dtype_of(x) == "uint64":
            result = unsigned_extreme(result, x, largest=fn is ops.maximum)
        else:
            result = widened(node, fn, [result, x], NUMERIC)
    return result


# uint64 has no wider dtype: its values are compared as int64 (the same bits), where a comparison of two
# values on either side of 2**63 comes out inverted.

def unsigned_less(a: Any, b: Any) -> Any:
    """a < b for uint64 tensors (bool)."""
    sa, sb = ops.cast(a, dtype="int64"), ops.cast(b, dtype="int64")
    zero = np.zeros((), np.int64)
    signed = ops.cast(ops.less(sa, sb), dtype="int32")
    straddle = ops.not_equal(ops.cast(ops.less(sa, zero), dtype="int32"), ops.cast(ops.less(sb, zero), dtype="int32"))
    return ops.not_equal(signed, ops.cast(straddle, dtype="int32"))


def unsigned_extreme(a: Any, b: Any, largest: bool) -> Any:
    pick_b = unsigned_less(a, b) if largest else unsigned_less(b, a)
    chosen = ops.where(pick_b, ops.cast(b, dtype="int64"), ops.cast(a, dtype="int64"))
    return ops.cast(chosen, dtype="uint64")


def unsigned_compare(op_type: str, a: Any, b: Any) -> Any:
    if op_type == "Equal":
        return ops.equal(ops.cast(a, dtype="int64"), ops.cast(b, dtype="int64"))
    if op_type in ("Less", "GreaterOrEqual"):
        result = unsigned_less(a, b)
    else:
        result = unsigned_less(b, a)
    if op_type in ("GreaterOrEqual", "LessOrEqual"):
        result = ops.equal(ops.cast(result, dtype="int32"), np.zeros((), np.int32))
    return result


@converter("Max", since=1)
def max_(node: NodeContext, *inputs: Any) -> Any:
    return folded(node, ops.maximum, inputs)


@converter("Min", since=1)
def min_(node: NodeContext, *inputs: Any) -> Any:
    return folded(node, ops.minimum, inputs)


# -- unary math and activations -----------------------------------------------------

def unary(op_type: str, fn: Callable[[Any], Any], takes: Sequence[str] | None = None,
          since: int = 1) -> Callable[[NodeContext, Any], Any]:
    """Register a one-input converter calling the opforge op ``fn`` (widening dtypes outside ``takes``)."""
    @converter(op_type, since=since)
    def convert(node: NodeContext, x: Any) -> Any:
        return fn(x) if takes is None else widened(node, fn, [x], takes)

    convert.__name__ = op_type.lower()
    return convert


unary("Relu", ops.relu)  # relu, exp, tanh, neg: their references take every dtype
unary("Exp", ops.exp)
unary("Tanh", ops.tanh)
unary("Neg", ops.neg)
unary("Sigmoid", ops.sigmoid)
unary("Erf", ops.erf)
unary("Sqrt", ops.sqrt, FLOATS)
unary("Log", ops.log, FLOATS)
unary("Abs", ops.abs, NUMERIC)


# Floor, Ceil, Round (half to even): exact, in float64.  |v| >= 2**52 is an integer already; below, the
# int64 cast truncates toward zero exactly, and v + 0.5 is exact.  Infinities and NaN pass through.

def rounding(op_type: str, rule: Callable[[Any], Any]) -> None:
    @converter(op_type, since=1)
    def convert(node: NodeContext, x: Any) -> Any:
        dtype = dtype_of(x)
        if dtype not in FLOATS + ("float16", "bfloat16"):
            raise node.error(f"input 'X' has dtype {dtype}; {op_type} takes floating-point tensors")
        v = x if dtype == "float64" else ops.cast(x, dtype="float64")
        small = ops.less(ops.abs(v), scalar(2.0 ** 52, v))  # false for inf and NaN
        # the rule sees only the small values (0 elsewhere: no int64 cast out of range); elsewhere v itself
        result = ops.where(small, rule(ops.where(small, v, scalar(0, v))), v)
        return result if dtype == "float64" else ops.cast(result, dtype=dtype)

    convert.__name__ = op_type.lower()


def trunc(v: Any) -> Any:
    return ops.cast(ops.cast(v, dtype="int64"), dtype="float64")


def floor(v: Any) -> Any:
    t = trunc(v)
    return ops.sub(t, ops.cast(ops.greater(t, v), dtype="float64"))


def ceil(v: Any) -> Any:
    t = trunc(v)
    return ops.add(t, ops.cast(ops.less(t, v), dtype="float64"))


def round_half_even(v: Any) -> Any:
    nearest = floor(ops.add(v, scalar(0.5, v)))
    tie = ops.equal(ops.sub(nearest, v), scalar(0.5, v))
    odd = ops.equal(ops.sub(nearest, ops.mul(floor(ops.mul(nearest, scalar(0.5, v))), scalar(2, v))), scalar(1, v))
    return ops.sub(nearest, ops.cast(ops.where(tie, odd, np.zeros((), bool)), dtype="float64"))


rounding("Floor", floor)
rounding("Ceil", ceil)
rounding("Round", round_half_even)


@converter("Mod", since=10)
def mod(node: NodeContext, a: Any, b: Any) -> Any:
    """opforge's mod: fmod=0 is Python's % (the sign of b), fmod=1 C's fmod (the sign of a)."""
    same_dtype(node, a, b)
    return ops.mod(a, b, fmod=bool(node.attr("fmod", 0)))


@converter("LeakyRelu", since=1)
def leaky_relu(node: NodeContext, x: Any) -> Any:
    return ops.leaky_relu(x, alpha=node.attr("alpha", 0.01))


@converter("HardSigmoid", since=1)
def hard_sigmoid(node: NodeContext, x: Any) -> Any:
    return ops.hard_sigmoid(x, alpha=node.attr("alpha", 0.2), beta=node.attr("beta", 0.5))


def composite(op_type: str, since: int = 1) -> Callable[[_F], _F]:
    """Register ``fn(node, x)``, built from several opforge ops, for op_type; float16 and bfloat16
    inputs are computed in float32 (every op involved has a kernel there) and cast back."""
    def register(fn: _F) -> _F:
        @converter(op_type, since=since)
        def convert(node: NodeContext, x: Any, *rest: Any) -> Any:
            return widened(node, lambda v, *r: fn(node, v, *r), [x, *rest], FLOATS)

        convert.__name__ = fn.__name__
        return fn

    return register


@composite("HardSwish", since=14)
def hard_swish(node: NodeContext, x: Any) -> Any:
    return ops.mul(x, ops.hard_sigmoid(x, alpha=1 / 6, beta=0.5))


@converter("Gelu", since=20)
def gelu(node: NodeContext, x: Any) -> Any:
    approximate = node.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise node.error(f"attribute 'approximate' is {approximate!r}; supported: 'none', 'tanh'")
    return ops.gelu(x, approximate=approximate)


@composite("PRelu", since=1)
def prelu(node: NodeContext, x: Any, slope: Any) -> Any:
    """x where x >= 0, slope * x elsewhere; slope broadcasts to x (before opset 7, along x's dims from 1)."""
    if node.opset < 7:
        xd, sd = dims_of(x), dims_of(slope)
        if xd != UNKNOWN_RANK and sd != UNKNOWN_RANK and len(sd) == 1 and len(xd) > 2:
            slope = ops.unsqueeze(slope, axes=list(range(1, len(xd) - 1)))  # one slope per channel
    zero = scalar(0, x)
    return ops.where(ops.less(x, zero), ops.mul(x, slope), x)


def exponential_linear(x: Any, alpha: float) -> Any:
    """x where x > 0, alpha * (e^x - 1) elsewhere (e^min(x, 0): no overflow on the side not taken)."""
    negative = ops.mul(ops.sub(ops.exp(ops.minimum(x, scalar(0, x))), scalar(1, x)), scalar(alpha, x))
    return ops.where(ops.greater(x, scalar(0, x)), x, negative)


@composite("Elu", since=1)
def elu(node: NodeContext, x: Any) -> Any:
    return exponential_linear(x, node.attr("alpha", 1.0))


@composite("Selu", since=1)
def selu(node: NodeContext, x: Any) -> Any:
    alpha = node.attr("alpha", 1.67326319217681884765625)
    gamma = node.attr("gamma", 1.05070102214813232421875)
    return ops.mul(exponential_linear(x, alpha), scalar(gamma, x))


@composite("Celu", since=12)
def celu(node: NodeContext, x: Any) -> Any:
    alpha = node.attr("alpha", 1.0)
    scaled = ops.div(ops.minimum(x, scalar(0, x)), scalar(alpha, x))
    negative = ops.mul(ops.sub(ops.exp(scaled), scalar(1, x)), scalar(alpha, x))
    return ops.add(ops.maximum(x, scalar(0, x)), ops.minimum(scalar(0, x), negative))


@composite("Softplus", since=1)
def softplus(node: NodeContext, x: Any) -> Any:
    # log(1 + e^x) = max(x, 0) + log(1 + e^-|x|): no overflow for large x
    tail = ops.log(ops.add(ops.exp(ops.neg(ops.abs(x))), scalar(1, x)))
    return ops.add(ops.maximum(x, scalar(0, x)), tail)


@composite("Softsign", since=1)
def softsign(node: NodeContext, x: Any) -> Any:
    return ops.div(x, ops.add(ops.abs(x), scalar(1, x)))


@composite("ThresholdedRelu", since=10)
def thresholded_relu(node: NodeContext, x: Any) -> Any:
    return ops.where(ops.greater(x, scalar(node.attr("alpha", 1.0), x)), x, scalar(0, x))


@composite("Mish", since=18)
def mish(node: NodeContext, x: Any) -> Any:
    return ops.mul(x, ops.tanh(softplus(node, x)))


@composite("Swish", since=24)
def swish(node: NodeContext, x: Any) -> Any:
    return ops.mul(x, ops.sigmoid(ops.mul(x, scalar(node.attr("alpha", 1.0), x))))


@composite("Shrink", since=9)
def shrink(node: NodeContext, x: Any) -> Any:
    """x + bias below -lambd, x - bias above lambd, 0 between."""
    lambd, bias = node.attr("lambd", 0.5), node.attr("bias", 0.0)
    zero = scalar(0, x)
    above = ops.where(ops.greater(x, scalar(lambd, x)), ops.sub(x, scalar(bias, x)), zero)
    return ops.where(ops.less(x, scalar(-lambd, x)), ops.add(x, scalar(bias, x)), above)


@converter("Sign", since=9)
def sign(node: NodeContext, x: Any) -> Any:
    def fn(v: Any) -> Any:
        zero = scalar(0, v)
        positive = ops.cast(ops.greater(v, zero), dtype=dtype_of(v))
        result = ops.sub(positive, ops.cast(ops.less(v, zero), dtype=dtype_of(v)))
        return ops.where(ops.not_equal(v, v), v, result) if dtype_of(v) in FLOATS else result  # NaN stays NaN

    return widened(node, fn, [x], NUMERIC)


# -- Clip -----------------------------------------------------------------------------

def clipped(node: NodeContext, x: Any, low: Any, high: Any) -> Any:
    """x clipped to [low, high] (None: unbounded).  Bounds known at load time become clip's attributes;
    in float64, bounds a 32-bit float cannot hold exactly, and bounds known only at run time, clip
    through maximum / minimum instead, exactly."""
    bounds: dict[str, npt.NDArray[Any]] = {}
    runtime = False
    for name, bound in (("min", low), ("max", high)):
        if bound is None:
            continue
        if not isinstance(bound, np.ndarray):
            runtime = True
            continue
        if bound.size != 1:
            raise node.error(f"input '{name}' must be a scalar; it has shape {list(bound.shape)}")
        bounds[name] = bound.reshape(())
    dtype = dtype_of(x)
    exact = all(np.float32(v) == v for v in bounds.values()) or dtype != "float64"
    if not runtime and exact:
        return ops.clip(x, **{name: float(v) for name, v in bounds.items()})
    result = x
    if low is not None:
        result = widened(node, ops.maximum, [result, ops.cast(low, dtype=dtype)], NUMERIC)
    if high is not None:
        result = widened(node, ops.minimum, [result, ops.cast(high, dtype=dtype)], NUMERIC)
    return result


@converter("Clip", since=1)
def clip_v1(node: NodeContext, x: Any) -> Any:
    low, high = node.attr("min"), node.attr("max")
    return ops.clip(x, **{k: v for k, v in (("min", low), ("max", high)) if v is not None})


@converter("Clip", since=11)
def clip_v11(node: NodeContext, x: Any, low: Any = None, high: Any = None) -> Any:
    return clipped(node, x, low, high)


# -- comparisons and Where -------------------------------------------------------------

def comparison(op_type: str, fn: Callable[[Any, Any], Any], since: int = 1) -> None:
    def compare(node: NodeContext, a: Any, b: Any) -> Any:
        same_dtype(node, a, b)
        if dtype_of(a) == "uint64":
            return unsigned_compare(op_type, a, b)
        return widened(node, fn, [a, b], NUMERIC)

    binary(op_type, compare, versions=(since, max(since, 7)))


comparison("Equal", ops.equal)
comparison("Less", ops.less)
comparison("Greater", ops.greater)
comparison("LessOrEqual", ops.less_equal, since=12)
comparison("GreaterOrEqual", ops.greater_equal, since=12)


@converter("Binarizer", domain="ai.onnx.ml", since=1)
def binarizer(node: NodeContext, x: Any) -> Any:
    """1 where x > threshold (default 0), else 0, in x's dtype."""
    def fn(v: Any) -> Any:
        return ops.cast(ops.greater(v, scalar(node.attr("threshold", 0.0), v)), dtype=dtype_of(v))

    return widened(node, fn, [x], NUMERIC)


# -- logic ---------------------------------------------------------------------------------------

def logical(node: NodeContext, *inputs: Any) -> None:
    for k, x in enumerate(inputs):
        if dtype_of(x) != "bool":
            raise node.error(f"input {k} has dtype {dtype_of(x)}; {node.op_type} takes bool tensors")


def and_(node: NodeContext, a: Any, b: Any) -> Any:
    logical(node, a, b)
    return ops.where(a, b, np.zeros((), bool))


def or_(node: NodeContext, a: Any, b: Any) -> Any:
    logical(node, a, b)
    return ops.where(a, np.ones((), bool), b)


def xor(node: NodeContext, a: Any, b: Any) -> Any:
    logical(node, a, b)
    return widened(node, ops.not_equal, [a, b], NUMERIC)


binary("And", and_)
binary("Or", or_)
binary("Xor", xor)


@converter("Not", since=1)
def not_(node: NodeContext, x: Any) -> Any:
    logical(node, x)
    return ops.where(x, np.zeros((), bool), np.ones((), bool))


@converter("IsNaN", since=9)
def is_nan(node: NodeContext, x: Any) -> Any:
    return widened(node, lambda v: ops.not_equal(v, v), [x], FLOATS)


@converter("IsInf", since=10)
def is_inf(node: NodeContext, x: Any) -> Any:
    positive, negative = node.attr("detect_positive", 1), node.attr("detect_negative", 1)

    def fn(v: Any) -> Any:
        found = None
        for wanted, value in ((positive, np.inf), (negative, -np.inf)):
            if wanted:
                hit = ops.equal(v, scalar(value, v))
                found = hit if found is None else ops.where(found, np.ones((), bool), hit)
        return found if found is not None else ops.less(v, v)  # (detecting neither: false everywhere)

    return widened(node, fn, [x], FLOATS)


@converter("Where", since=9)
def where(node: NodeContext, condition: Any, x: Any, y: Any) -> Any:
    same_dtype(node, x, y)
    if dtype_of(condition) != "bool":
        raise node.error(f"input 'condition' has dtype {dtype_of(condition)}; it must be bool")
    return widened(node, lambda a, b: ops.where(condition, a, b), [x, y], NUMERIC + ("bool",))


# -- Identity, Dropout, Cast ----------------------------------------------------------

@converter("Identity", since=1)
def identity(node: NodeContext, x: Any) -> Any:
    return x


def ones_like(x: Any, dtype: str) -> Any:
    """Ones (True for bool) of x's shape, known now or only at run time."""
    dims = dims_of(x)
    if dims != UNKNOWN_RANK and -1 not in dims:
        return np.ones(dims, dtype)
    zero = ops.cast(ops.less(x, x), dtype="int32")  # x < x: false everywhere, NaN included
    return ops.cast(ops.equal(zero, zero), dtype=dtype)


@converter("Dropout", since=1)
def dropout(node: NodeContext, x: Any, ratio: Any = None, training_mode: Any = None) -> Any:
    """Inference: the identity; the optional mask is all ones (bool from opset 10, x's dtype before).
    Training mode (a constant True from opset 12) with a non-zero ratio is refused."""
    if training_mode is not None:
        training = bool(np.asarray(node.constant(training_mode, "input 'training_mode'")).reshape(-1)[0])
        rate = 0.5 if ratio is None else float(np.asarray(node.constant(ratio, "input 'ratio'")).reshape(-1)[0])
        if training and rate != 0:
            raise node.error(f"training_mode is true with ratio {rate}: opforge runs dropout in inference mode "
                             "only (random masks are not supported)")
    if node.num_outputs < 2:
        return x
    return x, ones_like(x, "bool" if node.opset >= 10 else dtype_of(x))


@converter("Cast", since=1)
def cast(node: NodeContext, x: Any) -> Any:
    to = node.attr("to")
    if to is None:
        raise node.error("attribute 'to' is required")
    if isinstance(to, str):  # opset 1-5 name the type: "FLOAT", "INT64", ...
        import onnx

        if to.upper() not in onnx.TensorProto.DataType.keys():
            raise node.error(f"attribute 'to' names {to!r}, which is not an ONNX tensor type")
        to = onnx.TensorProto.DataType.Value(to.upper())
    dtype = onnx_dtype(to, f"{node!r}: attribute 'to'")
    return x if dtype_of(x) == dtype else ops.cast(x, dtype=dtype)


@converter("CastLike", since=15)
def cast_like(node: NodeContext, x: Any, target: Any) -> Any:

    dtype = dtype_of(target)
    return x if dtype_of(x) == dtype else ops.cast(x, dtype=dtype)
