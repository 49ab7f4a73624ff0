"""scatter_elements: y = data, with each updates[i] written (or reduced) into
y at i with its ``axis`` coordinate replaced by indices[i] (ONNX
ScatterElements, the inverse of gather_elements).

indices and updates have one shape, of data's rank and no larger than data
on the other axes.  ``reduction``: "none" writes (a repeated index: the last
write wins), "add" / "mul" / "max" / "min" combine with what is there, in
index order.  An index out of range is an error found before anything is
written (KernelError).  The kernel copies data, then walks the updates in
order on one thread (repeated indices make the order part of the result);
float16 and bfloat16 run the NumPy reference.  Gradients for reduction "none"
(dy where nothing was written, for data; dy gathered at the indices, for
updates) and "add" (dy, and dy gathered); mul, max and min have none here.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import TensorSpec
from opforge.builtins.common import HEADER_DIRS, zeros_like
from opforge.builtins.gather import INDEX_ERRORS, checked_indices
from opforge.builtins.gather_elements import elements_problem

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy.typing as npt

REDUCTIONS = ("none", "add", "mul", "max", "min")
# Every dtype the kernel takes (float16 and bfloat16 run the reference).
SCATTER_DTYPES = ["float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                  "bool"]

scatter_elements = opforge.op(
    'scatter_elements(Tensor data, Tensor indices, Tensor updates, *, int axis=0, str reduction="none") -> Tensor y',
    traits=["no_side_effect", "always_compute"],
    doc="data with updates written at indices along axis (y[..., indices[i], ...] = updates[i]); reduction "
        "none, add, mul, max or min combines each update with what is there instead.")


def reduction_problem(op_name: str, data: TensorSpec, updates: TensorSpec, reduction: str) -> str | None:
    """Shared with scatter_nd: the reduction's name, and updates of data's dtype."""
    if updates.dtype != data.dtype:
        raise opforge.DTypeError(f"op '{op_name}': input 'updates' has dtype {updates.dtype}; it must have "
                                 f"data's dtype {data.dtype}")
    if reduction not in REDUCTIONS:
        return f"attribute 'reduction' is {reduction!r}; expected one of {', '.join(REDUCTIONS)}"
    return None


@scatter_elements.check
def scatter_elements_check(data: TensorSpec, indices: TensorSpec, updates: TensorSpec, *, axis: int,
                           reduction: str) -> str | None:
    return (elements_problem("scatter_elements", data, indices, axis, ("updates", updates))
            or reduction_problem("scatter_elements", data, updates, reduction))


@scatter_elements.infer
def scatter_elements_infer(data: TensorSpec, indices: TensorSpec, updates: TensorSpec, *, axis: int,
                           reduction: str) -> TensorSpec:
    return data


#: reduction -> the NumPy ufunc whose ``at`` applies it in index order
UFUNCS = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def scattered(y: npt.NDArray[Any], where: tuple[Any, ...], updates: npt.NDArray[Any], reduction: str) -> None:
    """Write or reduce updates into y at the index arrays ``where``, in order (shared with scatter_nd)."""
    if reduction == "none":
        for k in range(updates.size):  # in order, so the last of repeated indices wins as in the kernel
            y[tuple(w.reshape(-1)[k] for w in where)] = updates.reshape(-1)[k]
    else:
        with np.errstate(all="ignore"):  # NaNs propagate, overflow wraps: as in the kernel, without warnings
            UFUNCS[reduction].at(y, where, updates)


@scatter_elements.reference(fallback=True)
def scatter_elements_reference(data: npt.NDArray[Any], indices: npt.NDArray[Any], updates: npt.NDArray[Any], *,
                               axis: int, reduction: str) -> npt.NDArray[Any]:
    axis %= data.ndim
    at = checked_indices(indices, data.shape[axis], "scatter_elements")
    grids: tuple[npt.NDArray[Any], ...] = tuple(np.indices(indices.shape, sparse=True))
    where = tuple(np.broadcast_to(at if d == axis else grid, indices.shape) for d, grid in enumerate(grids))
    y: npt.NDArray[Any] = data.copy()
    scattered(y, where, updates, reduction)
    return y


def scatter_grad(op_name: str, saved: Any, dy: Any, reduction: str, gather: Callable[[Any, Any], Any],
                 scatter: Callable[[Any, Any, Any], Any]) -> tuple[Any, None, Any]:
    """(d data, None, d updates) of a scatter with reduction "none" or "add", given its op's gather and scatter
    at the same indices: updates get dy gathered there; data gets dy, zeroed where "none" overwrote it.  (With
    an index repeated under "none", each of its updates gets the gradient, though only the last one is kept.)
    Shared by scatter_nd."""
    dupdates = gather(dy, saved.indices)
    if reduction == "add":
        return dy, None, dupdates
    if reduction != "none":
        raise opforge.GradientError(f"op '{op_name}': no gradient for reduction {reduction!r} (only for 'none' "
                                    "and 'add')")
    return scatter(dy, saved.indices, zeros_like(saved.updates, dy.dtype)), None, dupdates


@scatter_elements.grad(save=["indices", "updates"])
def scatter_elements_grad(saved: Any, dy: Any, *, axis: int, reduction: str) -> tuple[Any, None, Any]:
    return scatter_grad("scatter_elements", saved, dy, reduction,
                        lambda t, at: opforge.ops.gather_elements(t, at, axis=axis),
                        lambda t, at, u: opforge.ops.scatter_elements(t, at, u, axis=axis))


# indexing.h: AxisWalk (where an index lands), Reduce<R> and the dispatch over reductions and dtypes.
SCATTER_ELEMENTS_CC = r"""
#include "indexing.h"

