"""matmul: y = a @ b for (..., m, k) @ (..., k, n) -> (..., m, n).

The template for an op with its own inference function: it checks the
shapes it can (raising ShapeError that names the op and the dims) and lets
unknown dims (-1) and an unknown rank ([-2]) propagate.  Leading batch dims
must be equal (no batch broadcasting).
"""
import numpy as np

import opforge

matmul = opforge.op("matmul(Tensor a, Tensor b) -> Tensor y", traits=["no_side_effect"],
                    doc="Matrix product of the last two dims, batched over equal leading dims; "
                        "y has the dtype of a.")


@matmul.def_infer
def matmul_infer(a, b):
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
    a_shape = a.shape if a.rank is not None else (-1,) * rank
    b_shape = b.shape if b.rank is not None else (-1,) * rank
    *a_batch, m, k = a_shape
    *b_batch, k2, n = b_shape
    if -1 not in (k, k2) and k != k2:
        raise opforge.ShapeError(f"op 'matmul': a's last dim ({k}) must equal b's second-to-last dim ({k2}); "
                                 f"shapes {list(a.shape)} and {list(b.shape)}")
    batch = []
    for axis, (x, y) in enumerate(zip(a_batch, b_batch)):
        if -1 not in (x, y) and x != y:
            raise opforge.ShapeError(f"op 'matmul': batch dim {axis} differs ({x} in a, {y} in b); shapes "
                                     f"{list(a.shape)} and {list(b.shape)} (batch dims must be equal)")
        batch.append(y if x == -1 else x)  # a known dim wins over -1
    return opforge.TensorSpec((*batch, m, n), a.dtype)


@matmul.reference(fallback=True)
def matmul_reference(a, b):
    return np.matmul(a, b).astype(a.dtype, copy=False)


@matmul.grad(save=["a", "b"])
def matmul_grad(saved, dy):
    transpose = opforge.ops.transpose
    return opforge.ops.matmul(dy, transpose(saved.b)), opforge.ops.matmul(transpose(saved.a), dy)


# k == 0 gives an empty input and a non-empty y: opforge then skips the
# kernel and returns zeros, which is the right (empty-sum) product.
matmul.kernel(function="MatMul", dtypes={"a": ["float32", "float64"], "b": ["float32", "float64"]}, code=r"""
#include "custom_aot_extra.h"

typedef OPFORGE_T T;

extern "C" int MatMul(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                      void *stream, void *extra) {
  const T *a = static_cast<const T *>(params[0]);
  const T *b = static_cast<const T *>(params[1]);
  T *y = static_cast<T *>(params[2]);
  const int rank = ndims[0];
  if (rank < 2 || ndims[1] != rank || ndims[2] != rank) return 1;  // inference rejects these first
  const int64_t m = shapes[0][rank - 2], k = shapes[0][rank - 1], n = shapes[1][rank - 1];
  if (shapes[1][rank - 2] != k) return 2;
  int64_t batch = 1;
  for (int d = 0; d < rank - 2; d++) {
    if (shapes[0][d] != shapes[1][d]) return 3;
    batch *= shapes[0][d];
  }

  for (int64_t s = 0; s < batch; s++) {
    const T *as = a + s * m * k;
    const T *bs = b + s * k * n;
    T *ys = y + s * m * n;
    // i-k-j order: the inner loop runs along rows of b and y, both
    // contiguous, so it streams memory and vectorizes.
    for (int64_t i = 0; i < m; i++) {
      T *row = ys + i * n;
      for (int64_t j = 0; j < n; j++) row[j] = T(0);
      for (int64_t p = 0; p < k; p++) {
        const T aip = as[i * k + p];
        const T *brow = bs + p * n;
        for (int64_t j = 0; j < n; j++) row[j] += aip * brow[j];
      }
    }
  }
  return 0;
}
""")
