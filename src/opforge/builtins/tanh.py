"""tanh: y = tanh(x), elementwise.

A unary float op: same shape and dtype out as in, one C++ source compiled
per float dtype (std::tanh has an overload for each).
"""
import numpy as np

import opforge
from opforge import infer
from opforge.builtins.common import GPU_FLOATS, gpu_source, same_dtypes

tanh = opforge.op("tanh(Tensor x) -> Tensor y", traits=["no_side_effect", "elementwise"],
                  doc="Hyperbolic tangent, elementwise (floating-point inputs).")
tanh.def_infer(infer.same_as(0))


@tanh.check
def tanh_check(x):
    # Without this, integer inputs would fall through to the reference and
    # come back truncated to integers.
    if not x.dtype.startswith(("float", "bfloat")):
        raise opforge.DTypeError(f"op 'tanh': input 'x' has dtype {x.dtype}; tanh takes floating-point tensors")


@tanh.reference(fallback=True)
def tanh_reference(x):
    return np.tanh(x).astype(x.dtype, copy=False)


@tanh.grad(save=["y"])
def tanh_grad(saved, dy):
    y = saved.y
    return dy * (np.ones((), y.dtype) - y * y)


tanh.kernel(function="Tanh", dtypes={"x": ["float32", "float64"]}, code=r"""
#include <cmath>

#include "custom_aot_extra.h"

extern "C" int Tanh(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                    void *stream, void *extra) {
  const OPFORGE_T *x = static_cast<const OPFORGE_T *>(params[0]);
  OPFORGE_T *y = static_cast<OPFORGE_T *>(params[1]);
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  for (int64_t i = 0; i < n; i++) y[i] = std::tanh(x[i]);  // the float overload for float: no round trip via double
  return 0;
}
""")
tanh.kernel(source=gpu_source("elementwise.cu", "TanhGpu"), device="gpu", dtypes=same_dtypes(GPU_FLOATS))