template <int R, typename E, typename I>
static int Run(const void *data, const I *indices, const void *updates_, void *y_, const AxisWalk &w,
               int64_t count) {
  if (!w.Fits(indices)) return 4;  // an index out of range, found before any write
  ParallelCopy(y_, data, count * int64_t(sizeof(E)));
  E *y = static_cast<E *>(y_);
  const E *updates = static_cast<const E *>(updates_);
  for (int64_t r = 0; r < w.rows; r++) {
    const int64_t base = w.Base(r);
    const I *row = indices + r * w.last;
    const E *from = updates + r * w.last;
    for (int64_t j = 0; j < w.last; j++) Reduce<R>(y[w.At(base, j, row[j])], from[j]);
  }
  return 0;
}

template <typename I>
static int Typed(int r, const char *dtype, void **params, const I *indices, const AxisWalk &w, int64_t count) {
#define OPFORGE_CALL(R_, E_) Run<R_, E_, I>(params[0], indices, params[2], params[3], w, count)
  OPFORGE_SCATTER_DISPATCH(r, dtype, OPFORGE_CALL);
#undef OPFORGE_CALL
}

// params: data, indices, updates, y.
extern "C" int ScatterElements(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                               void *stream, void *extra) {
  try {
    const int rank = ndims[0];
    if (rank < 1 || ndims[1] != rank || ndims[2] != rank) return 1;  // the op's check rejects these first
    for (int d = 0; d < rank; d++)
      if (shapes[1][d] != shapes[2][d]) return 3;
    const int64_t axis = AxisOf(extra, rank);
    const int r = ReductionOf(extra);
    if (axis < 0 || r < 0) return 1;
    AxisWalk w;
    if (int status = w.Init(rank, shapes[0], shapes[1], axis)) return status;
    const int64_t count = ElementCount(rank, shapes[0]);
    return ByIndexType(dtypes[1], params[1],
                       [&](const auto *indices) { return Typed(r, dtypes[0], params, indices, w, count); });
  } catch (...) {
    return 5;
  }
}
"""
scatter_elements.kernel(function="ScatterElements", code=SCATTER_ELEMENTS_CC, include_dirs=HEADER_DIRS,
                        dtypes=[(d, None, d) for d in SCATTER_DTYPES], errors=INDEX_ERRORS)
