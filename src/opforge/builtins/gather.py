"""gather: y = data indexed along ``axis`` by ``indices`` (ONNX Gather, np.take).

y's shape is data's with the axis replaced by indices' shape.  Negative
indices count from the end; an index out of range is an error (the kernel
returns non-zero: KernelError), never a silent read.  The kernel copies rows
of bytes, one library for every data dtype (int32 or int64 indices), on
opforge's threads.  The gradient is ``gather_grad``: dy scatter-added into
zeros of data's shape, each thread owning a range of dx's rows.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import TensorSpec
from opforge.builtins.common import FLOATS, HEADER_DIRS, every_dtype, shapes_agree

if TYPE_CHECKING:
    import numpy.typing as npt

INDEX_DTYPES = ("int32", "int64")
gather = opforge.op("gather(Tensor data, Tensor indices, *, int axis=0) -> Tensor y",
                    # always_compute: empty data with indices is still an out-of-range error
                    traits=["no_side_effect", "always_compute"],
                    doc="Take data's slices along axis at indices (int32 or int64; negative ones count from "
                        "the end): y's shape is data's with that axis replaced by indices' shape.")


def gather_problem(data: TensorSpec, indices: TensorSpec, axis: int, op_name: str = "gather") -> str | None:
    if indices.dtype not in INDEX_DTYPES:
        raise opforge.DTypeError(f"op '{op_name}': input 'indices' has dtype {indices.dtype}; expected int32 or int64")
    if data.rank is not None:
        if data.rank == 0:
            return "input 'data' is 0-d; gather needs rank >= 1"
        if not -data.rank <= axis < data.rank:
            return f"axis {axis} is out of range for input 'data' of rank {data.rank} " \
                   f"(valid: {-data.rank}..{data.rank - 1})"
    return None


@gather.check
def gather_check(data: TensorSpec, indices: TensorSpec, *, axis: int) -> str | None:
    return gather_problem(data, indices, axis)


def gathered_shape(data: TensorSpec, indices: TensorSpec, axis: int) -> tuple[int, ...] | None:
    if data.rank is None or indices.rank is None:
        return None
    axis %= data.rank
    return data.shape[:axis] + indices.shape + data.shape[axis + 1:]


@gather.infer
def gather_infer(data: TensorSpec, indices: TensorSpec, *, axis: int) -> TensorSpec:
    return TensorSpec(gathered_shape(data, indices, axis), data.dtype)


def checked_indices(indices: npt.NDArray[Any], size: int, op_name: str) -> npt.NDArray[Any]:
    """indices made non-negative; IndexError-like ShapeError when one is outside -size..size-1."""
    bad = (indices < -size) | (indices >= size)
    if bad.any():
        raise opforge.ShapeError(f"op '{op_name}': input 'indices' holds {indices[bad].reshape(-1)[0]}, out of range "
                                 f"for an axis of size {size} (valid: {-size}..{size - 1})")
    return np.where(indices < 0, indices + size, indices)


@gather.reference(fallback=True)
def gather_reference(data: npt.NDArray[Any], indices: npt.NDArray[Any], *, axis: int) -> npt.NDArray[Any]:
    return np.take(data, checked_indices(indices, data.shape[axis], "gather"), axis=axis)


@gather.grad(save=["data", "indices"])
def gather_grad(saved: Any, dy: Any, *, axis: int) -> tuple[Any, None]:
    return opforge.ops.gather_grad(dy, saved.indices, saved.data, axis=axis), None


# What the index kernels' return code 4 means (gather's and those of gather_elements, gather_nd and
# the scatters): every index is checked before anything is written.
INDEX_ERRORS = {4: "input 'indices' holds an index out of range: each must lie in -n..n-1 for the dim n of "
                   "'data' it indexes (negative ones count from the end)"}

# Both kernels check every index before they write anything.
INDICES_FIT = r"""
// Whether every index is in [-size, size).
template <typename I>
static bool IndicesFit(const I *indices, int64_t n, int64_t size) {
  for (int64_t i = 0; i < n; i++)
    if (int64_t(indices[i]) < -size || int64_t(indices[i]) >= size) return false;
  return true;
}
"""

GATHER_CC = r"""
#include <cstdint>
#include <cstring>

