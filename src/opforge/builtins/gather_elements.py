"""gather_elements: y[i] = data[i with its ``axis`` coordinate replaced by indices[i]]
(ONNX GatherElements, np.take_along_axis).

y has indices' shape; indices has data's rank, and on every other axis a
dim no larger than data's.  Negative indices count from the end; an index
out of range is an error (the kernel returns non-zero before it writes:
KernelError), never a silent read.  The kernel moves elements by their size,
one library for every dtype (int32 or int64 indices), on opforge's threads.
The gradient is scatter_elements with reduction "add" of dy into zeros of
data's shape (a repeated index adds up).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import TensorSpec
from opforge.builtins.common import HEADER_DIRS, zeros_like
from opforge.builtins.gather import INDEX_DTYPES, INDICES_FIT, checked_indices

if TYPE_CHECKING:
    import numpy.typing as npt

gather_elements = opforge.op(
    "gather_elements(Tensor data, Tensor indices, *, int axis=0) -> Tensor y",
    # always_compute: data empty along axis with indices not empty is still an out-of-range error
    traits=["no_side_effect", "always_compute"],
    doc="Take one element of data per element of indices (int32 or int64; negative ones count from the end), "
        "found along axis: y has indices' shape (np.take_along_axis).")


def elements_problem(op_name: str, data: TensorSpec, indices: TensorSpec, axis: int,
                     other: tuple[str, TensorSpec] | None = None) -> str | None:
    """What is wrong with data / indices (/ an ``other`` input of indices' shape) for axis, or None.
    Shared by scatter_elements."""
    if indices.dtype not in INDEX_DTYPES:
        raise opforge.DTypeError(f"op '{op_name}': input 'indices' has dtype {indices.dtype}; expected int32 or "
                                 "int64")
    if data.rank is None:
        return None
    if data.rank == 0:
        return f"input 'data' is 0-d; {op_name} needs rank >= 1"
    if not -data.rank <= axis < data.rank:
        return f"axis {axis} is out of range for input 'data' of rank {data.rank} (valid: {-data.rank}.." \
               f"{data.rank - 1})"
    if indices.rank is not None:
        if indices.rank != data.rank:
            return f"input 'indices' has rank {indices.rank}; it must have data's rank {data.rank}"
        axis %= data.rank
        for d, (i, n) in enumerate(zip(indices.shape, data.shape)):
            if d != axis and -1 not in (i, n) and i > n:
                return f"input 'indices' has shape {list(indices.shape)}: dim {d} is larger than data's " \
                       f"{list(data.shape)} there"
    if other is not None and other[1].rank is not None and indices.rank is not None:
        name, spec = other
        if spec.rank != indices.rank or any(-1 not in (a, b) and a != b for a, b in zip(spec.shape, indices.shape)):
            return f"input '{name}' has shape {list(spec.shape)}; it must have indices' shape {list(indices.shape)}"
    return None


@gather_elements.check
def gather_elements_check(data: TensorSpec, indices: TensorSpec, *, axis: int) -> str | None:
    return elements_problem("gather_elements", data, indices, axis)


@gather_elements.infer
def gather_elements_infer(data: TensorSpec, indices: TensorSpec, *, axis: int) -> TensorSpec:
    return TensorSpec(indices.shape, data.dtype)


@gather_elements.reference(fallback=True)
def gather_elements_reference(data: npt.NDArray[Any], indices: npt.NDArray[Any], *, axis: int) -> npt.NDArray[Any]:
    axis %= data.ndim
    at = checked_indices(indices, data.shape[axis], "gather_elements")
    # take_along_axis wants data's other dims to match; indices may be smaller there: cut data to them.
    cut = tuple(slice(None) if d == axis else slice(0, n) for d, n in enumerate(indices.shape))
    return np.take_along_axis(data[cut], at, axis=axis)


@gather_elements.grad(save=["data", "indices"])
def gather_elements_grad(saved: Any, dy: Any, *, axis: int) -> tuple[Any, None]:
    zeros = zeros_like(saved.data, dy.dtype)
    return opforge.ops.scatter_elements(zeros, saved.indices, dy, axis=axis, reduction="add"), None


# Shared with scatter_elements: where each element of an indices row lands in data.
AXIS_WALK = r"""
#include <vector>

// indices (rank r) walked row by row over its last dim: element j of row `row` reads or writes
// data at Base(row) + j * step + index * stride[axis].
struct AxisWalk {
  int rank = 0;
  int64_t axis = 0, last = 0, rows = 0, step = 1, axis_stride = 1, size = 0;
  std::vector<int64_t> stride, ishape;

  // 0, or 3 when indices is larger than data on an axis other than `axis`.
  int Init(int r, const int64_t *dshape, const int64_t *idims, int64_t a) {
    rank = r, axis = a;
    stride.assign(r, 1);
    ishape.assign(idims, idims + r);
    for (int d = r - 2; d >= 0; d--) stride[d] = stride[d + 1] * dshape[d + 1];
    for (int d = 0; d < r; d++)
      if (d != a && idims[d] > dshape[d]) return 3;
    last = idims[r - 1];
    rows = 1;
    for (int d = 0; d < r - 1; d++) rows *= idims[d];
    step = a == r - 1 ? 0 : 1;
    axis_stride = stride[a];
    size = dshape[a];
    return 0;
  }
  int64_t Base(int64_t row) const {
    int64_t base = 0;
    for (int d = rank - 2; d >= 0; d--) {
      const int64_t c = row % ishape[d];
      row /= ishape[d];
      if (d != axis) base += c * stride[d];
    }
    return base;
  }
  template <typename I>
  int64_t At(int64_t base, int64_t j, I index) const {
    const int64_t at = int64_t(index) < 0 ? int64_t(index) + size : int64_t(index);
    return base + j * step + at * axis_stride;
  }
};

// axis from the attribute, made non-negative; -1 when it is out of range.
static inline int64_t AxisOf(void *extra, int rank) {
  int64_t axis = static_cast<AotExtra *>(extra)->Attr<int64_t>("axis");
  if (axis < 0) axis += rank;
  return axis < 0 || axis >= rank ? -1 : axis;
}
"""

GATHER_ELEMENTS_CC = r"""
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "custom_aot_extra.h"
#include "elements.h"
""" + INDICES_FIT + AXIS_WALK + r"""
template <typename E, typename I>
static int Run(const void *data_, const I *indices, void *y_, const AxisWalk &w) {
  const int64_t n = w.rows * w.last;
  if (!IndicesFit(indices, n, w.size)) return 4;  // an index out of range, found before any write
  const E *data = static_cast<const E *>(data_);
  E *y = static_cast<E *>(y_);
  opforge::parallel_for(0, w.rows, std::max<int64_t>(1, (int64_t(1) << 14) / std::max<int64_t>(w.last, 1)),
                        [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
      const int64_t base = w.Base(r);
      const I *row = indices + r * w.last;
      E *out = y + r * w.last;
      for (int64_t j = 0; j < w.last; j++) out[j] = data[w.At(base, j, row[j])];
    }
  });
  return 0;
}

