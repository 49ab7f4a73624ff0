"""hard_sigmoid: y = max(0, min(1, alpha * x + beta)), elementwise (floating-point).

The piecewise-linear stand-in for sigmoid (ONNX HardSigmoid).  NaN stays
NaN.  alpha and beta cross the ABI as 32-bit floats, as leaky_relu's alpha
does.  The gradient is dy * alpha where the line is not clamped (0 < y < 1).
The kernel is compiled per float dtype and instruction set (the clamp a
vector min/max) and splits large arrays across opforge's thread pool.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.common import FLOATS, SIMD_ISAS, floating_point

if TYPE_CHECKING:
    import numpy.typing as npt

hard_sigmoid = opforge.op("hard_sigmoid(Tensor x, *, float alpha=0.2, float beta=0.5) -> Tensor y",
                          traits=["no_side_effect", "elementwise"],
                          doc="max(0, min(1, alpha * x + beta)), elementwise (floating-point inputs).")
hard_sigmoid.def_infer(infer.same_as(0))
hard_sigmoid.fuse_as("vecmath::AtMost(vecmath::AtLeast(T(float({alpha})) * {x} + T(float({beta})), T(0)), T(1))")
hard_sigmoid.check(floating_point("hard_sigmoid", "x"))


@hard_sigmoid.reference(fallback=True)
def hard_sigmoid_reference(x: npt.NDArray[Any], *, alpha: float = 0.2, beta: float = 0.5) -> npt.NDArray[Any]:
    # The kernels' arithmetic: alpha and beta as 32-bit floats, then in x's dtype.
    line = x.dtype.type(np.float32(alpha)) * x + x.dtype.type(np.float32(beta))
    y: npt.NDArray[Any] = np.clip(line, 0, 1)
    return y.astype(x.dtype, copy=False)


@hard_sigmoid.grad(save=["y"])
def hard_sigmoid_grad(saved: Any, dy: Any, *, alpha: float, beta: float) -> Any:
    ops = opforge.ops
    y = saved.y
    zero = np.zeros((), dy.dtype)
    inside = ops.where(ops.less(y, np.ones((), y.dtype)), dy * np.asarray(alpha, dy.dtype), zero)
    return ops.where(ops.greater(y, np.zeros((), y.dtype)), inside, zero)


HARD_SIGMOID = r"""
#include "custom_aot_extra.h"
#include "opforge/parallel.h"

extern "C" int HardSigmoid(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                           void *stream, void *extra_ptr) {
  AotExtra *extra = static_cast<AotExtra *>(extra_ptr);
  const OPFORGE_T *x = static_cast<const OPFORGE_T *>(params[0]);
  OPFORGE_T *y = static_cast<OPFORGE_T *>(params[1]);
  const OPFORGE_T alpha = extra->Attr<float>("alpha"), beta = extra->Attr<float>("beta");
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  try {
    opforge::parallel_for(0, n, 1 << 16, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; i++) {
        OPFORGE_T v = alpha * x[i] + beta;  // comparisons with NaN are false: NaN passes through
        v = v < OPFORGE_T(0) ? OPFORGE_T(0) : v;  // (two plain selects: vector max and min)
        y[i] = v > OPFORGE_T(1) ? OPFORGE_T(1) : v;
      }
    });
  } catch (...) {  // (the pool's own failures): nothing crosses the ABI
    return 2;
  }
  return 0;
}
"""
for _isa in SIMD_ISAS:
    hard_sigmoid.kernel(function="HardSigmoid", code=HARD_SIGMOID, dtypes={"x": FLOATS}, isa=_isa,
                        cflags=["-ffp-contract=off"])  # (alpha * x + beta rounded twice, as the reference)
del _isa
