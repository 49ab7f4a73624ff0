"""erf: y = the Gauss error function of x, elementwise (floating-point).

std::erf in the kernel; the NumPy reference has no erf of its own, so it
applies math.erf element by element (exact to double rounding).  The
gradient is dy * 2 / sqrt(pi) * e ** -(x * x).
"""
import math

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.common import FLOATS, every_dtype, floating_point

erf = opforge.op("erf(Tensor x) -> Tensor y", traits=["no_side_effect"],
                 doc="Gauss error function, elementwise (floating-point inputs).")
erf.def_infer(infer.same_as(0))
erf.check(floating_point("erf", "x"))

_ERF = np.frompyfunc(math.erf, 1, 1)


@erf.reference(fallback=True)
def erf_reference(x):
    return np.asarray(_ERF(x.astype(np.float64)), dtype=np.float64).astype(x.dtype, copy=False)


@erf.grad(save=["x"])
def erf_grad(saved, dy):
    ops = opforge.ops
    x = saved.x
    return dy * ops.mul(ops.exp(ops.neg(x * x)), np.asarray(2 / math.sqrt(math.pi), x.dtype))


ERF = r"""
#include <cmath>

#include "custom_aot_extra.h"

extern "C" int Erf(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                   void *stream, void *extra) {
  const OPFORGE_T *x = static_cast<const OPFORGE_T *>(params[0]);
  OPFORGE_T *y = static_cast<OPFORGE_T *>(params[1]);
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  for (int64_t i = 0; i < n; i++) y[i] = std::erf(x[i]);  // the float overload for float
  return 0;
}
"""
erf.kernel(function="Erf", code=every_dtype(ERF, "Erf", FLOATS), dtypes=[(d,) for d in FLOATS])