#include "custom_aot_extra.h"
#include "elements.h"
""" + INDICES_FIT + r"""
template <typename I>
static int Run(const char *data, const I *indices, char *y, int64_t outer, int64_t size, int64_t n,
               int64_t row) {
  if (!IndicesFit(indices, n, size)) return 4;  // an index out of range, found before any copy
  // y's rows (outer x n of them) in ranges of at least OPFORGE_COPY_GRAIN bytes on opforge's threads
  opforge::parallel_for(0, outer * n, std::max<int64_t>(1, OPFORGE_COPY_GRAIN / std::max<int64_t>(row, 1)),
                        [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
      const int64_t o = r / n, at = int64_t(indices[r % n]);
      std::memcpy(y + r * row, data + (o * size + (at < 0 ? at + size : at)) * row, row);
    }
  });
  return 0;
}

// params: data, indices, y.  data viewed as [outer, size, inner]: each of
// y's rows of inner elements is data's row at one index.
extern "C" int Gather(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                      void *stream, void *extra) {
  const int rank = ndims[0];
  int64_t axis = static_cast<AotExtra *>(extra)->Attr<int64_t>("axis");
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) return 1;  // the op's check rejects this first
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < rank; d++) {
    if (d < axis) outer *= shapes[0][d];
    if (d > axis) inner *= shapes[0][d];
  }
  const int64_t n = ElementCount(ndims[1], shapes[1]), row = inner * ElementSize(dtypes[0]);
  const char *data = static_cast<const char *>(params[0]);
  char *y = static_cast<char *>(params[2]);
  if (!std::strcmp(dtypes[1], "int64"))
    return Run(data, static_cast<const int64_t *>(params[1]), y, outer, shapes[0][axis], n, row);
  if (!std::strcmp(dtypes[1], "int32"))
    return Run(data, static_cast<const int32_t *>(params[1]), y, outer, shapes[0][axis], n, row);
  return 2;
}
"""
gather.kernel(function="Gather", code=GATHER_CC, include_dirs=HEADER_DIRS, errors=INDEX_ERRORS)


# The gradient is an op too: dx = zeros of data's shape, each dy row added at its index.
gather_grad_op = opforge.op("gather_grad(Tensor dy, Tensor indices, Tensor data, *, int axis=0) -> Tensor dx",
                            traits=["no_side_effect"],
                            doc="Gradient of gather: zeros of data's shape with dy's rows added at indices "
                                "along axis (repeated indices add up; data only lends its shape).")


@gather_grad_op.check
def gather_grad_check(dy: TensorSpec, indices: TensorSpec, data: TensorSpec, *, axis: int) -> str | None:
    if dy.dtype != data.dtype:
        raise opforge.DTypeError(f"op 'gather_grad': inputs 'dy' ({dy.dtype}) and 'data' ({data.dtype}) must have "
                                 "one dtype")
    problem = gather_problem(data, indices, axis, "gather_grad")
    want = gathered_shape(data, indices, axis)
    if problem is None and want is not None and dy.rank is not None and not shapes_agree(want, dy.shape):
        problem = f"input 'dy' has shape {list(dy.shape)}, gather of 'data' at 'indices' gives {list(want)}"
    return problem


@gather_grad_op.infer
def gather_grad_infer(dy: TensorSpec, indices: TensorSpec, data: TensorSpec, *, axis: int) -> TensorSpec:
    return TensorSpec(data.shape, dy.dtype)


@gather_grad_op.reference(fallback=True)
def gather_grad_reference(dy: npt.NDArray[Any], indices: npt.NDArray[Any], data: npt.NDArray[Any], *,
                          axis: int) -> npt.NDArray[Any]:
    axis %= data.ndim
    dx = np.zeros_like(data)
    at = checked_indices(indices, data.shape[axis], "gather_grad").reshape(-1)
    moved = np.moveaxis(dx, axis, 0)  # a view: adding into it adds into dx
    rows = np.moveaxis(dy.reshape(data.shape[:axis] + (at.size,) + data.shape[axis + 1:]), axis, 0)
    np.add.at(moved, at, rows)
    return dx


@gather_grad_op.grad(save=["indices"])
def _(saved: Any, ddx: Any, *, axis: int) -> tuple[Any, None, None]:
    return opforge.ops.gather(ddx, saved.indices, axis=axis), None, None


GATHER_GRAD_CC = r"""
#include <algorithm>
#include <cstdint>

