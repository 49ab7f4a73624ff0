"""global_average_pool: the mean over every spatial dim of an N x C x ... tensor (ONNX GlobalAveragePool).

y has x's rank, its spatial dims 1.  The kernel (float32, float64; generic
and AVX2 builds) sums each (n, c) plane in vector lanes, block by block into
a double, and runs the planes on opforge's pool; the gradient is mean's, over
the spatial axes.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import TensorSpec
from opforge.builtins.common import FLOATS, HEADER_DIRS, floating_point, known_dims
from opforge.builtins.mean import mean_grad
from opforge.spec import UNKNOWN_RANK

if TYPE_CHECKING:
    import numpy.typing as npt

global_average_pool = opforge.op("global_average_pool(Tensor x) -> Tensor y", traits=["no_side_effect"],
                                 doc="ONNX GlobalAveragePool: the mean of each (n, c) plane of an N x C x ... "
                                     "tensor, keeping the spatial dims as 1.")
is_float = floating_point("global_average_pool", "x")


@global_average_pool.check
def global_average_pool_check(x: TensorSpec) -> str | None:
    is_float(x)
    if x.rank is not None and x.rank < 2:
        return f"input 'x' has rank {x.rank}; global_average_pool needs N, C and spatial dims (rank >= 2)"
    return None


@global_average_pool.infer
def global_average_pool_infer(x: TensorSpec) -> TensorSpec:
    if x.rank is None:
        return TensorSpec(None, x.dtype)
    return TensorSpec(list(x.shape[:2]) + [1] * (x.rank - 2), x.dtype)


@global_average_pool.reference(fallback=True)
def global_average_pool_reference(x: npt.NDArray[Any]) -> npt.NDArray[Any]:
    return np.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True, dtype=np.float64).astype(x.dtype)


@global_average_pool.grad(save=["x"])
def global_average_pool_grad(saved: Any, dy: Any) -> Any:
    dims = known_dims(saved.x)
    if dims == UNKNOWN_RANK:
        raise opforge.ShapeError("op 'global_average_pool': its gradient needs the rank of input 'x'; it is unknown")
    return mean_grad(saved, dy, axes=list(range(2, len(dims))), keep_dims=True)


GLOBAL_AVERAGE_POOL_CC = r"""
#include <algorithm>
#include <cstdint>
#include <limits>

#include "custom_aot_extra.h"
#include "opforge/parallel.h"

typedef OPFORGE_T T;

#include "lanes.h"

namespace {

// Planes run on opforge's pool in ranges of about this many elements.
const int64_t kParallelWork = 1 << 15;

}  // namespace

extern "C" int GlobalAveragePool(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                 void *stream, void *extra) {
  const T *x = static_cast<const T *>(params[0]);
  T *y = static_cast<T *>(params[1]);
  if (ndims[0] < 2) return 1;
  const int64_t planes = shapes[0][0] * shapes[0][1];
  int64_t size = 1;
  for (int d = 2; d < ndims[0]; d++) size *= shapes[0][d];
  if (size == 0) {  // no spatial elements: the mean of nothing, as np.mean and the reference give
    std::fill(y, y + planes, std::numeric_limits<T>::quiet_NaN());
    return 0;
  }
  try {
    opforge::parallel_for(0, planes, std::max<int64_t>(1, kParallelWork / size), [&](int64_t lo, int64_t hi) {
      for (int64_t p = lo; p < hi; p++) y[p] = static_cast<T>(LaneSum(x + p * size, size, [](auto v) { return v; }) / size);
    });
  } catch (...) {  // (the pool): nothing crosses the ABI
    return 2;
  }
  return 0;
}
"""
for _isa in (None, "avx2"):  # (its vectors are 32 bytes: AVX-512 gains nothing)
    global_average_pool.kernel(function="GlobalAveragePool", dtypes={"x": FLOATS}, isa=_isa,
                               cflags=["-Wno-psabi"], include_dirs=HEADER_DIRS,
                               code=GLOBAL_AVERAGE_POOL_CC)
del _isa
