"""neg: y = -x."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.common import GPU_NUMERIC, gpu_source, same_dtypes
from opforge.sbp import partial_sum

if TYPE_CHECKING:
    import numpy.typing as npt

neg = opforge.op("neg(Tensor x) -> Tensor y", traits=["no_side_effect", "elementwise"], doc="Elementwise negation.")
neg.def_infer(infer.same_as(0))
neg.fuse_as("-{x}")
neg.sbp([{"x": partial_sum, "y": partial_sum}])  # beside the elementwise splits: -(x1 + x2) = -x1 + -x2


@neg.reference(fallback=True)
def neg_reference(x: npt.NDArray[Any]) -> npt.NDArray[Any]:
    y: npt.NDArray[Any] = np.negative(x)
    return y


@neg.grad()
def _(saved: Any, dy: Any) -> Any:
    return opforge.ops.neg(dy)


neg.kernel(function="Neg", dtypes={"x": ["float32", "float64", "int32", "int64"]}, code=r"""
#include "custom_aot_extra.h"
#include "opforge/parallel.h"

extern "C" int Neg(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                   void *stream, void *extra) {
  const OPFORGE_T *x = static_cast<const OPFORGE_T *>(params[0]);
  OPFORGE_T *y = static_cast<OPFORGE_T *>(params[1]);
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  opforge::parallel_for(0, n, 1 << 16, [&](int64_t lo, int64_t hi) {  // 64K elements and more: on opforge's threads
    for (int64_t i = lo; i < hi; i++) y[i] = -x[i];
  });
  return 0;
}
""")
neg.kernel(source=gpu_source("elementwise.cu", "NegGpu"), device="gpu", dtypes=same_dtypes(GPU_NUMERIC))