template <typename I>
static int BySize(const char *dtype, const void *data, const I *indices, void *y, const AxisWalk &w) {
#define OPFORGE_GATHER_ELEMENTS(E) return Run<E, I>(data, indices, y, w)
  OPFORGE_BY_ELEMENT_SIZE(ElementSize(dtype), OPFORGE_GATHER_ELEMENTS)
#undef OPFORGE_GATHER_ELEMENTS
}

// params: data, indices, y.
extern "C" int GatherElements(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                              void *stream, void *extra) {
  try {
    const int rank = ndims[0];
    if (rank < 1 || ndims[1] != rank) return 1;  // the op's check rejects these first
    const int64_t axis = AxisOf(extra, rank);
    if (axis < 0) return 1;
    AxisWalk w;
    if (int status = w.Init(rank, shapes[0], shapes[1], axis)) return status;
    if (!std::strcmp(dtypes[1], "int64"))
      return BySize(dtypes[0], params[0], static_cast<const int64_t *>(params[1]), params[2], w);
    if (!std::strcmp(dtypes[1], "int32"))
      return BySize(dtypes[0], params[0], static_cast<const int32_t *>(params[1]), params[2], w);
    return 2;
  } catch (...) {
    return 5;
  }
}
"""
gather_elements.kernel(function="GatherElements", code=GATHER_ELEMENTS_CC, include_dirs=HEADER_DIRS)
