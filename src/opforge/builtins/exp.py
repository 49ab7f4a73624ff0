"""exp: y = e ** x, elementwise.

A unary float op: same shape and dtype out as in, one C++ source compiled
per float dtype (std::exp has an overload for each).
"""
import numpy as np

import opforge
from opforge import infer
from opforge.builtins.common import GPU_FLOATS, gpu_source, same_dtypes

exp = opforge.op("exp(Tensor x) -> Tensor y", traits=["no_side_effect", "elementwise"],
                 doc="Exponential, elementwise (floating-point inputs).")
exp.def_infer(infer.same_as(0))


@exp.check
def exp_check(x):
    # Without this, integer inputs would fall through to the reference and
    # come back truncated to integers.
    if not x.dtype.startswith(("float", "bfloat")):
        raise opforge.DTypeError(f"op 'exp': input 'x' has dtype {x.dtype}; exp takes floating-point tensors")


@exp.reference(fallback=True)
def exp_reference(x):
    return np.exp(x).astype(x.dtype, copy=False)


@exp.grad(save=["y"])
def exp_grad(saved, dy):
    return dy * saved.y


exp.kernel(function="Exp", dtypes={"x": ["float32", "float64"]}, code=r"""
#include <cmath>

#include "custom_aot_extra.h"

extern "C" int Exp(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                   void *stream, void *extra) {
  const OPFORGE_T *x = static_cast<const OPFORGE_T *>(params[0]);
  OPFORGE_T *y = static_cast<OPFORGE_T *>(params[1]);
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  for (int64_t i = 0; i < n; i++) y[i] = std::exp(x[i]);  // the float overload for float: no round trip via double
  return 0;
}
""")
exp.kernel(source=gpu_source("elementwise.cu", "ExpGpu"), device="gpu", dtypes=same_dtypes(GPU_FLOATS))
