"""relu: y = max(x, 0).

The template for a built-in op: the schema, the inference, a C++ kernel
compiled once per dtype (OPFORGE_T is the element type), and the NumPy
reference the kernel is tested against.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.common import GPU_NUMERIC, gpu_source, same_dtypes

if TYPE_CHECKING:
    import numpy.typing as npt

relu = opforge.op("relu(Tensor x) -> Tensor y", traits=["no_side_effect", "elementwise"],
                  doc="Rectified linear unit, elementwise.")
relu.def_infer(infer.same_as(0))
relu.fuse_as("{x} > T(0) || {x} != {x} ? {x} : T(0)")


@relu.reference(fallback=True)
def relu_reference(x: npt.NDArray[Any]) -> npt.NDArray[Any]:
    y: npt.NDArray[Any] = np.maximum(x, 0)
    return y.astype(x.dtype, copy=False)


@relu.grad(save=["y"])
def relu_grad(saved: Any, dy: Any) -> Any:
    return opforge.ops.relu_grad(dy, saved.y)


# One source for both layouts: elementwise work only needs the element count,
# which in nchw16c includes the channel padding.
RELU = r"""
#include "custom_aot_extra.h"
#include "opforge/parallel.h"

extern "C" int Relu(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                    void *stream, void *extra) {
  const OPFORGE_T *x = static_cast<const OPFORGE_T *>(params[0]);
  OPFORGE_T *y = static_cast<OPFORGE_T *>(params[1]);
  int64_t n = 1;
#ifdef OPFORGE_LAYOUT_NCHW16C
  if (ndims[0] != 4) return 3;
  n = shapes[0][0] * ((shapes[0][1] + 15) / 16 * 16) * shapes[0][2] * shapes[0][3];
#else
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
#endif
  // NaN (x != x) passes through, as in the reference (np.maximum).  Ranges
  // of 64K elements and more run on opforge's threads.
  opforge::parallel_for(0, n, 1 << 16, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; i++) y[i] = x[i] > OPFORGE_T(0) || x[i] != x[i] ? x[i] : OPFORGE_T(0);
  });
  return 0;
}
"""
# Selects vectorize only where g++ may evaluate both sides (no FP trap to preserve).
NO_TRAPS = ["-fno-trapping-math"]
relu.kernel(function="Relu", dtypes={"x": ["float32", "float64", "int32", "int64"]}, code=RELU, cflags=NO_TRAPS)
relu.kernel(function="Relu", dtypes={"x": ["float32", "float64"]}, layout="nchw16c", code=RELU, cflags=NO_TRAPS)
relu.kernel(source=gpu_source("elementwise.cu", "ReluGpu"), device="gpu", dtypes=same_dtypes(GPU_NUMERIC))


# The gradient is an op too (OneFlow's relu / relu_grad pair): dx = dy where y > 0.
relu_grad_op = opforge.op("relu_grad(Tensor dy, Tensor y) -> Tensor dx", traits=["no_side_effect", "elementwise"],
                          doc="Gradient of relu: dy where y > 0, else 0.")
relu_grad_op.def_infer(infer.same_as(0))


@relu_grad_op.reference(fallback=True)
def relu_grad_reference(dy: npt.NDArray[Any], y: npt.NDArray[Any]) -> npt.NDArray[Any]:
    return np.where(y > 0, dy, 0).astype(dy.dtype, copy=False)


@relu_grad_op.grad(save=["y"])
def _(saved: Any, ddx: Any) -> tuple[Any, None]:
    return opforge.ops.relu_grad(ddx, saved.y), None


relu_grad_op.kernel(function="ReluGrad", dtypes={"dy": ["float32", "float64"], "y": ["float32", "float64"]},
                    code=r"""
#include "custom_aot_extra.h"
#include "opforge/parallel.h"

extern "C" int ReluGrad(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                        void *stream, void *extra) {
  const OPFORGE_T *dy = static_cast<const OPFORGE_T *>(params[0]);
  const OPFORGE_T *y = static_cast<const OPFORGE_T *>(params[1]);
  OPFORGE_T *dx = static_cast<OPFORGE_T *>(params[2]);
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  opforge::parallel_for(0, n, 1 << 16, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; i++) {
      const OPFORGE_T g = dy[i];  // loaded either way: a blend, not a branch
      dx[i] = y[i] > OPFORGE_T(0) ? g : OPFORGE_T(0);
    }
  });
  return 0;
}
""")
