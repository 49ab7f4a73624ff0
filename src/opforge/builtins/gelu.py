"""gelu: y = x * Phi(x), elementwise (floating-point), Phi the standard normal CDF.

``approximate="none"`` is the exact form 0.5 * x * (1 + erf(x / sqrt(2)));
``approximate="tanh"`` the usual approximation
0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3))).  One kernel
reads the attribute; the gradient is written with opforge ops (erf, exp,
tanh), so it differentiates again.
"""
import math

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.common import FLOATS, every_dtype, floating_point
from opforge.builtins.erf import erf_reference

APPROXIMATIONS = ("none", "tanh")
SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
CUBIC = 0.044715

gelu = opforge.op('gelu(Tensor x, *, str approximate="none") -> Tensor y', traits=["no_side_effect", "elementwise"],
                  doc='Gaussian error linear unit, elementwise (floating-point): approximate "none" (erf) '
                      'or "tanh".')
gelu.def_infer(infer.same_as(0))
is_float = floating_point("gelu", "x")


@gelu.check
def gelu_check(x, *, approximate):
    is_float(x)
    if approximate not in APPROXIMATIONS:
        return f"approximate is {approximate!r}; expected one of {', '.join(map(repr, APPROXIMATIONS))}"
    return None


@gelu.reference(fallback=True)
def gelu_reference(x, *, approximate="none"):
    wide = x.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):  # -inf * 0 -> NaN, x ** 3 -> inf: as the kernel
        return (wide * gelu_cdf(wide, approximate)).astype(x.dtype)


def gelu_cdf(wide, approximate):
    if approximate == "tanh":
        return 0.5 * (1 + np.tanh(SQRT_2_OVER_PI * (wide + CUBIC * wide ** 3)))
    return 0.5 * (1 + erf_reference(wide / math.sqrt(2)))


@gelu.grad(save=["x"])
def gelu_grad(saved, dy, *, approximate):
    ops = opforge.ops
    x = saved.x

    def c(value):
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
#include <cmath>
#include <string>

#include "custom_aot_extra.h"

typedef OPFORGE_T T;

extern "C" int Gelu(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                    void *stream, void *extra_ptr) {
  AotExtra *extra = static_cast<AotExtra *>(extra_ptr);
  const T *x = static_cast<const T *>(params[0]);
  T *y = static_cast<T *>(params[1]);
  const std::string approximate = extra->Attr<std::string>("approximate");
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  if (approximate == "tanh") {
    const T k = T(0.7978845608028654), c = T(0.044715);  // sqrt(2 / pi)
    for (int64_t i = 0; i < n; i++) {
      const T v = x[i];
      y[i] = T(0.5) * v * (T(1) + std::tanh(k * (v + c * v * v * v)));
    }
  } else if (approximate == "none") {
    const T r = T(0.7071067811865476);  // 1 / sqrt(2)
    for (int64_t i = 0; i < n; i++) y[i] = T(0.5) * x[i] * (T(1) + std::erf(x[i] * r));
  } else {
    return 1;  // the op's check rejects this first
  }
  return 0;
}
"""
gelu.kernel(function="Gelu", code=every_dtype(GELU, "Gelu", FLOATS), dtypes=[(d,) for d in FLOATS])
