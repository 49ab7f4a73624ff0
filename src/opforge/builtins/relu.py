"""relu: y = max(x, 0).

The template for a built-in op: the schema, the inference, a C++ kernel
compiled once per dtype (OPFORGE_T is the element type), and the NumPy
reference the kernel is tested against.
"""
import numpy as np

import opforge
from opforge import infer

relu = opforge.op("relu(Tensor x) -> Tensor y", traits=["no_side_effect"],
                  doc="Rectified linear unit, elementwise.")
relu.def_infer(infer.same_as(0))


@relu.reference
def relu_reference(x):
    return np.maximum(x, 0).astype(x.dtype, copy=False)


relu.kernel(function="Relu", dtypes={"x": ["float32", "float64", "int32", "int64"]}, code=r"""
#include "custom_aot_extra.h"

extern "C" int Relu(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                    void *stream, void *extra) {
  const OPFORGE_T *x = static_cast<const OPFORGE_T *>(params[0]);
  OPFORGE_T *y = static_cast<OPFORGE_T *>(params[1]);
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  for (int64_t i = 0; i < n; i++) y[i] = x[i] > OPFORGE_T(0) ? x[i] : OPFORGE_T(0);
  return 0;
}
""")
