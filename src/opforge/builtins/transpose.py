"""transpose: y = x with its axes permuted (``perm``), or its last two swapped.

``perm=[]`` (the default) swaps the last two axes: a batched matrix
transpose.  Otherwise y's axis k is x's axis ``perm[k]`` (NumPy's
``np.transpose(x, perm)``; ONNX Transpose).  The kernel moves elements
without looking at them, so one library serves every dtype; the gradient
transposes back with the inverse permutation.
"""
from pathlib import Path

import numpy as np

import opforge
from opforge import TensorSpec
from opforge.errors import ShapeError

transpose = opforge.op("transpose(Tensor x, *, int[] perm=[]) -> Tensor y", traits=["no_side_effect"],
                       doc="Permute the axes: y's axis k is x's axis perm[k] (negative entries count from the "
                           "end); an empty perm swaps the last two axes of a tensor of rank >= 2.")


def full_perm(rank, perm):
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
def transpose_check(x, *, perm):
    if x.rank is None:
        return None
    problem = full_perm(x.rank, perm)
    if isinstance(problem, str):
        raise ShapeError(f"op 'transpose': {problem}")
    return None


@transpose.infer
def transpose_infer(x, *, perm):
    if x.rank is None:
        return TensorSpec([-1] * len(perm) if perm else None, x.dtype)
    return TensorSpec([x.shape[axis] for axis in full_perm(x.rank, perm)], x.dtype)


@transpose.reference(fallback=True)
def transpose_reference(x, *, perm=()):
    return np.transpose(x, full_perm(x.ndim, perm)).copy()


@transpose.grad()
def transpose_grad(saved, dy, *, perm):
    if not perm:
        return opforge.ops.transpose(dy)  # swapping twice
    inverse = [0] * len(perm)
    for k, axis in enumerate(perm):
        inverse[axis % len(perm)] = k
    return opforge.ops.transpose(dy, perm=inverse)


TRANSPOSE = r"""
#include <cstdint>
#include <cstring>
#include <vector>

#include "custom_aot_extra.h"
#include "elements.h"

// y[i] = x at the matching index, every dim walked as an odometer.  Dims that
// stay neighbours (x's axes a, a+1 at y's k, k+1) are merged first, and when
// x's last axis stays last the innermost run is one memcpy.
extern "C" int Transpose(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                         void *stream, void *extra_ptr) {
  AotExtra *extra = static_cast<AotExtra *>(extra_ptr);
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
  const int64_t size = ElementSize(dtypes[0]), n = ElementCount(rank, shape);
  if (n == 0) return 0;
  std::vector<int64_t> xstride(rank);
  for (int d = rank - 1; d >= 0; d--) xstride[d] = d == rank - 1 ? size : xstride[d + 1] * shape[d + 1];
  // y's dims (size > 1 only) with the byte stride of x along each, merged where contiguous.
  std::vector<int64_t> dim, stride;
  for (int k = 0; k < rank; k++) {
    const int64_t axis = perm[k];
    if (shape[axis] == 1) continue;
    if (!dim.empty() && stride.back() == xstride[axis] * shape[axis]) {
      dim.back() *= shape[axis];
      stride.back() = xstride[axis];
    } else {
      dim.push_back(shape[axis]);
      stride.push_back(xstride[axis]);
    }
  }
  const char *x = static_cast<const char *>(params[0]);
  char *y = static_cast<char *>(params[1]);
  if (dim.empty() || (dim.size() == 1 && stride[0] == size)) {
    std::memcpy(y, x, n * size);
    return 0;
  }
  // A contiguous innermost run is copied whole; otherwise elements one by one.
  int64_t run = 1;
  if (stride.back() == size) {
    run = dim.back();
    dim.pop_back();
    stride.pop_back();
  }
  const int m = static_cast<int>(dim.size());
  const int64_t inner = dim[m - 1], inner_stride = stride[m - 1], run_bytes = run * size;
  std::vector<int64_t> index(m, 0);
  int64_t offset = 0;
  for (int64_t done = 0; done < n; done += inner * run) {
    const char *from = x + offset;
    if (run > 1) {
      for (int64_t j = 0; j < inner; j++, y += run_bytes) std::memcpy(y, from + j * inner_stride, run_bytes);
    } else {
      switch (size) {
        case 1: for (int64_t j = 0; j < inner; j++, y += 1) *y = from[j * inner_stride]; break;
        case 2: for (int64_t j = 0; j < inner; j++, y += 2) std::memcpy(y, from + j * inner_stride, 2); break;
        case 4: for (int64_t j = 0; j < inner; j++, y += 4) std::memcpy(y, from + j * inner_stride, 4); break;
        case 8: for (int64_t j = 0; j < inner; j++, y += 8) std::memcpy(y, from + j * inner_stride, 8); break;
        default: for (int64_t j = 0; j < inner; j++, y += size) std::memcpy(y, from + j * inner_stride, size);
      }
    }
    for (int d = m - 2; d >= 0; d--) {
      offset += stride[d];
      if (++index[d] < dim[d]) break;
      offset -= stride[d] * dim[d];
      index[d] = 0;
    }
  }
  return 0;
}
"""
transpose.kernel(function="Transpose", code=TRANSPOSE, include_dirs=[str(Path(__file__).parent)])
