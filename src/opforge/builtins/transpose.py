"""transpose: swap the last two axes (a matrix transpose, batched)."""
import numpy as np

import opforge
from opforge import TensorSpec
from opforge.errors import ShapeError

transpose = opforge.op("transpose(Tensor x) -> Tensor y", traits=["no_side_effect"],
                       doc="Swap the last two axes of a tensor of rank >= 2.")


@transpose.infer
def _(x):
    if x.rank is None:
        return x
    if x.rank < 2:
        raise ShapeError(f"op 'transpose' needs rank >= 2, got {list(x.shape)}")
    return TensorSpec(x.shape[:-2] + (x.shape[-1], x.shape[-2]), x.dtype)


@transpose.reference(fallback=True)
def transpose_reference(x):
    return np.swapaxes(x, -1, -2).copy()


@transpose.grad()
def _(saved, dy):
    return opforge.ops.transpose(dy)


transpose.kernel(function="Transpose", dtypes={"x": ["float32", "float64", "int32", "int64"]}, code=r"""
#include "custom_aot_extra.h"

extern "C" int Transpose(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                         void *stream, void *extra) {
  const OPFORGE_T *x = static_cast<const OPFORGE_T *>(params[0]);
  OPFORGE_T *y = static_cast<OPFORGE_T *>(params[1]);
  const int rank = ndims[0];
  if (rank < 2) return 3;
  const int64_t rows = shapes[0][rank - 2], cols = shapes[0][rank - 1];
  int64_t batch = 1;
  for (int d = 0; d < rank - 2; d++) batch *= shapes[0][d];
  for (int64_t b = 0; b < batch; b++) {
    const OPFORGE_T *in = x + b * rows * cols;
    OPFORGE_T *out = y + b * rows * cols;
    for (int64_t r = 0; r < rows; r++)
      for (int64_t c = 0; c < cols; c++) out[c * rows + r] = in[r * cols + c];
  }
  return 0;
}
""")
