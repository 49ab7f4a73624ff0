"""topk: the k largest (or smallest) elements along ``axis`` and their indices (ONNX TopK).

Two outputs: ``values`` (x's dtype) and ``indices`` (int64), both x's shape
with the axis cut to k.  Equal values keep the lower index first, as ONNX
says; NaN counts as larger than every number.  Results are always sorted
(``sorted=False`` allows any order, and sorted is one of them).  The C++
kernel covers float32, float64, int32 and int64; other dtypes run the NumPy
reference.  The gradient puts dy back at the indices (``topk_grad``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import TensorSpec
from opforge.builtins.common import FLOATS, NUMERIC, every_dtype

if TYPE_CHECKING:
    import numpy.typing as npt

topk = opforge.op("topk(Tensor x, *, int k, int axis=-1, bool largest=True, bool sorted=True) "
                  "-> (Tensor values, Tensor indices)",
                  traits=["no_side_effect"],
                  doc="The k largest (largest=False: smallest) elements along axis, sorted, with their int64 "
                      "indices; equal values keep the lower index first, NaN counts as the largest.")


def topk_problem(x: TensorSpec, k: int, axis: int) -> str | None:
    if k < 0:
        return f"attribute 'k' is {k}; it must be >= 0"
    if x.rank is None:
        return None
    if x.rank == 0:
        return "input 'x' is 0-d; topk needs rank >= 1"
    if not -x.rank <= axis < x.rank:
        return f"axis {axis} is out of range for input 'x' of rank {x.rank} (valid: {-x.rank}..{x.rank - 1})"
    size = x.shape[axis]
    if size != -1 and k > size:
        return f"attribute 'k' is {k}, but input 'x' has only {size} elements along axis {axis}"
    return None


@topk.check
def topk_check(x: TensorSpec, *, k: int, axis: int, largest: bool, sorted: bool) -> str | None:
    return topk_problem(x, k, axis)


@topk.infer
def topk_infer(x: TensorSpec, *, k: int, axis: int, largest: bool, sorted: bool) -> tuple[TensorSpec, TensorSpec]:
    if x.rank is None:
        return TensorSpec(None, x.dtype), TensorSpec(None, "int64")
    shape = list(x.shape)
    shape[axis] = k
    return TensorSpec(shape, x.dtype), TensorSpec(shape, "int64")


@topk.reference(fallback=True)
def topk_reference(x: npt.NDArray[Any], *, k: int, axis: int, largest: bool,
                   sorted: bool) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64]]:
    moved = np.moveaxis(x, axis, -1)
    values = moved.astype(np.uint8) if moved.dtype == np.bool_ else moved
    if values.dtype.kind == "f":  # NaN ranks first (largest) or last: a key of its own, sorted on first
        wide = values.astype(np.float64)
        nan = np.isnan(wide)
        key = np.where(nan, 0.0, -wide if largest else wide)
        order = np.lexsort((key, ~nan if largest else nan), axis=-1)  # stable: ties keep index order
    else:  # ~v reverses the order of integers without overflow
        order = np.argsort(~values if largest else values, axis=-1, kind="stable")
    order = order[..., :k]
    taken = np.take_along_axis(moved, order, axis=-1)
    return np.moveaxis(taken, -1, axis).copy(), np.moveaxis(order, -1, axis).astype(np.int64)


@topk.grad(save=["x", "indices"])
def topk_grad(saved: Any, dvalues: Any, dindices: Any, *, k: int, axis: int, largest: bool, sorted: bool) -> Any:
    return opforge.ops.topk_grad(dvalues, saved.indices, saved.x, axis=axis)


TOPK_CC = r"""
#include <algorithm>
#include <cstdint>
#include <vector>

#include "custom_aot_extra.h"
#include "opforge/parallel.h"

typedef OPFORGE_T T;

template <typename V>
static bool IsNan(V v) { return v != v; }

// Whether v, found after w along the line, ranks before it (ties keep the
// earlier element first; NaN is the largest value).
static inline bool Beats(T v, T w, bool largest) {
  if (largest) return v > w || (IsNan(v) && !IsNan(w));
  return v < w || (!IsNan(v) && IsNan(w));
}

