"""matmul: y = a @ b for (..., m, k) @ (..., k, n) -> (..., m, n).

The template for an op with its own inference function: it checks the
shapes it can (raising ShapeError that names the op and the dims) and lets
unknown dims (-1) and an unknown rank ([-2]) propagate.  a and b have equal
ranks; a batch dim of 1 broadcasts against the other's (the ONNX converter
unsqueezes 1-D and lower-rank operands first).  The kernel calls OpenBLAS's
gemm once per batch entry, or once in all when b has a single matrix; it is
selected only where OpenBLAS is installed (``opforge.runtime.blas``), else
the NumPy reference runs (np.matmul is BLAS too).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge.builtins.common import FLOATS, gpu_source, known_dims, same_dtypes
from opforge.runtime import blas, cublas
from opforge.sbp import broadcast, elementwise_splits, partial_sum, split

if TYPE_CHECKING:
    import numpy.typing as npt

    from opforge import TensorSpec
    from opforge.sbp import SBPValue

matmul = opforge.op("matmul(Tensor a, Tensor b) -> Tensor y", traits=["no_side_effect"],
                    doc="Matrix product of the last two dims, batched over leading dims that are equal or 1 "
                        "(broadcast); y has the dtype of a.")


@matmul.def_infer
def matmul_infer(a: TensorSpec, b: TensorSpec) -> TensorSpec:
    for name, spec in (("a", a), ("b", b)):
        if spec.rank is not None and spec.rank < 2:
            raise opforge.ShapeError(f"op 'matmul': input '{name}' has rank {spec.rank} (shape {list(spec.shape)}); "
                                     "matmul needs rank >= 2")
    if a.rank is None and b.rank is None:
        return opforge.TensorSpec(None, a.dtype)  # unknown rank
    if a.rank is not None and b.rank is not None and a.rank != b.rank:
        raise opforge.ShapeError(f"op 'matmul': inputs have ranks {a.rank} and {b.rank} (shapes {list(a.shape)} and "
                                 f"{list(b.shape)}); matmul needs equal ranks")
    # Equal ranks, so a known rank on either side fixes the other's: fill an
    # unknown-rank input with -1 dims.
    rank = a.rank if a.rank is not None else b.rank
    assert rank is not None  # (for the type checker: both ranks unknown returned above)
    a_shape = a.shape if a.rank is not None else (-1,) * rank
    b_shape = b.shape if b.rank is not None else (-1,) * rank
    *a_batch, m, k = a_shape
    *b_batch, k2, n = b_shape
    if -1 not in (k, k2) and k != k2:
        raise opforge.ShapeError(f"op 'matmul': a's last dim ({k}) must equal b's second-to-last dim ({k2}); "
                                 f"shapes {list(a.shape)} and {list(b.shape)}")
    batch = []
    for axis, (x, y) in enumerate(zip(a_batch, b_batch)):
        if -1 not in (x, y) and x != y and 1 not in (x, y):
            raise opforge.ShapeError(f"op 'matmul': batch dim {axis} differs ({x} in a, {y} in b); shapes "
                                     f"{list(a.shape)} and {list(b.shape)} (batch dims must be equal, or 1)")
        if x == 1 or y == 1:
            batch.append(y if x == 1 else x)  # 1 broadcasts (to -1 when the other is unknown)
        else:
            batch.append(y if x == -1 else x)  # a known dim wins over -1
    return opforge.TensorSpec((*batch, m, n), a.dtype)


@matmul.sbp
def matmul_sbp(a: TensorSpec, b: TensorSpec) -> list[dict[str, SBPValue]]:
    # OneFlow's: rows of a, or columns of b, split the product; splitting the shared dim k gives
    # partial products; either operand's addends times the other give addends.  Batch dims split
    # as an elementwise op's (a batch dim of 1 is broadcast).
    rank = a.rank if a.rank is not None else b.rank
    if rank is not None and rank < 2:
        return []  # inference rejects it
    row, col = (-2, -1) if rank is None else (rank - 2, rank - 1)
    signatures: list[dict[str, SBPValue]] = [{"a": split(row), "b": broadcast, "y": split(row)},
                                             {"a": broadcast, "b": split(col), "y": split(col)},
                                             {"a": split(col), "b": split(row), "y": partial_sum},
                                             {"a": partial_sum, "b": broadcast, "y": partial_sum},
                                             {"a": broadcast, "b": partial_sum, "y": partial_sum}]
    if a.rank is not None and b.rank is not None:
        signatures += [{"a": on_a, "b": on_b, "y": split(axis)}
                       for axis, (on_a, on_b) in elementwise_splits(a.shape[:-2], b.shape[:-2])]
    return signatures


@matmul.reference(fallback=True)
def matmul_reference(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> npt.NDArray[Any]:
    y: npt.NDArray[Any] = np.matmul(a, b)
    return y.astype(a.dtype, copy=False)


def unbroadcast(grad: Any, own: Sequence[int], other: Sequence[int]) -> Any:
    """``grad`` summed over the batch axes where ``own`` (an input's dims) is 1 and
    ``other`` (the other input's) is not: the axes the forward pass broadcast.
    An unknown dim counts as not broadcast."""
    if len(own) < 2 or own == other:
        return grad
    axes = [d for d in range(len(own) - 2) if own[d] == 1 and other[d] != 1]
    return opforge.ops.reduce_sum(grad, axes=axes, keep_dims=True) if axes else grad


@matmul.grad(save=["a", "b"])
def matmul_grad(saved: Any, dy: Any) -> tuple[Any, Any]:
    transpose = opforge.ops.transpose
    a_dims, b_dims = known_dims(saved.a), known_dims(saved.b)
    da = opforge.ops.matmul(dy, transpose(saved.b))
    db = opforge.ops.matmul(transpose(saved.a), dy)
    return unbroadcast(da, a_dims, b_dims), unbroadcast(db, b_dims, a_dims)


# k == 0 gives empty inputs and a non-empty y, which the kernel fills with
# zeros: the empty-sum product.
MATMUL = r"""
#include "custom_aot_extra.h"
#include "opforge_blas.h"

typedef OPFORGE_T T;

// y[s] = a[s] @ b[s] for every batch entry s (a or b broadcast along dims of size 1).  One product per
// entry: on the pool a group of entries at a time where they are small, else each cut for the pool.
static void Batched(const T *a, const T *b, T *y, int rank, const int64_t *as, const int64_t *bs, const int64_t *ys,
                    int64_t m, int64_t n, int64_t k, int64_t batch) {
  // (an entry OpforgeGemmParallel would not cut is small too; and with OpenBLAS given threads of its own,
  // the entries run one after another, each on OpenBLAS's threads)
  const bool small = !OpforgeGemmCuts(m, n, k) && scipy_openblas_get_num_threads() <= 1;
  auto product = [&](int64_t s) {
    // The batch index s of y, split into dims, gives a's and b's matrices (0 along a broadcast dim).
    int64_t rest = s, offset_a = 0, offset_b = 0, stride_a = m * k, stride_b = k * n;
    for (int d = rank - 3; d >= 0; d--) {
      const int64_t index = rest % ys[d];
      rest /= ys[d];
      if (as[d] != 1) offset_a += index * stride_a;
      if (bs[d] != 1) offset_b += index * stride_b;
      stride_a *= as[d];
      stride_b *= bs[d];
    }
    if (small)
      OpforgeGemm(false, false, m, n, k, T(1), a + offset_a, k, b + offset_b, n, T(0), y + s * m * n, n);
    else
      OpforgeGemmParallel(false, false, m, n, k, T(1), a + offset_a, k, b + offset_b, n, T(0), y + s * m * n, n);
  };
  if (small) {
    opforge::parallel_for(0, batch, std::max<int64_t>(1, kOpforgeGemmTaskWork / std::max<int64_t>(1, m * n * k)),
                          [&](int64_t lo, int64_t hi) {
                            for (int64_t s = lo; s < hi; s++) product(s);
                          });
  } else {
    for (int64_t s = 0; s < batch; s++) product(s);
  }
}

extern "C" int MatMul(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                      void *stream, void *extra) {
  const T *a = static_cast<const T *>(params[0]);
  const T *b = static_cast<const T *>(params[1]);
  T *y = static_cast<T *>(params[2]);
  const int rank = ndims[0];
  if (rank < 2 || ndims[1] != rank || ndims[2] != rank) return 1;  // inference rejects these first
  const int64_t *as = shapes[0], *bs = shapes[1], *ys = shapes[2];
  const int64_t m = as[rank - 2], k = as[rank - 1], n = bs[rank - 1];
  if (bs[rank - 2] != k) return 2;
  int64_t batch = 1;
  bool a_whole = true, b_single = true;  // a not broadcast; b one matrix for every batch entry
  for (int d = 0; d < rank - 2; d++) {
    if ((as[d] != ys[d] && as[d] != 1) || (bs[d] != ys[d] && bs[d] != 1)) return 3;
    batch *= ys[d];
    a_whole = a_whole && as[d] == ys[d];
    b_single = b_single && bs[d] == 1;
  }
  if (!OpforgeBlasFits({m, n, k, batch * m})) return 4;
  try {  // (the pool): nothing crosses the ABI
    if (a_whole && b_single) {  // the batch's rows of a are one (batch * m, k) matrix
      OpforgeGemmParallel(false, false, batch * m, n, k, T(1), a, k, b, n, T(0), y, n);
      return 0;
    }
    Batched(a, b, y, rank, as, bs, ys, m, n, k, batch);
  } catch (...) {
    return 5;
  }
  return 0;
}
"""
blas.requiring(matmul.kernel(function="MatMul", dtypes={"a": FLOATS, "b": FLOATS}, code=MATMUL))
# GPU: cuBLAS gemm, loaded at run time (a missing cuBLAS is the kernel's KernelError, see runtime/cublas.py).
gpu_matmul = matmul.kernel(source=gpu_source("matmul.cu", "MatMulGpu"), device="gpu",
                           dtypes=same_dtypes(FLOATS, inputs=2))
gpu_matmul.requires = cublas.prepare
