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
from opforge.builtins.gather import INDEX_DTYPES, INDEX_ERRORS, checked_indices

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


# The helpers (AxisWalk: where an index lands) are in indexing.h, shared with scatter_elements.
GATHER_ELEMENTS_CC = r"""
#include "indexing.h"

template <typename E, typename I>
static int Run(const void *data_, const I *indices, void *y_, const AxisWalk &w) {
  if (!w.Fits(indices)) return 4;  // an index out of range, found before any write
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
    return ByIndexType(dtypes[1], params[1],
                       [&](const auto *indices) { return BySize(dtypes[0], params[0], indices, params[2], w); });
  } catch (...) {
    return 5;
  }
}
"""
gather_elements.kernel(function="GatherElements", code=GATHER_ELEMENTS_CC, include_dirs=HEADER_DIRS,
                       errors=INDEX_ERRORS)
