"""transpose: y = x with its axes permuted (``perm``), or its last two swapped.

``perm=[]`` (the default) swaps the last two axes: a batched matrix
transpose.  Otherwise y's axis k is x's axis ``perm[k]`` (NumPy's
``np.transpose(x, perm)``; ONNX Transpose).  The kernel moves elements
without looking at them, so one library serves every dtype; the gradient
transposes back with the inverse permutation.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import TensorSpec
from opforge.builtins.common import HEADER_DIRS, gpu_source
from opforge.errors import ShapeError
from opforge.sbp import split

if TYPE_CHECKING:
    import numpy.typing as npt

    from opforge.sbp import SBPValue

transpose = opforge.op("transpose(Tensor x, *, int[] perm=[]) -> Tensor y", traits=["no_side_effect"],
                       doc="Permute the axes: y's axis k is x's axis perm[k] (negative entries count from the "
                           "end); an empty perm swaps the last two axes of a tensor of rank >= 2.")


def full_perm(rank: int, perm: Sequence[int]) -> list[int] | str:
    """``perm`` as a list of axes in 0..rank-1 (empty: the last two swapped), or the reason it is not one."""
    if not perm:
        if rank < 2:
            return f"an empty 'perm' swaps the last two axes, but input 'x' has rank {rank} (needs >= 2)"
        return list(range(rank - 2)) + [rank - 1, rank - 2]
    if len(perm) != rank:
        return f"'perm' {list(perm)} has {len(perm)} entries, input 'x' has rank {rank}"
    for axis in perm:
        if not -rank <= axis < rank:
            return f"axis {axis} in 'perm' is out of range for input 'x' of rank {rank} (valid: {-rank}..{rank - 1})"
    normalized = [axis % rank for axis in perm]
    if sorted(normalized) != list(range(rank)):
        return f"'perm' {list(perm)} is not a permutation of the axes 0..{rank - 1}"
    return normalized


@transpose.check
def transpose_check(x: TensorSpec, *, perm: Sequence[int]) -> None:
    if x.rank is None and not perm:
        return None
    problem = full_perm(len(perm) if x.rank is None else x.rank, perm)
    if isinstance(problem, str):
        raise ShapeError(f"op 'transpose': {problem}")
    return None


@transpose.infer
def transpose_infer(x: TensorSpec, *, perm: Sequence[int]) -> TensorSpec:
    if x.rank is None:
        return TensorSpec([-1] * len(perm) if perm else None, x.dtype)
    # (full_perm gives a list here: the check rejected a perm that is not one)
    return TensorSpec([x.shape[axis] for axis in full_perm(x.rank, perm)], x.dtype)  # type: ignore[index]


@transpose.sbp
def transpose_sbp(x: TensorSpec, *, perm: Sequence[int]) -> list[dict[str, SBPValue]]:
    # y's axis k is x's axis perm[k]: a split moves with its axis.
    rank = x.rank if x.rank is not None else len(perm)
    order = full_perm(rank, perm) if rank else []  # (an unknown rank with an empty perm: nothing known)
    if isinstance(order, str):
        raise ShapeError(f"op 'transpose': {order}")
    return [{"x": split(x_axis), "y": split(y_axis)} for y_axis, x_axis in enumerate(order)]


@transpose.reference(fallback=True)
def transpose_reference(x: npt.NDArray[Any], *, perm: Sequence[int] = ()) -> npt.NDArray[Any]:
    # (full_perm gives a list here: the op's check rejected a perm that is not one)
    y: npt.NDArray[Any] = np.transpose(x, full_perm(x.ndim, perm)).copy()  # type: ignore[arg-type]
    return y


@transpose.grad()
def transpose_grad(saved: Any, dy: Any, *, perm: Sequence[int]) -> Any:
    if not perm:
        return opforge.ops.transpose(dy)  # swapping twice
    inverse = [0] * len(perm)
    for k, axis in enumerate(perm):
        inverse[axis % len(perm)] = k
    return opforge.ops.transpose(dy, perm=inverse)


TRANSPOSE = r"""
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "custom_aot_extra.h"
#include "elements.h"
#include "opforge/parallel.h"

static const int64_t kGrainBytes = 1 << 18;  // bytes moved by a parallel range at least