// Small k: one pass keeping the best k so far, sorted, in (bv, bi).  Blocks
// of 16 are first tested against the k-th best with a compare the compiler
// vectorizes (true also for NaN), and scanned one by one only when one may enter.
static void ScanTopK(const T *line, int64_t n, int64_t k, bool largest, T *bv, int64_t *bi) {
  int64_t count = 0;
  auto offer = [&](int64_t j) {
    const T v = line[j];
    int64_t pos;
    if (count == k) {
      if (!Beats(v, bv[k - 1], largest)) return;
      pos = k - 1;
    } else {
      pos = count++;
    }
    for (; pos > 0 && Beats(v, bv[pos - 1], largest); pos--) {
      bv[pos] = bv[pos - 1];
      bi[pos] = bi[pos - 1];
    }
    bv[pos] = v;
    bi[pos] = j;
  };
  int64_t j = 0;
  for (; j < n && count < k; j++) offer(j);
  for (; j + 16 <= n; j += 16) {
    const T worst = bv[k - 1];
    int any = 0;
    if (largest)
      for (int i = 0; i < 16; i++) any |= !(line[j + i] <= worst);
    else
      for (int i = 0; i < 16; i++) any |= !(line[j + i] >= worst);
    if (any)
      for (int i = 0; i < 16; i++) offer(j + i);
  }
  for (; j < n; j++) offer(j);
}

// params: x, values, indices.  Lines along the axis (stride inner) in
// parallel ranges; a strided line is first gathered into a buffer.  k up to
// 64: ScanTopK; larger: nth_element and a sort of the first k.
extern "C" int TopK(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                    void *stream, void *extra_ptr) {
  AotExtra *extra = static_cast<AotExtra *>(extra_ptr);
  const int rank = ndims[0];
  int64_t axis = extra->Attr<int64_t>("axis");
  const int64_t k = extra->Attr<int64_t>("k");
  const bool largest = extra->Attr<bool>("largest");
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) return 1;  // the op's check rejects these first
  const int64_t n = shapes[0][axis];
  if (k < 0 || k > n) return 1;
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < rank; d++) {
    if (d < axis) outer *= shapes[0][d];
    if (d > axis) inner *= shapes[0][d];
  }
  if (k == 0 || outer * inner == 0) return 0;
  const T *x = static_cast<const T *>(params[0]);
  T *values = static_cast<T *>(params[1]);
  int64_t *indices = static_cast<int64_t *>(params[2]);
  const bool scan = k <= 64;
  opforge::parallel_for(0, outer * inner, std::max<int64_t>(1, (1 << 15) / n), [&](int64_t l0, int64_t l1) {
    std::vector<T> buffer(inner == 1 ? 0 : n), bv(k);
    std::vector<int64_t> bi(k), order(scan ? 0 : n);
    for (int64_t l = l0; l < l1; l++) {
      const int64_t o = l / inner, i = l % inner;
      const T *line = x + o * n * inner + i;
      if (inner != 1) {
        for (int64_t j = 0; j < n; j++) buffer[j] = line[j * inner];
        line = buffer.data();
      }
      if (scan) {
        ScanTopK(line, n, k, largest, bv.data(), bi.data());
      } else {
        auto before = [&](int64_t a, int64_t b) {
          if (line[a] == line[b] || (IsNan(line[a]) && IsNan(line[b]))) return a < b;
          return Beats(line[a], line[b], largest);  // distinct values: by value alone
        };
        for (int64_t j = 0; j < n; j++) order[j] = j;
        if (k < n) std::nth_element(order.begin(), order.begin() + k, order.end(), before);
        std::sort(order.begin(), order.begin() + k, before);
        for (int64_t j = 0; j < k; j++) {
          bv[j] = line[order[j]];
          bi[j] = order[j];
        }
      }
      const int64_t base = o * k * inner + i;
      for (int64_t j = 0; j < k; j++) {
        values[base + j * inner] = bv[j];
        indices[base + j * inner] = bi[j];
      }
    }
  });
  return 0;
}
"""
topk.kernel(function="TopK", code=every_dtype(TOPK_CC, "TopK", NUMERIC), dtypes=[(d,) for d in NUMERIC])


# The gradient is an op too: dx = zeros of x's shape with dy at the indices topk took.
topk_grad_op = opforge.op("topk_grad(Tensor dvalues, Tensor indices, Tensor x, *, int axis=-1) -> Tensor dx",
                          traits=["no_side_effect"],
                          doc="Gradient of topk: zeros of x's shape with dvalues put back at indices along axis "
                              "(x only lends its shape).")


@topk_grad_op.check
def topk_grad_check(dvalues: TensorSpec, indices: TensorSpec, x: TensorSpec, *, axis: int) -> str | None:
    if dvalues.dtype != x.dtype:
        raise opforge.DTypeError(f"op 'topk_grad': inputs 'dvalues' ({dvalues.dtype}) and 'x' ({x.dtype}) must "
                                 "have one dtype")
    if indices.dtype != "int64":
        raise opforge.DTypeError(f"op 'topk_grad': input 'indices' has dtype {indices.dtype}; expected int64")
    if x.rank is not None and x.rank and not -x.rank <= axis < x.rank:
        return f"axis {axis} is out of range for input 'x' of rank {x.rank} (valid: {-x.rank}..{x.rank - 1})"
    if None not in (dvalues.rank, indices.rank) and dvalues.shape != indices.shape:
        if not TensorSpec(indices.shape).matches(dvalues.shape) or dvalues.rank != indices.rank:
            return f"inputs 'dvalues' {list(dvalues.shape)} and 'indices' {list(indices.shape)} differ in shape"
    if None not in (dvalues.rank, x.rank) and x.rank:
        # dvalues is topk's output: x's shape but along axis (k there)
        mismatch = dvalues.rank != x.rank or any(
            d != axis % x.rank and -1 not in (a, b) and a != b for d, (a, b) in enumerate(zip(dvalues.shape, x.shape)))
        if mismatch:
            return (f"input 'dvalues' has shape {list(dvalues.shape)}; topk of 'x' {list(x.shape)} along axis {axis} "
                    f"has x's shape but along that axis")
    return None


@topk_grad_op.infer
def topk_grad_infer(dvalues: TensorSpec, indices: TensorSpec, x: TensorSpec, *, axis: int) -> TensorSpec:
    return TensorSpec(x.shape, dvalues.dtype)


@topk_grad_op.reference(fallback=True)
def topk_grad_reference(dvalues: npt.NDArray[Any], indices: npt.NDArray[np.int64], x: npt.NDArray[Any], *,
                        axis: int) -> npt.NDArray[Any]:
    dx = np.zeros_like(x)
    np.put_along_axis(dx, indices, dvalues, axis=axis)
    return dx


TOPK_GRAD_CC = r"""
#include <algorithm>
#include <cstdint>