#include "custom_aot_extra.h"
#include "elements.h"
""" + INDICES_FIT + r"""
// Elements a task handles at least; below that, waking the pool costs more than it saves.
constexpr int64_t kParallelWork = int64_t(1) << 15;

template <typename I>
static int Run(const OPFORGE_T *dy, const I *indices, OPFORGE_T *dx, int64_t outer, int64_t size, int64_t n,
               int64_t inner) {
  if (!IndicesFit(indices, n, size)) return 4;  // an index out of range, found before dx is touched
  if (outer == 0) return 0;  // dx is empty
  // Repeated indices add into one row, so tasks split dx's rows, not the indices: each task zeroes its
  // own range of rows of one outer block, then adds every dy row whose index falls in it, in index
  // order (the same sum on any thread count).  One range per thread: each task reads all the indices.
  const int64_t threads = opforge::num_threads();
  const int64_t ranges = outer >= threads ? 1 : std::max<int64_t>(1, std::min(size, (threads + outer - 1) / outer));
  const int64_t height = (size + ranges - 1) / ranges;
  const int64_t work = std::max<int64_t>(1, (n / ranges + height) * inner);
  opforge::parallel_for(0, outer * ranges, std::max<int64_t>(1, kParallelWork / work), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; t++) {
      const int64_t o = t / ranges, first = std::min(size, t % ranges * height), last = std::min(size, first + height);
      OPFORGE_T *block = dx + o * size * inner;
      const OPFORGE_T *rows = dy + o * n * inner;
      std::fill(block + first * inner, block + last * inner, OPFORGE_T(0));
      for (int64_t i = 0; i < n; i++) {
        const int64_t at = int64_t(indices[i]) < 0 ? int64_t(indices[i]) + size : int64_t(indices[i]);
        if (at < first || at >= last) continue;
        OPFORGE_T *row = block + at * inner;
        const OPFORGE_T *from = rows + i * inner;
        for (int64_t j = 0; j < inner; j++) row[j] += from[j];
      }
    }
  });
  return 0;
}

// params: dy, indices, data (shape only), dx.
extern "C" int GatherGrad(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                          void *stream, void *extra) {
  const int rank = ndims[2];
  int64_t axis = static_cast<AotExtra *>(extra)->Attr<int64_t>("axis");
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) return 1;
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < rank; d++) {
    if (d < axis) outer *= shapes[2][d];
    if (d > axis) inner *= shapes[2][d];
  }
  OPFORGE_T *dx = static_cast<OPFORGE_T *>(params[3]);
  const OPFORGE_T *dy = static_cast<const OPFORGE_T *>(params[0]);
  const int64_t n = ElementCount(ndims[1], shapes[1]);
  if (!std::strcmp(dtypes[1], "int64"))
    return Run(dy, static_cast<const int64_t *>(params[1]), dx, outer, shapes[2][axis], n, inner);
  if (!std::strcmp(dtypes[1], "int32"))
    return Run(dy, static_cast<const int32_t *>(params[1]), dx, outer, shapes[2][axis], n, inner);
  return 2;
}
"""
gather_grad_op.kernel(function="GatherGrad", code=every_dtype(GATHER_GRAD_CC, "GatherGrad", FLOATS),
                      dtypes=[(d, None, d) for d in FLOATS], include_dirs=HEADER_DIRS, errors=INDEX_ERRORS)