// What a call moves where, worked out once per signature by TransposeInit:
// y's dims (size > 1 only) with x's byte stride along each, merged where
// contiguous, and the way to move them.
struct TransposePlan : AotKernelData {
  enum Way { kCopy, kTiled, kOdometer } way = kCopy;
  int64_t size = 0, n = 0;           // element bytes, elements
  std::vector<int64_t> dim, stride;  // kOdometer: without the innermost contiguous run
  // kTiled: x is contiguous along y's dim `along`; the other dims but the last index the tiles' planes.
  int along = -1;
  std::vector<int64_t> ystride;
  std::vector<int> others;
  int64_t outer = 1;
  int64_t run = 1;                   // kOdometer: elements copied whole at the innermost level
};

// y's last dim against x's contiguous dim `along`, in square tiles, for each
// index of the other dims; ranges of tile rows in parallel.  Each tile is
// staged through a small buffer: x's side is read as whole contiguous
// pieces and y's written so, which keeps a power-of-two row stride (every
// row in one cache set) from evicting lines before they are used up.
template <typename E>
static void Tiled(const char *x, char *y, const TransposePlan &plan) {
  const std::vector<int64_t> &dim = plan.dim, &stride = plan.stride, &ystride = plan.ystride;
  const int m = static_cast<int>(dim.size()), along = plan.along;
  const int64_t size = sizeof(E), TILE = size >= 8 ? 32 : 64;
  const int64_t rows = dim[along], cols = dim[m - 1];
  const int64_t x_col = stride[m - 1] / size, y_row = ystride[along] / size;
  const int64_t tiles = (rows + TILE - 1) / TILE;
  const int64_t grain = std::max<int64_t>(1, kGrainBytes / (TILE * cols * size));
  const int64_t tile_rows = std::min(TILE, rows), tile_cols = std::min(TILE, cols);  // the staging a tile needs
  opforge::parallel_for(0, plan.outer * tiles, grain, [&](int64_t t0, int64_t t1) {
    std::unique_ptr<E[]> buffer(new E[tile_rows * tile_cols]);  // (left uninitialised: every tile fills it first)
    E *buf = buffer.get();
    for (int64_t t = t0; t < t1; t++) {
      int64_t o = t / tiles, xoff = 0, yoff = 0;
      for (int k = static_cast<int>(plan.others.size()) - 1; k >= 0; k--) {
        const int d = plan.others[k];
        xoff += o % dim[d] * stride[d];
        yoff += o % dim[d] * ystride[d];
        o /= dim[d];
      }
      const E *from = reinterpret_cast<const E *>(x + xoff);
      E *to = reinterpret_cast<E *>(y + yoff);
      const int64_t r0 = t % tiles * TILE, r1 = std::min(r0 + TILE, rows), h = r1 - r0;
      for (int64_t c0 = 0; c0 < cols; c0 += TILE) {
        const int64_t c1 = std::min(c0 + TILE, cols), w = c1 - c0;
        for (int64_t c = 0; c < w; c++) std::memcpy(buf + c * tile_rows, from + r0 + (c0 + c) * x_col, h * size);
        for (int64_t r = 0; r < h; r++) {
          E *out = to + (r0 + r) * y_row + c0;
          for (int64_t c = 0; c < w; c++) out[c] = buf[c * tile_rows + r];
        }
      }
    }
  });
}

extern "C" int TransposeInit(int *ndims, int64_t **shapes, const char **dtypes, AotExtra *extra) {
  const int rank = ndims[0];
  const int64_t *shape = shapes[0];
  std::vector<int64_t> perm = extra->Attr<std::vector<int64_t>>("perm");
  if (perm.empty()) {
    if (rank < 2) return 3;
    for (int d = 0; d < rank; d++) perm.push_back(d);
    std::swap(perm[rank - 1], perm[rank - 2]);
  }
  if (static_cast<int>(perm.size()) != rank) return 1;  // the op's check rejects these first
  std::vector<bool> seen(rank, false);
  for (int64_t &axis : perm) {
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank || seen[axis]) return 1;
    seen[axis] = true;
  }
  TransposePlan *plan = new TransposePlan;
  extra->SetKernelData(plan);
  const int64_t size = plan->size = ElementSize(dtypes[0]);
  plan->n = ElementCount(rank, shape);
  std::vector<int64_t> xstride(rank);
  for (int d = rank - 1; d >= 0; d--) xstride[d] = d == rank - 1 ? size : xstride[d + 1] * shape[d + 1];
  std::vector<int64_t> &dim = plan->dim, &stride = plan->stride;
  for (int k = 0; k < rank; k++) AppendDim(dim, stride, shape[perm[k]], xstride[perm[k]]);
  if (plan->n == 0 || dim.empty() || (dim.size() == 1 && stride[0] == size)) return 0;  // kCopy
  const int m = static_cast<int>(dim.size());
  if (stride[m - 1] != size) {  // element by element: in tiles, so both sides stay in cache
    for (int d = 0; d < m; d++)
      if (stride[d] == size) plan->along = d;
    if (plan->along >= 0 && (size == 1 || size == 2 || size == 4 || size == 8)) {
      plan->way = TransposePlan::kTiled;
      plan->ystride.resize(m);
      for (int d = m - 1; d >= 0; d--) plan->ystride[d] = d == m - 1 ? size : plan->ystride[d + 1] * dim[d + 1];
      for (int d = 0; d < m - 1; d++)
        if (d != plan->along) {
          plan->others.push_back(d);
          plan->outer *= dim[d];
        }
      return 0;
    }
  }
  plan->way = TransposePlan::kOdometer;
  if (stride.back() == size) {  // a contiguous innermost run is copied whole
    plan->run = dim.back();
    dim.pop_back();
    stride.pop_back();
  }
  return 0;
}

