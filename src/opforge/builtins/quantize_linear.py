"""quantize_linear and dequantize_linear: linear quantization to 8- and 16-bit integers and back (ONNX
QuantizeLinear / DequantizeLinear).

    quantize_linear:   y = saturate(round_half_even(x / scale) + zero_point)   (y has zero_point's dtype)
    dequantize_linear: y = (x - zero_point) * scale                             (y has scale's dtype)

scale and zero_point share one shape, which sets the granularity: one
element (per tensor); a vector as long as x's dim ``axis`` (per axis:
a channel's scale); or x's shape with dim ``axis`` replaced by
``ceil(x.shape[axis] / block_size)`` (blocked: each scale covers
``block_size`` consecutive elements along the axis).  quantize_linear
divides in x's dtype (float32 or float64), rounds half to even and
saturates to zero_point's dtype (int8, uint8, int16, uint16); a NaN gives
the zero point.  dequantize_linear takes int8, uint8, int16, uint16 or
int32 and subtracts the zero point exactly before scaling.

Both are one pass over x on opforge's threads (quantize_linear.cc, one
library for every dtype pair).  They have no gradient: rounding is flat
almost everywhere, and dequantize's input is an integer.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import TensorSpec

if TYPE_CHECKING:
    import numpy.typing as npt

QUANTIZED = ("int8", "uint8", "int16", "uint16")  # what quantize_linear produces
DEQUANTIZABLE = QUANTIZED + ("int32",)  # what dequantize_linear reads (int32: accumulators)
SCALES = ("float32", "float64")

QUANT_ATTRS = "int axis=1, int block_size=0"
quantize_linear = opforge.op(
    f"quantize_linear(Tensor x, Tensor scale, Tensor zero_point, *, {QUANT_ATTRS}) -> Tensor y",
    traits=["no_side_effect", "no_grad"],
    doc="Linear quantization: saturate(round_half_even(x / scale) + zero_point) in zero_point's dtype "
        "(int8, uint8, int16, uint16); scale and zero_point per tensor, per axis or per block of the axis.")
dequantize_linear = opforge.op(
    f"dequantize_linear(Tensor x, Tensor scale, Tensor zero_point, *, {QUANT_ATTRS}) -> Tensor y",
    traits=["no_side_effect", "no_grad"],
    doc="Linear dequantization: (x - zero_point) * scale in scale's dtype; x int8, uint8, int16, uint16 or "
        "int32; scale and zero_point per tensor, per axis or per block of the axis.")


def granularity_problem(op_name: str, x: TensorSpec, scale: TensorSpec, zero_point: TensorSpec, axis: int,
                        block_size: int) -> str | None:
    """Why scale / zero_point do not quantize x (None when they do, or when the shapes are not known enough)."""
    if block_size < 0:
        return f"attribute 'block_size' is {block_size}; it is 0 (per tensor or per axis) or a block length >= 1"
    if scale.rank is None or zero_point.rank is None:
        return None
    if scale.rank != zero_point.rank or any(a != b and -1 not in (a, b)
                                            for a, b in zip(scale.shape, zero_point.shape)):
        return (f"inputs 'scale' {list(scale.shape)} and 'zero_point' {list(zero_point.shape)} must have one "
                "shape")
    if scale.rank == 0 or (scale.rank == 1 and scale.shape[0] == 1):
        return None  # per tensor
    if x.rank is None:
        return None
    if not -x.rank <= axis < x.rank:
        return f"axis {axis} is out of range for input 'x' of rank {x.rank} (valid: {-x.rank}..{x.rank - 1})"
    axis %= x.rank
    dim = x.shape[axis]
    if block_size == 0:
        if scale.rank != 1:
            return (f"input 'scale' has shape {list(scale.shape)}: per-axis scales are a vector (blocked ones, "
                    "x's rank, need attribute 'block_size' >= 1)")
        if -1 not in (dim, scale.shape[0]) and scale.shape[0] != dim:
            return (f"input 'scale' has {scale.shape[0]} elements; per-axis quantization along axis {axis} of "
                    f"input 'x' {list(x.shape)} needs {dim}")
        return None
    want = list(x.shape)
    want[axis] = -1 if dim < 0 else -(-dim // block_size)
    if scale.rank != x.rank or any(a != b and -1 not in (a, b) for a, b in zip(scale.shape, want)):
        return (f"input 'scale' has shape {list(scale.shape)}; blocks of {block_size} along axis {axis} of input "
                f"'x' {list(x.shape)} need {want}")
    return None


@quantize_linear.check
def quantize_linear_check(x: TensorSpec, scale: TensorSpec, zero_point: TensorSpec, *, axis: int,
                          block_size: int) -> str | None:
    if x.dtype not in SCALES:
        raise opforge.DTypeError(f"op 'quantize_linear': input 'x' has dtype {x.dtype}; expected float32 or "
                                 "float64 (cast it first)")
    if scale.dtype != x.dtype:
        raise opforge.DTypeError(f"op 'quantize_linear': input 'scale' has dtype {scale.dtype}, 'x' has "
                                 f"{x.dtype}; they must match")
    if zero_point.dtype not in QUANTIZED:
        raise opforge.DTypeError(f"op 'quantize_linear': input 'zero_point' has dtype {zero_point.dtype}; expected "
                                 f"one of {', '.join(QUANTIZED)} (it sets y's dtype)")
    return granularity_problem("quantize_linear", x, scale, zero_point, axis, block_size)


@dequantize_linear.check
def dequantize_linear_check(x: TensorSpec, scale: TensorSpec, zero_point: TensorSpec, *, axis: int,
                            block_size: int) -> str | None:
    if x.dtype not in DEQUANTIZABLE:
        raise opforge.DTypeError(f"op 'dequantize_linear': input 'x' has dtype {x.dtype}; expected one of "
                                 f"{', '.join(DEQUANTIZABLE)}")
    if zero_point.dtype != x.dtype:
        raise opforge.DTypeError(f"op 'dequantize_linear': input 'zero_point' has dtype {zero_point.dtype}, 'x' "
                                 f"has {x.dtype}; they must match")
    if scale.dtype not in SCALES:
        raise opforge.DTypeError(f"op 'dequantize_linear': input 'scale' has dtype {scale.dtype}; expected float32 "
                                 "or float64 (it sets y's dtype)")
    return granularity_problem("dequantize_linear", x, scale, zero_point, axis, block_size)


@quantize_linear.infer
def quantize_linear_infer(x: TensorSpec, scale: TensorSpec, zero_point: TensorSpec, *, axis: int,
                          block_size: int) -> TensorSpec:
    return TensorSpec(x.shape, zero_point.dtype)


@dequantize_linear.infer
def dequantize_linear_infer(x: TensorSpec, scale: TensorSpec, zero_point: TensorSpec, *, axis: int,
                            block_size: int) -> TensorSpec:
    return TensorSpec(x.shape, scale.dtype)


def spread(v: npt.NDArray[Any], x: npt.NDArray[Any], axis: int, block_size: int) -> npt.NDArray[Any]:
    """A scale or zero point broadcast against x: per tensor, per axis or per block."""
    if v.ndim == 0 or (v.ndim == 1 and v.size == 1):
        return v.reshape(())
    axis %= x.ndim
    if block_size == 0:
        return v.reshape((-1,) + (1,) * (x.ndim - axis - 1))
    return np.take(np.repeat(v, block_size, axis=axis), np.arange(x.shape[axis]), axis=axis)


@quantize_linear.reference(fallback=True)  # (every input its check accepts has a kernel)
def quantize_linear_reference(x: npt.NDArray[Any], scale: npt.NDArray[Any], zero_point: npt.NDArray[Any], *,
                              axis: int, block_size: int) -> npt.NDArray[Any]:
    info = np.iinfo(zero_point.dtype)
    with np.errstate(all="ignore"):
        q = np.rint(x / spread(scale, x, axis, block_size))
        q = np.where(np.isnan(q), 0, q) + spread(zero_point, x, axis, block_size)
    y: npt.NDArray[Any] = np.clip(q, info.min, info.max).astype(zero_point.dtype)
    return y


@dequantize_linear.reference(fallback=True)
def dequantize_linear_reference(x: npt.NDArray[Any], scale: npt.NDArray[Any], zero_point: npt.NDArray[Any], *,
                                axis: int, block_size: int) -> npt.NDArray[Any]:
    difference = x.astype(np.int64) - spread(zero_point, x, axis, block_size).astype(np.int64)
    y: npt.NDArray[Any] = difference.astype(scale.dtype) * spread(scale, x, axis, block_size)
    return y.astype(scale.dtype, copy=False)


_SOURCE = str(Path(__file__).with_name("quantize_linear.cc"))
# -fno-trapping-math: the clamps become vector min/max.  quantize_linear is bound by its division, so it
# has an AVX2 build too (twice the lanes).
for _isa in (None, "avx2"):
    quantize_linear.kernel(source=_SOURCE, function="QuantizeLinear", cflags=["-fno-trapping-math"], isa=_isa,
                           dtypes=[(x, x, q) for x in SCALES for q in QUANTIZED])
dequantize_linear.kernel(source=_SOURCE, function="DequantizeLinear", cflags=["-fno-trapping-math"],
                         dtypes=[(q, t, q) for q in DEQUANTIZABLE for t in SCALES])


# -- dynamic_quantize_linear: the scale and zero point taken from x's range ------------------------------

dynamic_quantize_linear = opforge.op(
    "dynamic_quantize_linear(Tensor x) -> (Tensor y, Tensor y_scale, Tensor y_zero_point)",
    traits=["no_side_effect", "no_grad", "always_compute"],  # an empty x still has a scale and zero point
    doc="Quantize float32 x to uint8 over its range widened to hold 0: y_scale = (max - min) / 255 (1 / 255 "
        "when max == min), y_zero_point = saturate(round(-min / y_scale)), y = quantize_linear(x, ...).")


@dynamic_quantize_linear.check
def dynamic_quantize_linear_check(x: TensorSpec) -> None:
    if x.dtype != "float32":
        raise opforge.DTypeError(f"op 'dynamic_quantize_linear': input 'x' has dtype {x.dtype}; expected float32")


@dynamic_quantize_linear.infer
def dynamic_quantize_linear_infer(x: TensorSpec) -> tuple[TensorSpec, TensorSpec, TensorSpec]:
    return TensorSpec(x.shape, "uint8"), TensorSpec((), "float32"), TensorSpec((), "uint8")


@dynamic_quantize_linear.reference(fallback=True)
def dynamic_quantize_linear_reference(x: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], ...]:
    finite = x[~np.isnan(x)]
    low = np.float32(min(0.0, finite.min())) if finite.size else np.float32(0)
    high = np.float32(max(0.0, finite.max())) if finite.size else np.float32(0)
    scale = np.float32(np.float32(1) if high == low else high - low) / np.float32(255)
    zero_point = quantize_linear_reference(-low, scale, np.uint8(0), axis=1, block_size=0)
    y = quantize_linear_reference(x, scale, zero_point, axis=1, block_size=0)
    return y, np.asarray(scale, np.float32), np.asarray(zero_point, np.uint8)


for _isa in (None, "avx2"):  # (the quantization pass divides, as quantize_linear does)
    dynamic_quantize_linear.kernel(source=_SOURCE, function="DynamicQuantizeLinear", cflags=["-fno-trapping-math"],
                                   dtypes={"x": ["float32"]}, isa=_isa)
