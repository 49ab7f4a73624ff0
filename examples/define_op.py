"""Declare an op once -- schema, inference, a C++ kernel, a NumPy reference --
and call it through the functional API.

The C++ source is compiled on first use, once per dtype it declares, and
cached.  (opforge ships a built-in leaky_relu; this program replaces it with
its own declaration, which is exactly how a user would write one.)
"""
import numpy as np

import opforge
from opforge.runtime.dispatch import select_kernel

leaky_relu = opforge.op("leaky_relu(Tensor x, *, float alpha=0.01) -> Tensor y", replace=True)


@leaky_relu.infer
def _(x, *, alpha):
    return opforge.TensorSpec(x.shape, x.dtype)


@leaky_relu.reference
def leaky_relu_numpy(x, *, alpha):
    return np.where(x > 0, x, alpha * x).astype(x.dtype)


leaky_relu.kernel(function="LeakyRelu", dtypes={"x": ["float32", "float64"]}, code=r"""
#include "custom_aot_extra.h"

extern "C" int LeakyRelu(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                         void *stream, void *extra) {
  const OPFORGE_T *x = static_cast<const OPFORGE_T *>(params[0]);
  OPFORGE_T *y = static_cast<OPFORGE_T *>(params[1]);
  const OPFORGE_T alpha = static_cast<AotExtra *>(extra)->Attr<float>("alpha");
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  for (int64_t i = 0; i < n; i++) y[i] = x[i] > 0 ? x[i] : alpha * x[i];
  return 0;
}
""")

if __name__ == "__main__":
    x = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    y = opforge.ops.leaky_relu(x, alpha=0.2)
    kernel = select_kernel(leaky_relu, [opforge.TensorSpec.of(x)])
    print(f"selected kernel: {kernel.name}")
    print(f"matches reference: {np.allclose(y, leaky_relu_numpy(x, alpha=0.2))}")
    opforge.testing.check_op(leaky_relu, x, alpha=0.2)
    print("check_op: passed")
