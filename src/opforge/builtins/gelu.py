"""gelu: y = x * Phi(x), elementwise (floating-point), Phi the standard normal CDF.

``approximate="none"`` is the exact form 0.5 * x * (1 + erf(x / sqrt(2)));
``approximate="tanh"`` the usual approximation
0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3))).  One kernel
reads the attribute; the gradient is written with opforge ops (erf, exp,
tanh), so it differentiates again.

The CPU kernel uses vecmath.h (compiled per float dtype and instruction set,
split across opforge's thread pool, as exp's): "none" is x Phi(x) with Phi
from erf above 0 and from erfc below (no cancellation in the negative tail),
"tanh" is the same formula written x sigmoid(2 sqrt(2 / pi) (x + 0.044715
x^3)), which does not cancel either.

Accuracy (max error over a dense sweep of the whole range, against float64
for float32 and mpmath for float64; every ISA variant): "none" float32 <= 8
ulp, float64 <= 6 ulp; "tanh" <= 32 ulp for x >= -4 (float32 and float64):
the rounding of the tanh argument u (a few ulp) is amplified about |u|
times where the result is small, as in any evaluation of the formula at the
input's precision, so over the whole range float32 <= 256 ulp and float64
<= 2048 ulp (in the far negative tail).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.common import SIMD_ISAS, floating_point
from opforge.builtins.erf import erf_reference
from opforge.builtins.exp import VECMATH

if TYPE_CHECKING:
    import numpy.typing as npt

    from opforge import TensorSpec

APPROXIMATIONS = ("none", "tanh")
SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
CUBIC = 0.044715

gelu = opforge.op('gelu(Tensor x, *, str approximate="none") -> Tensor y', traits=["no_side_effect", "elementwise"],
                  doc='Gaussian error linear unit, elementwise (floating-point): approximate "none" (erf) '
                      'or "tanh".')
gelu.def_infer(infer.same_as(0))
is_float = floating_point("gelu", "x")


@gelu.check
def gelu_check(x: TensorSpec, *, approximate: str) -> str | None:
    is_float(x)
    if approximate not in APPROXIMATIONS:
        return f"approximate is {approximate!r}; expected one of {', '.join(map(repr, APPROXIMATIONS))}"
    return None


@gelu.reference(fallback=True)
def gelu_reference(x: npt.NDArray[Any], *, approximate: str = "none") -> npt.NDArray[Any]:
    wide = x.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):  # -inf * 0 -> NaN, x ** 3 -> inf: as the kernel
        return (wide * gelu_cdf(wide, approximate)).astype(x.dtype)


def gelu_cdf(wide: npt.NDArray[np.float64], approximate: str) -> npt.NDArray[np.float64]:
    if approximate == "tanh":
        return 0.5 * (1 + np.tanh(SQRT_2_OVER_PI * (wide + CUBIC * wide ** 3)))
    return 0.5 * (1 + erf_reference(wide / math.sqrt(2)))


@gelu.grad(save=["x"])
def gelu_grad(saved: Any, dy: Any, *, approximate: str) -> Any:
    ops = opforge.ops
    x = saved.x

    def c(value: float) -> npt.NDArray[Any]:
        return np.asarray(value, x.dtype)

    if approximate == "tanh":  # d/dx of 0.5 x (1 + t), t = tanh(k (x + c x^3))
        t = ops.tanh(ops.mul(ops.add(x, ops.mul(x * x * x, c(CUBIC))), c(SQRT_2_OVER_PI)))
        du = ops.mul(ops.add(ops.mul(x * x, c(3 * CUBIC)), c(1.0)), c(SQRT_2_OVER_PI))
        slope = c(0.5) * (ops.add(t, c(1.0)) + x * (c(1.0) - t * t) * du)
    else:  # Phi(x) + x phi(x)
        cdf = ops.mul(ops.add(ops.erf(ops.mul(x, c(1 / math.sqrt(2)))), c(1.0)), c(0.5))
        pdf = ops.mul(ops.exp(ops.mul(x * x, c(-0.5))), c(1 / math.sqrt(2 * math.pi)))
        slope = cdf + x * pdf
    return dy * slope


GELU = r"""
#include <cstring>

#include "custom_aot_extra.h"
#include "opforge/parallel.h"
#include "vecmath.h"

extern "C" int Gelu(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                    void *stream, void *extra_ptr) {
  AotExtra *extra = static_cast<AotExtra *>(extra_ptr);
  const OPFORGE_T *x = static_cast<const OPFORGE_T *>(params[0]);
  OPFORGE_T *y = static_cast<OPFORGE_T *>(params[1]);
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  try {
    const std::string approximate = extra->Attr<std::string>("approximate");
    if (approximate != "tanh" && approximate != "none") return 1;  // the op's check rejects this first
    const bool tanh_form = approximate == "tanh";
    opforge::parallel_for(0, n, 1 << 14, [&](int64_t lo, int64_t hi) {
      if (tanh_form) vecmath::VecGeluTanh(x + lo, y + lo, hi - lo);
      else vecmath::VecGelu(x + lo, y + lo, hi - lo);
    });
  } catch (...) {  // (attribute lookup, the pool): nothing crosses the ABI
    return 2;
  }
  return 0;
}
"""
for _isa in SIMD_ISAS:
    gelu.kernel(function="Gelu", code=GELU, dtypes={"x": ["float32", "float64"]}, isa=_isa,
                include_dirs=VECMATH["include_dirs"], cflags=VECMATH["cflags"])
del _isa
