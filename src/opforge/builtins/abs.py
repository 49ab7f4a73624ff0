"""abs: y = |x|, elementwise.

Also the home of the unary elementwise source that sqrt.py and log.py
compile with their own operation (OPFORGE_UNARY), as the binary ops share
add.py's.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.common import GPU_NUMERIC, NUMERIC, every_dtype, gpu_source, same_dtypes

if TYPE_CHECKING:
    import numpy.typing as npt

abs = opforge.op("abs(Tensor x) -> Tensor y", traits=["no_side_effect", "elementwise"],  # noqa: A001 - the op's name
                 doc="Absolute value, elementwise.")
abs.def_infer(infer.same_as(0))
abs.fuse_as("std::abs({x})")


@abs.reference
def abs_reference(x: npt.NDArray[Any]) -> npt.NDArray[Any]:
    y: npt.NDArray[Any] = np.abs(x)
    return y


@abs.grad(save=["x"])
def abs_grad(saved: Any, dy: Any) -> Any:
    # dy * sign(x): 0 at x == 0, as in NumPy's sign and PyTorch's abs.
    ops = opforge.ops
    zero = np.zeros((), saved.x.dtype)
    positive, negative = ops.greater(saved.x, zero), ops.less(saved.x, zero)
    sign = ops.sub(ops.cast(positive, dtype=dy.dtype), ops.cast(negative, dtype=dy.dtype))
    return dy * sign


UNARY_ELEMENTWISE = r"""
#include <cmath>
#include <cstdlib>

#include "custom_aot_extra.h"
#include "opforge/parallel.h"

// Ranges of this many elements or more go to opforge's threads (a source
// whose operation costs more per element may define a smaller grain).
#ifndef OPFORGE_GRAIN
#define OPFORGE_GRAIN (1 << 16)
#endif

extern "C" int Unary(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                     void *stream, void *extra) {
  const OPFORGE_T *x = static_cast<const OPFORGE_T *>(params[0]);
  OPFORGE_T *y = static_cast<OPFORGE_T *>(params[1]);
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  opforge::parallel_for(0, n, OPFORGE_GRAIN, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; i++) y[i] = OPFORGE_UNARY(x[i]);
  });
  return 0;
}
"""

# std::abs has float, double and integer overloads (the smallest integer's
# abs overflows in C++ and wraps in NumPy: keep values in range).
abs.kernel(function="Unary", code=every_dtype(UNARY_ELEMENTWISE, "Unary", NUMERIC), dtypes=[(d,) for d in NUMERIC],
           name="Abs", cflags=["-DOPFORGE_UNARY(x)=std::abs(x)"])
abs.kernel(source=gpu_source("elementwise.cu", "AbsGpu"), device="gpu", dtypes=same_dtypes(GPU_NUMERIC))
