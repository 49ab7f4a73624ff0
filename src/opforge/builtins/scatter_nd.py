"""scatter_nd: y = data with slices of updates written (or reduced) where the
index tuples of indices' last axis point (ONNX ScatterND, the inverse of
gather_nd).

updates has the shape gather_nd(data, indices) would give.  ``reduction``:
"none" writes (a repeated tuple: the last write wins), "add" / "mul" /
"max" / "min" combine, in index order.  ``batch_dims`` (opforge's; ONNX
ScatterND has none, so only 0 exports) lets indices share leading dims
with data, as gather_nd's does.  An index out of range is an error found
before anything is written (KernelError).  The kernel copies data, then
walks the tuples in order on one thread; float16 and bfloat16 run the NumPy
reference.  Gradients for reduction "none" (dy where nothing was written,
for data; dy gathered at the tuples, for updates) and "add".
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import TensorSpec
from opforge.builtins.common import HEADER_DIRS
from opforge.builtins.gather import INDEX_ERRORS
from opforge.builtins.gather_nd import gathered_nd_shape, nd_places, nd_problem
from opforge.builtins.scatter_elements import SCATTER_DTYPES, reduction_problem, scatter_grad, scattered

if TYPE_CHECKING:
    import numpy.typing as npt

scatter_nd = opforge.op(
    'scatter_nd(Tensor data, Tensor indices, Tensor updates, *, str reduction="none", int batch_dims=0) '
    "-> Tensor y",
    traits=["no_side_effect", "always_compute"],
    doc="data with the slices of updates written at the index tuples along indices' last axis; reduction "
        "none, add, mul, max or min combines each with what is there instead (ONNX ScatterND).")


@scatter_nd.check
def scatter_nd_check(data: TensorSpec, indices: TensorSpec, updates: TensorSpec, *, reduction: str,
                     batch_dims: int) -> str | None:
    problem = nd_problem("scatter_nd", data, indices, batch_dims) or \
        reduction_problem("scatter_nd", data, updates, reduction)
    want = gathered_nd_shape(data, indices, batch_dims)
    if problem is None and want is not None and updates.rank is not None and (
            len(want) != updates.rank or any(-1 not in (a, b) and a != b for a, b in zip(want, updates.shape))):
        problem = f"input 'updates' has shape {list(updates.shape)}; data and indices want {list(want)}"
    return problem


@scatter_nd.infer
def scatter_nd_infer(data: TensorSpec, indices: TensorSpec, updates: TensorSpec, *, reduction: str,
                     batch_dims: int) -> TensorSpec:
    return data


@scatter_nd.reference(fallback=True)
def scatter_nd_reference(data: npt.NDArray[Any], indices: npt.NDArray[Any], updates: npt.NDArray[Any], *,
                         reduction: str, batch_dims: int) -> npt.NDArray[Any]:
    places = nd_places(data.shape, indices, batch_dims, "scatter_nd")
    # Element by element, in order: the slice dims join the tuple's index arrays.
    outer, rest = indices.shape[:-1], data.shape[len(places):]
    shape = outer + rest
    grids: tuple[npt.NDArray[Any], ...] = tuple(np.indices(shape, sparse=True))
    slice_grids = grids[len(outer):]
    where = tuple(np.broadcast_to(w, shape) for w in
                  [p.reshape(outer + (1,) * len(rest)) for p in places] + list(slice_grids))
    y: npt.NDArray[Any] = data.copy()
    scattered(y, where, np.broadcast_to(updates, shape), reduction)
    return y


@scatter_nd.grad(save=["indices", "updates"])
def scatter_nd_grad(saved: Any, dy: Any, *, reduction: str, batch_dims: int) -> tuple[Any, None, Any]:
    return scatter_grad("scatter_nd", saved, dy, reduction,
                        lambda t, at: opforge.ops.gather_nd(t, at, batch_dims=batch_dims),
                        lambda t, at, u: opforge.ops.scatter_nd(t, at, u, batch_dims=batch_dims))


# indexing.h: NdWalk (where a tuple's slice is), Reduce<R> and the dispatch over reductions and dtypes.
SCATTER_ND_CC = r"""
#include "indexing.h"

template <int R, typename E, typename I>
static int Run(const void *data, const I *indices, const void *updates_, void *y_, const NdWalk &w,
               int64_t count) {
  if (!w.Fits(indices)) return 4;  // an index out of range, found before any write
  ParallelCopy(y_, data, count * int64_t(sizeof(E)));
  E *y = static_cast<E *>(y_);
  const E *updates = static_cast<const E *>(updates_);
  for (int64_t t = 0; t < w.batches * w.tuples; t++) {
    E *into = y + w.Start(t, indices);
    const E *from = updates + t * w.slice;
    for (int64_t j = 0; j < w.slice; j++) Reduce<R>(into[j], from[j]);
  }
  return 0;
}

template <typename I>
static int Typed(int r, const char *dtype, void **params, const I *indices, const NdWalk &w, int64_t count) {
#define OPFORGE_CALL(R_, E_) Run<R_, E_, I>(params[0], indices, params[2], params[3], w, count)
  OPFORGE_SCATTER_DISPATCH(r, dtype, OPFORGE_CALL);
#undef OPFORGE_CALL
}

// params: data, indices, updates, y.
extern "C" int ScatterNd(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                         void *stream, void *extra) {
  try {
    NdWalk w;
    const int64_t batch_dims = static_cast<AotExtra *>(extra)->Attr<int64_t>("batch_dims");
    if (int status = w.Init(ndims[0], shapes[0], ndims[1], shapes[1], batch_dims)) return status;
    if (ElementCount(ndims[2], shapes[2]) != w.batches * w.tuples * w.slice) return 3;
    const int r = ReductionOf(extra);
    if (r < 0) return 1;
    const int64_t count = ElementCount(ndims[0], shapes[0]);
    return ByIndexType(dtypes[1], params[1],
                       [&](const auto *indices) { return Typed(r, dtypes[0], params, indices, w, count); });
  } catch (...) {
    return 5;
  }
}
"""
scatter_nd.kernel(function="ScatterNd", code=SCATTER_ND_CC, include_dirs=HEADER_DIRS,
                  dtypes=[(d, None, d) for d in SCATTER_DTYPES], errors=INDEX_ERRORS)
