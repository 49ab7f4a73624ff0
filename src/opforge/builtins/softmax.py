"""softmax: y = exp(x - max) / sum(exp(x - max)) along ``axis``.

Subtracting the maximum first keeps exp from overflowing and changes nothing
mathematically.  A 0-d x counts as one element along axis 0 / -1 (y = 1),
as in PyTorch.
"""
import numpy as np

import opforge
from opforge import infer
from opforge.builtins.common import GPU_FLOATS, gpu_source, same_dtypes
from opforge.sbp import split

softmax = opforge.op("softmax(Tensor x, *, int axis=-1) -> Tensor y", traits=["no_side_effect"],
                     doc="Numerically stable softmax along one axis (floating-point inputs).")
softmax.def_infer(infer.same_as(0))


@softmax.check
def softmax_check(x, *, axis):
    # Integer inputs would otherwise reach the reference and come back truncated.
    if not x.dtype.startswith(("float", "bfloat")):
        raise opforge.DTypeError(f"op 'softmax': input 'x' has dtype {x.dtype}; softmax takes floating-point tensors")
    if x.rank is None:
        return None
    rank = max(x.rank, 1)  # a 0-d x is one element along axis 0
    if not -rank <= axis < rank:
        return f"axis {axis} is out of range for input 'x' of rank {x.rank} (valid: {-rank}..{rank - 1})"
    return None


@softmax.sbp
def softmax_sbp(x, *, axis):
    # Each slice along `axis` is normalised on its own, so any other axis splits.
    if not x.rank:  # unknown rank, or 0-d
        return []
    return [{"x": split(k), "y": split(k)} for k in range(x.rank) if k != axis % x.rank]


@softmax.reference(fallback=True)
def softmax_reference(x, *, axis):
    if x.ndim == 0:
        return np.ones_like(x)
    shifted = x - np.max(x, axis=axis, keepdims=True, initial=-np.inf)  # initial: an empty x has no max
    e = np.exp(shifted)
    return (e / np.sum(e, axis=axis, keepdims=True)).astype(x.dtype, copy=False)


@softmax.grad(save=["y"])
def softmax_grad(saved, dy, *, axis):
    y = saved.y
    dot = opforge.ops.reduce_sum(dy * y, axes=[axis], keep_dims=True)
    return y * (dy - dot)


softmax.kernel(function="Softmax", dtypes={"x": ["float32", "float64"]}, code=r"""
#include <cmath>
#include <vector>

#include "custom_aot_extra.h"

typedef OPFORGE_T T;

extern "C" int Softmax(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                       void *stream, void *extra_ptr) {
  AotExtra *extra = static_cast<AotExtra *>(extra_ptr);
  const T *x = static_cast<const T *>(params[0]);
  T *y = static_cast<T *>(params[1]);
  const int rank = ndims[0];
  int64_t axis = extra->Attr<int64_t>("axis");
  if (axis < 0) axis += rank > 0 ? rank : 1;
  if (axis < 0 || axis >= (rank > 0 ? rank : 1)) return 1;  // the op's check rejects this first

  // View x as [outer, len, inner]: the softmax runs along len, over `inner`
  // independent lanes at once, so memory is always read contiguously.
  int64_t outer = 1, len = 1, inner = 1;
  for (int d = 0; d < rank; d++) {
    if (d < axis) outer *= shapes[0][d];
    else if (d == axis) len = shapes[0][d];
    else inner *= shapes[0][d];
  }
  if (outer * len * inner == 0) return 0;  // (opforge skips empty inputs; this keeps the kernel safe alone)
  std::vector<T> top(inner), sum(inner);
  for (int64_t o = 0; o < outer; o++) {
    const T *xo = x + o * len * inner;
    T *yo = y + o * len * inner;
    for (int64_t i = 0; i < inner; i++) top[i] = xo[i];
    for (int64_t l = 1; l < len; l++)
      for (int64_t i = 0; i < inner; i++) top[i] = xo[l * inner + i] > top[i] ? xo[l * inner + i] : top[i];
    for (int64_t i = 0; i < inner; i++) sum[i] = T(0);
    for (int64_t l = 0; l < len; l++)
      for (int64_t i = 0; i < inner; i++) {
        const T e = std::exp(xo[l * inner + i] - top[i]);
        yo[l * inner + i] = e;
        sum[i] += e;
      }
    for (int64_t i = 0; i < inner; i++) sum[i] = T(1) / sum[i];
    for (int64_t l = 0; l < len; l++)
      for (int64_t i = 0; i < inner; i++) yo[l * inner + i] *= sum[i];
  }
  return 0;
}
""")
softmax.kernel(source=gpu_source("softmax.cu", "SoftmaxGpu"), device="gpu", dtypes=same_dtypes(GPU_FLOATS))
