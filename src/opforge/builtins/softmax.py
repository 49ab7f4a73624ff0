"""softmax: y = exp(x - max) / sum(exp(x - max)) along ``axis``.

Subtracting the maximum first keeps exp from overflowing and changes nothing
mathematically.  A 0-d x counts as one element along axis 0 / -1 (y = 1),
as in PyTorch.

The CPU kernel (per float dtype and instruction set, as exp's) runs
vecmath.h's exp: along the last axis each row takes a vectorized max, exp and
sum and one scaling; rows are split across opforge's thread pool, and a few
long rows are split by blocks instead (partial maxima and sums, combined in
block order, so the result does not depend on the thread count).  Along
another axis the softmax runs over contiguous lanes of the axes after it.

Accuracy, float32 and float64 alike: within 4 (|x - max| + 1) ulp of the
exact softmax plus the rounding of the row's sum (x - max is rounded before
exp, as in every max-shifted softmax; the sum -- 16 lanes in 4096-element
blocks along the last axis, one running sum per lane along another -- adds
up to a few tens of ulp on rows of thousands).  tests/test_kernel_accuracy.py
asserts 4 (|x - max| + 1) + 64 ulp on rows of 2000, every ISA variant.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.common import GPU_FLOATS, SIMD_ISAS, gpu_source, same_dtypes
from opforge.builtins.exp import VECMATH
from opforge.sbp import split

if TYPE_CHECKING:
    import numpy.typing as npt

    from opforge import TensorSpec
    from opforge.sbp import SBPValue

softmax = opforge.op("softmax(Tensor x, *, int axis=-1) -> Tensor y", traits=["no_side_effect"],
                     doc="Numerically stable softmax along one axis (floating-point inputs).")
softmax.def_infer(infer.same_as(0))


@softmax.check
def softmax_check(x: TensorSpec, *, axis: int) -> str | None:
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
def softmax_sbp(x: TensorSpec, *, axis: int) -> list[dict[str, SBPValue]]:
    # Each slice along `axis` is normalised on its own, so any other axis splits.
    if not x.rank:  # unknown rank, or 0-d
        return []
    return [{"x": split(k), "y": split(k)} for k in range(x.rank) if k != axis % x.rank]


@softmax.reference(fallback=True)
def softmax_reference(x: npt.NDArray[Any], *, axis: int) -> npt.NDArray[Any]:
    if x.ndim == 0:
        return np.ones_like(x)
    shifted = x - np.max(x, axis=axis, keepdims=True, initial=-np.inf)  # initial: an empty x has no max
    e = np.exp(shifted)
    y: npt.NDArray[Any] = e / np.sum(e, axis=axis, keepdims=True)
    return y.astype(x.dtype, copy=False)


@softmax.grad(save=["y"])
def softmax_grad(saved: Any, dy: Any, *, axis: int) -> Any:
    y = saved.y
    dot = opforge.ops.reduce_sum(dy * y, axes=[axis], keep_dims=True)
    return y * (dy - dot)


SOFTMAX = r"""
#include <algorithm>
#include <vector>

#include "custom_aot_extra.h"
#include "opforge/parallel.h"
#include "vecmath.h"

typedef OPFORGE_T T;

namespace {

const int kLanes = 16;          // independent accumulators, which the compiler keeps in vector registers
const int64_t kBlock = 4096;    // a row's sum is its blocks' sums added in order, however it is split
const int64_t kWork = 1 << 15;  // elements worth a thread
const int64_t kChunk = 256;     // lanes per task along a non-last axis

T RangeMax(const T *x, int64_t n) {  // NaN is skipped here and comes back through the sum
  T lanes[kLanes];
  for (int j = 0; j < kLanes; j++) lanes[j] = -__builtin_inf();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; j++) lanes[j] = x[i + j] > lanes[j] ? x[i + j] : lanes[j];
  T m = -__builtin_inf();
  for (; i < n; i++) m = x[i] > m ? x[i] : m;
  for (int j = 0; j < kLanes; j++) m = lanes[j] > m ? lanes[j] : m;
  return m;
}

T ExpSum(const T *x, T *y, int64_t n, T m) {  // y = e^(x - m) over one block; returns its sum
  for (int64_t i = 0; i < n; i++) y[i] = vecmath::Exp(x[i] - m);
  T lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; j++) lanes[j] += y[i + j];
  T s = 0;
  for (; i < n; i++) s += y[i];
  for (int j = 0; j < kLanes; j++) s += lanes[j];
  return s;
}

void Scale(T *y, int64_t n, T factor) {
  for (int64_t i = 0; i < n; i++) y[i] *= factor;
}

void Row(const T *x, T *y, int64_t n) {
  const T m = RangeMax(x, n);
  T s = 0;
  for (int64_t b = 0; b < n; b += kBlock) s += ExpSum(x + b, y + b, std::min(kBlock, n - b), m);
  Scale(y, n, T(1) / s);
}