// y[i] = x at the matching index: one memcpy, tiles, or every dim walked as
// an odometer.  Dims that stay neighbours (x's axes a, a+1 at y's k, k+1)
// were merged by TransposeInit, and when x's last axis stays last the
// innermost run is one memcpy.
extern "C" int Transpose(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                         void *stream, void *extra) {
  const TransposePlan *plan = static_cast<const TransposePlan *>(static_cast<AotExtra *>(extra)->KernelData());
  if (plan == nullptr) return 4;  // TransposeInit makes it for each signature
  const int64_t size = plan->size, n = plan->n;
  if (n == 0) return 0;
  const char *x = static_cast<const char *>(params[0]);
  char *y = static_cast<char *>(params[1]);
  switch (plan->way) {
    case TransposePlan::kCopy:
      opforge::parallel_for(0, n * size, kGrainBytes,
                            [&](int64_t lo, int64_t hi) { std::memcpy(y + lo, x + lo, hi - lo); });
      return 0;
    case TransposePlan::kTiled:
      switch (size) {
        case 1: Tiled<uint8_t>(x, y, *plan); return 0;
        case 2: Tiled<uint16_t>(x, y, *plan); return 0;
        case 4: Tiled<uint32_t>(x, y, *plan); return 0;
        default: Tiled<uint64_t>(x, y, *plan); return 0;
      }
    case TransposePlan::kOdometer:
      break;
  }
  // Ranges of y's rows run in parallel, each starting its odometer from its first row.
  const std::vector<int64_t> &dim = plan->dim, &stride = plan->stride;
  const int64_t run = plan->run;
  const int r = static_cast<int>(dim.size());
  const int64_t inner = dim[r - 1], inner_stride = stride[r - 1], run_bytes = run * size;
  const int64_t row_bytes = inner * run_bytes, nrows = n * size / row_bytes;
  opforge::parallel_for(0, nrows, std::max<int64_t>(1, kGrainBytes / row_bytes), [&](int64_t q0, int64_t q1) {
    int64_t index[16] = {0};  // (ranks above 16 take the heap)
    std::vector<int64_t> heap_index(r > 16 ? r : 0, 0);
    int64_t *idx = r > 16 ? heap_index.data() : index;
    int64_t offset = 0;
    for (int64_t q = q0, d = r - 2; d >= 0; d--) {
      idx[d] = q % dim[d];
      offset += idx[d] * stride[d];
      q /= dim[d];
    }
    char *to = y + q0 * row_bytes;
    for (int64_t q = q0; q < q1; q++) {
      const char *from = x + offset;
      if (run > 1) {
        for (int64_t j = 0; j < inner; j++, to += run_bytes) std::memcpy(to, from + j * inner_stride, run_bytes);
      } else {
        for (int64_t j = 0; j < inner; j++, to += size) std::memcpy(to, from + j * inner_stride, size);
      }
      for (int d = r - 2; d >= 0; d--) {
        offset += stride[d];
        if (++idx[d] < dim[d]) break;
        offset -= stride[d] * dim[d];
        idx[d] = 0;
      }
    }
  });
  return 0;
}
"""
transpose.kernel(function="Transpose", code=TRANSPOSE, include_dirs=HEADER_DIRS)
transpose.kernel(source=gpu_source("transpose.cu", "TransposeGpu"), device="gpu")  # any dtype, as above
