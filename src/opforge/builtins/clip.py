"""clip: y = x limited to [min, max], elementwise.

Either bound may be left out (an infinity).  Where min > max every element
becomes max (NumPy's and ONNX's order: the lower bound first, then the
upper).  NaN stays NaN.  The kernel covers float32 and float64, whose bounds
cross the ABI as 32-bit floats (as leaky_relu's alpha does); integer and
float16 tensors run through the NumPy reference, which clips integers with
the bounds rounded inwards to integers, exactly, at any magnitude.  The
gradient passes dy where min <= x <= max.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.common import FLOATS, every_dtype

if TYPE_CHECKING:
    import numpy.typing as npt

    from opforge import TensorSpec

clip = opforge.op("clip(Tensor x, *, float min=-1e999, float max=1e999) -> Tensor y",
                  traits=["no_side_effect", "elementwise"],
                  doc="Elementwise clamp to [min, max] (infinite by default); min > max gives max everywhere.")
clip.def_infer(infer.same_as(0))
clip.fuse_as("vecmath::AtMost(vecmath::AtLeast({x}, {min}), {max})")


@clip.check
def clip_check(x: TensorSpec, *, min: float, max: float) -> str | None:  # noqa: A002 - the attributes' names
    if x.dtype == "bool":
        raise opforge.DTypeError("op 'clip': input 'x' has dtype bool; clip takes numbers")
    if math.isnan(min) or math.isnan(max):
        return f"min ({min}) and max ({max}) must not be NaN"
    return None


def integer_bounds(dtype: np.dtype[Any], low: float, high: float) -> tuple[int, int]:
    """[low, high] rounded inwards to integers inside dtype's range (Python ints: exact)."""
    info = np.iinfo(dtype)
    low = info.min if low == -math.inf else int(math.ceil(low))
    high = info.max if high == math.inf else int(math.floor(high))
    return min(max(low, info.min), info.max), min(max(high, info.min), info.max)


@clip.reference(fallback=True)
def clip_reference(x: npt.NDArray[Any], *, min: float = -math.inf,  # noqa: A002
                   max: float = math.inf) -> npt.NDArray[Any]:  # noqa: A002
    y: npt.NDArray[Any]
    if x.dtype.kind in "iu":
        low, high = integer_bounds(x.dtype, min, max)
        y = np.minimum(np.maximum(x, x.dtype.type(low)), x.dtype.type(high))
        return y
    with np.errstate(over="ignore"):  # a bound beyond float16's range is an infinity there
        low, high = x.dtype.type(min), x.dtype.type(max)
    y = np.minimum(np.maximum(x, low), high)
    return y


@clip.grad(save=["x"])
def clip_grad(saved: Any, dy: Any, *, min: float, max: float) -> Any:  # noqa: A002
    ops = opforge.ops
    x = saved.x
    zero = np.zeros((), dy.dtype)
    below_max = ops.where(ops.less_equal(x, np.asarray(max, x.dtype)), dy, zero)
    return ops.where(ops.greater_equal(x, np.asarray(min, x.dtype)), below_max, zero)


CLIP = r"""
#include "custom_aot_extra.h"
#include "opforge/parallel.h"

extern "C" int Clip(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                    void *stream, void *extra_ptr) {
  AotExtra *extra = static_cast<AotExtra *>(extra_ptr);
  const OPFORGE_T *x = static_cast<const OPFORGE_T *>(params[0]);
  OPFORGE_T *y = static_cast<OPFORGE_T *>(params[1]);
  const OPFORGE_T low = extra->Attr<float>("min"), high = extra->Attr<float>("max");
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  opforge::parallel_for(0, n, 1 << 16, [&](int64_t lo, int64_t hi) {  // 64K elements and more: on opforge's threads
    for (int64_t i = lo; i < hi; i++) {
      const OPFORGE_T v = x[i] < low ? low : x[i];  // comparisons with NaN are false: NaN passes through
      y[i] = v > high ? high : v;
    }
  });
  return 0;
}
"""
clip.kernel(function="Clip", code=every_dtype(CLIP, "Clip", FLOATS), dtypes=[(d,) for d in FLOATS],
            cflags=["-fno-trapping-math"])