// One long row with its blocks spread over the pool: the same partial
// results as Row, combined in the same order.
void WideRow(const T *x, T *y, int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<T> part(blocks);
  auto each = [&](auto &&fn) {
    opforge::parallel_for(0, blocks, std::max<int64_t>(1, kWork / kBlock), [&](int64_t lo, int64_t hi) {
      for (int64_t b = lo; b < hi; b++) fn(b, b * kBlock, std::min(kBlock, n - b * kBlock));
    });
  };
  each([&](int64_t b, int64_t at, int64_t len) { part[b] = RangeMax(x + at, len); });
  T m = -__builtin_inf();
  for (T p : part) m = p > m ? p : m;
  each([&](int64_t b, int64_t at, int64_t len) { part[b] = ExpSum(x + at, y + at, len, m); });
  T s = 0;
  for (T p : part) s += p;
  const T factor = T(1) / s;
  each([&](int64_t, int64_t at, int64_t len) { Scale(y + at, len, factor); });
}

// Softmax along `len` for lanes [c0, c0 + w) of one outer slice (stride `inner`).
void Lanes(const T *x, T *y, int64_t len, int64_t inner, int64_t c0, int64_t w) {
  T top[kChunk], sum[kChunk];
  for (int64_t i = 0; i < w; i++) top[i] = x[c0 + i], sum[i] = 0;
  for (int64_t l = 1; l < len; l++) {
    const T *xl = x + l * inner + c0;
    for (int64_t i = 0; i < w; i++) top[i] = xl[i] > top[i] ? xl[i] : top[i];
  }
  for (int64_t l = 0; l < len; l++) {
    const T *xl = x + l * inner + c0;
    T *yl = y + l * inner + c0;
    for (int64_t i = 0; i < w; i++) {
      yl[i] = vecmath::Exp(xl[i] - top[i]);
      sum[i] += yl[i];
    }
  }
  for (int64_t i = 0; i < w; i++) sum[i] = T(1) / sum[i];
  for (int64_t l = 0; l < len; l++) {
    T *yl = y + l * inner + c0;
    for (int64_t i = 0; i < w; i++) yl[i] *= sum[i];
  }
}

}  // namespace

extern "C" int Softmax(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                       void *stream, void *extra_ptr) {
  AotExtra *extra = static_cast<AotExtra *>(extra_ptr);
  const T *x = static_cast<const T *>(params[0]);
  T *y = static_cast<T *>(params[1]);
  const int rank = ndims[0];
  int64_t axis = extra->Attr<int64_t>("axis");
  if (axis < 0) axis += rank > 0 ? rank : 1;
  if (axis < 0 || axis >= (rank > 0 ? rank : 1)) return 1;  // the op's check rejects this first

  // x as [outer, len, inner], the softmax along len.
  int64_t outer = 1, len = 1, inner = 1;
  for (int d = 0; d < rank; d++) {
    if (d < axis) outer *= shapes[0][d];
    else if (d == axis) len = shapes[0][d];
    else inner *= shapes[0][d];
  }
  if (outer * len * inner == 0) return 0;  // (opforge skips it: y is empty too; this keeps the kernel safe alone)
  try {
    if (inner == 1 && len >= 4 * kBlock && outer < 2 * opforge::num_threads()) {
      for (int64_t o = 0; o < outer; o++) WideRow(x + o * len, y + o * len, len);
    } else if (inner == 1) {
      opforge::parallel_for(0, outer, std::max<int64_t>(1, kWork / len), [&](int64_t lo, int64_t hi) {
        for (int64_t o = lo; o < hi; o++) Row(x + o * len, y + o * len, len);
      });
    } else {
      const int64_t chunks = (inner + kChunk - 1) / kChunk;
      const int64_t grain = std::max<int64_t>(1, kWork / (len * std::min(inner, kChunk)));
      opforge::parallel_for(0, outer * chunks, grain, [&](int64_t lo, int64_t hi) {
        for (int64_t task = lo; task < hi; task++) {
          const int64_t o = task / chunks, c0 = task % chunks * kChunk;
          Lanes(x + o * len * inner, y + o * len * inner, len, inner, c0, std::min(kChunk, inner - c0));
        }
      });
    }
  } catch (...) {  // (a failed allocation, the pool): nothing crosses the ABI
    return 2;
  }
  return 0;
}
"""
for _isa in SIMD_ISAS:
    softmax.kernel(function="Softmax", code=SOFTMAX, dtypes={"x": ["float32", "float64"]}, isa=_isa,
                   include_dirs=VECMATH["include_dirs"], cflags=VECMATH["cflags"])
del _isa
softmax.kernel(source=gpu_source("softmax.cu", "SoftmaxGpu"), device="gpu", dtypes=same_dtypes(GPU_FLOATS))
