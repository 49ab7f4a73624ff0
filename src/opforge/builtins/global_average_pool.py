"""global_average_pool: the mean over every spatial dim of an N x C x ... tensor (ONNX GlobalAveragePool).

y has x's rank, its spatial dims 1.  The kernel sums each (n, c) plane in
double; the gradient is mean's, over the spatial axes.
"""
import numpy as np

import opforge
from opforge import TensorSpec
from opforge.builtins.common import FLOATS, floating_point, known_dims
from opforge.builtins.mean import mean_grad
from opforge.spec import UNKNOWN_RANK

global_average_pool = opforge.op("global_average_pool(Tensor x) -> Tensor y", traits=["no_side_effect"],
                                 doc="ONNX GlobalAveragePool: the mean of each (n, c) plane of an N x C x ... "
                                     "tensor, keeping the spatial dims as 1.")
is_float = floating_point("global_average_pool", "x")


@global_average_pool.check
def global_average_pool_check(x):
    is_float(x)
    if x.rank is not None and x.rank < 2:
        return f"input 'x' has rank {x.rank}; global_average_pool needs N, C and spatial dims (rank >= 2)"
    return None


@global_average_pool.infer
def global_average_pool_infer(x):
    if x.rank is None:
        return TensorSpec(None, x.dtype)
    return TensorSpec(list(x.shape[:2]) + [1] * (x.rank - 2), x.dtype)


@global_average_pool.reference(fallback=True)
def global_average_pool_reference(x):
    return np.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True, dtype=np.float64).astype(x.dtype)


@global_average_pool.grad(save=["x"])
def global_average_pool_grad(saved, dy):
    dims = known_dims(saved.x)
    if dims == UNKNOWN_RANK:
        raise opforge.ShapeError("op 'global_average_pool': its gradient needs the rank of input 'x'; it is unknown")
    return mean_grad(saved, dy, axes=list(range(2, len(dims))), keep_dims=True)


global_average_pool.kernel(function="GlobalAveragePool", dtypes={"x": FLOATS}, code=r"""
#include "custom_aot_extra.h"

typedef OPFORGE_T T;

extern "C" int GlobalAveragePool(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                 void *stream, void *extra) {
  const T *x = static_cast<const T *>(params[0]);
  T *y = static_cast<T *>(params[1]);
  if (ndims[0] < 2) return 1;
  const int64_t planes = shapes[0][0] * shapes[0][1];
  int64_t size = 1;
  for (int d = 2; d < ndims[0]; d++) size *= shapes[0][d];
  for (int64_t p = 0; p < planes; p++) {
    const T *xp = x + p * size;
    double sum = 0;
    for (int64_t i = 0; i < size; i++) sum += xp[i];
    y[p] = static_cast<T>(size ? sum / size : 0.0);
  }
  return 0;
}
""")