#include "custom_aot_extra.h"
#include "opforge/parallel.h"

// params: dvalues, indices, x (shape only), dx.
extern "C" int TopKGrad(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                        void *stream, void *extra) {
  const int rank = ndims[2];
  int64_t axis = static_cast<AotExtra *>(extra)->Attr<int64_t>("axis");
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank || ndims[0] != rank || ndims[1] != rank) return 1;
  for (int d = 0; d < rank; d++)  // dvalues and indices: topk's outputs, x's shape but along axis
    if (shapes[1][d] != shapes[0][d] || (d != axis && shapes[0][d] != shapes[2][d])) return 1;
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < rank; d++) {
    if (d < axis) outer *= shapes[2][d];
    if (d > axis) inner *= shapes[2][d];
  }
  const int64_t n = shapes[2][axis], k = shapes[0][axis];
  const OPFORGE_T *dy = static_cast<const OPFORGE_T *>(params[0]);
  const int64_t *indices = static_cast<const int64_t *>(params[1]);
  OPFORGE_T *dx = static_cast<OPFORGE_T *>(params[3]);
  for (int64_t i = 0; i < outer * k * inner; i++)
    if (indices[i] < 0 || indices[i] >= n) return 4;  // not an index topk gives (checked before any write)
  // Each block of dx along the axis (zeroed, then dvalues added at the indices) on opforge's threads.
  const int64_t block = std::max<int64_t>(1, n * inner);
  opforge::parallel_for(0, outer, std::max<int64_t>(1, (int64_t(1) << 15) / block), [&](int64_t o0, int64_t o1) {
    std::fill(dx + o0 * n * inner, dx + o1 * n * inner, OPFORGE_T(0));
    for (int64_t o = o0; o < o1; o++)
      for (int64_t j = 0; j < k; j++)
        for (int64_t i = 0; i < inner; i++) {
          const int64_t from = (o * k + j) * inner + i;
          dx[(o * n + indices[from]) * inner + i] += dy[from];
        }
  });
  return 0;
}
"""
topk_grad_op.kernel(function="TopKGrad", code=every_dtype(TOPK_GRAD_CC, "TopKGrad", FLOATS),
                    dtypes=[(d, "int64", d) for d in FLOATS])
