"""gather_nd: y = the slices of data that the last axis of indices points at
(ONNX GatherND).

indices' last dim k says how many leading dims of data (after the first
``batch_dims``, which indices shares with data) an index tuple gives; each
tuple picks one slice of data's remaining dims.  y's shape is indices' without
its last dim, then data's dims after batch_dims + k.  Negative indices count
from the end; an index out of range is an error found before anything is
written (KernelError).  The kernel copies slices of bytes, one library for
every dtype (int32 or int64 indices), on opforge's threads.  The gradient is
scatter_nd with reduction "add" of dy into zeros of data's shape.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import TensorSpec
from opforge.builtins.common import HEADER_DIRS, zeros_like
from opforge.builtins.gather import INDEX_DTYPES, INDEX_ERRORS

if TYPE_CHECKING:
    import numpy.typing as npt

gather_nd = opforge.op(
    "gather_nd(Tensor data, Tensor indices, *, int batch_dims=0) -> Tensor y",
    traits=["no_side_effect", "always_compute"],
    doc="The slices of data at the index tuples along indices' last axis (int32 or int64; negative ones count "
        "from the end), after batch_dims leading dims data and indices share (ONNX GatherND).")


def nd_problem(op_name: str, data: TensorSpec, indices: TensorSpec, batch_dims: int) -> str | None:
    """What is wrong with data / indices for batch_dims, or None (shared with scatter_nd)."""
    if indices.dtype not in INDEX_DTYPES:
        raise opforge.DTypeError(f"op '{op_name}': input 'indices' has dtype {indices.dtype}; expected int32 or "
                                 "int64")
    if batch_dims < 0:
        return f"attribute 'batch_dims' is {batch_dims}; it must be >= 0"
    if indices.rank is not None:
        if indices.rank <= batch_dims:
            return f"input 'indices' has rank {indices.rank}; it needs more than batch_dims ({batch_dims}) dims"
        k = indices.shape[-1]
        if data.rank is not None:
            if data.rank <= batch_dims:
                return f"input 'data' has rank {data.rank}; it needs more than batch_dims ({batch_dims}) dims"
            if k != -1 and batch_dims + k > data.rank:
                return f"input 'indices' has tuples of {k} indices; input 'data' of rank {data.rank} has only " \
                       f"{data.rank - batch_dims} dims after batch_dims ({batch_dims})"
            for d in range(batch_dims):
                if -1 not in (data.shape[d], indices.shape[d]) and data.shape[d] != indices.shape[d]:
                    return f"batch dim {d} is {data.shape[d]} in input 'data' and {indices.shape[d]} in input " \
                           "'indices'; the batch dims must match"
    return None


def gathered_nd_shape(data: TensorSpec, indices: TensorSpec, batch_dims: int) -> tuple[int, ...] | None:
    if data.rank is None or indices.rank is None or indices.shape[-1] == -1:
        return None
    return tuple(indices.shape[:-1]) + tuple(data.shape[batch_dims + indices.shape[-1]:])


@gather_nd.check
def gather_nd_check(data: TensorSpec, indices: TensorSpec, *, batch_dims: int) -> str | None:
    return nd_problem("gather_nd", data, indices, batch_dims)


@gather_nd.infer
def gather_nd_infer(data: TensorSpec, indices: TensorSpec, *, batch_dims: int) -> TensorSpec:
    return TensorSpec(gathered_nd_shape(data, indices, batch_dims), data.dtype)


def nd_places(data_shape: tuple[int, ...], indices: npt.NDArray[Any], batch_dims: int,
              op_name: str) -> tuple[npt.NDArray[Any], ...]:
    """Index arrays into data, one per dim up to batch_dims + k, each of indices' shape without its last dim
    (batch coordinates first); a ShapeError for an index out of range (shared with scatter_nd)."""
    k = indices.shape[-1]
    outer = indices.shape[:-1]
    grids: tuple[npt.NDArray[Any], ...] = tuple(np.indices(outer, sparse=True))
    places = [np.broadcast_to(g, outer) for g in grids[:batch_dims]]
    for j in range(k):
        size = data_shape[batch_dims + j]
        column = indices[..., j].astype(np.int64)
        bad = (column < -size) | (column >= size)
        if bad.any():
            raise opforge.ShapeError(f"op '{op_name}': input 'indices' holds {column[bad].reshape(-1)[0]}, out of "
                                     f"range for dim {batch_dims + j} of data of size {size} (valid: {-size}.."
                                     f"{size - 1})")
        places.append(np.where(column < 0, column + size, column))
    return tuple(places)


@gather_nd.reference(fallback=True)
def gather_nd_reference(data: npt.NDArray[Any], indices: npt.NDArray[Any], *, batch_dims: int) -> npt.NDArray[Any]:
    places = nd_places(data.shape, indices, batch_dims, "gather_nd")
    if not places:  # tuples of no indices, no batch dims: each picks all of data
        return np.array(np.broadcast_to(data, indices.shape[:-1] + data.shape))
    y: npt.NDArray[Any] = data[places]
    return y


@gather_nd.grad(save=["data", "indices"])
def gather_nd_grad(saved: Any, dy: Any, *, batch_dims: int) -> tuple[Any, None]:
    zeros = zeros_like(saved.data, dy.dtype)
    return opforge.ops.scatter_nd(zeros, saved.indices, dy, reduction="add", batch_dims=batch_dims), None


# indexing.h: NdWalk (where a tuple's slice is), shared with scatter_nd.
GATHER_ND_CC = r"""
#include "indexing.h"

template <typename I>
static int Run(const char *data, const I *indices, char *y, const NdWalk &w, int64_t element) {
  if (!w.Fits(indices)) return 4;  // an index out of range, found before any copy
  const int64_t row = w.slice * element;
  opforge::parallel_for(0, w.batches * w.tuples, std::max<int64_t>(1, OPFORGE_COPY_GRAIN / std::max<int64_t>(row, 1)),
                        [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; t++) std::memcpy(y + t * row, data + w.Start(t, indices) * element, row);
  });
  return 0;
}

// params: data, indices, y.
extern "C" int GatherNd(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                        void *stream, void *extra) {
  try {
    NdWalk w;
    const int64_t batch_dims = static_cast<AotExtra *>(extra)->Attr<int64_t>("batch_dims");
    if (int status = w.Init(ndims[0], shapes[0], ndims[1], shapes[1], batch_dims)) return status;
    const char *data = static_cast<const char *>(params[0]);
    char *y = static_cast<char *>(params[2]);
    return ByIndexType(dtypes[1], params[1],
                       [&](const auto *indices) { return Run(data, indices, y, w, ElementSize(dtypes[0])); });
  } catch (...) {
    return 5;
  }
}
"""
gather_nd.kernel(function="GatherNd", code=GATHER_ND_CC, include_dirs=HEADER_DIRS, errors=INDEX_ERRORS)
