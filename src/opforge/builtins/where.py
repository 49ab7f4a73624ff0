"""where: out = x where condition else y, with NumPy broadcasting of all three.

The kernel walks the output with add.py's broadcasting helpers, carrying one
offset per input.
"""
import numpy as np

import opforge
from opforge import TensorSpec
from opforge.builtins.add import BROADCAST_HELPERS, sum_to
from opforge.builtins.common import NUMERIC, every_dtype
from opforge.infer import broadcast_shapes

where = opforge.op("where(Tensor condition, Tensor x, Tensor y) -> Tensor out",
                   traits=["no_side_effect", "elementwise"],
                   doc="Elementwise choice: x where condition is true, else y (broadcasting all three); "
                       "condition is bool, x and y share a dtype.")


@where.infer
def where_infer(condition, x, y):
    return TensorSpec(broadcast_shapes(condition.shape, x.shape, y.shape), x.dtype)


@where.check
def where_check(condition, x, y):
    if condition.dtype != "bool":
        raise opforge.DTypeError(f"op 'where': input 'condition' has dtype {condition.dtype}; it must be bool "
                                 "(compare with a comparison op, or cast it)")
    if x.dtype != y.dtype:
        raise opforge.DTypeError(f"op 'where': inputs 'x' ({x.dtype}) and 'y' ({y.dtype}) must have one dtype")


@where.reference
def where_reference(condition, x, y):
    return np.where(condition, x, y)


@where.grad(save=["condition", "x", "y"])
def where_grad(saved, dout):
    ops = opforge.ops
    zero = np.zeros((), dout.dtype)
    return (None, sum_to(ops.where(saved.condition, dout, zero), saved.x),
            sum_to(ops.where(saved.condition, zero, dout), saved.y))


WHERE = BROADCAST_HELPERS + r"""
extern "C" int Where(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                     void *stream, void *extra) {
  const bool *c = static_cast<const bool *>(params[0]);
  const T *x = static_cast<const T *>(params[1]);
  const T *y = static_cast<const T *>(params[2]);
  T *out = static_cast<T *>(params[3]);
  const int rank = ndims[3];
  const int64_t *shape = shapes[3];
  const int64_t n = Count(rank, shape);
  if (n == 0) return 0;
  if (rank == 0) {
    out[0] = c[0] ? x[0] : y[0];
    return 0;
  }
  // One odometer over the output's outer dims, carrying each input's offset
  // (stride 0 along the dims it is broadcast over).
  std::vector<int64_t> sc(rank), sx(rank), sy(rank), index(rank, 0);
  BroadcastStrides(ndims[0], shapes[0], rank, sc.data());
  BroadcastStrides(ndims[1], shapes[1], rank, sx.data());
  BroadcastStrides(ndims[2], shapes[2], rank, sy.data());
  const int64_t inner = shape[rank - 1];
  const int64_t ic = sc[rank - 1], ix = sx[rank - 1], iy = sy[rank - 1];
  int64_t oc = 0, ox = 0, oy = 0;
  for (int64_t start = 0; start < n; start += inner) {
    for (int64_t j = 0; j < inner; j++) out[start + j] = c[oc + j * ic] ? x[ox + j * ix] : y[oy + j * iy];
    for (int d = rank - 2; d >= 0; d--) {
      oc += sc[d];
      ox += sx[d];
      oy += sy[d];
      if (++index[d] < shape[d]) break;
      oc -= sc[d] * shape[d];
      ox -= sx[d] * shape[d];
      oy -= sy[d] * shape[d];
      index[d] = 0;
    }
  }
  return 0;
}
"""
VALUE_DTYPES = NUMERIC + ["bool"]
where.kernel(function="Where", code=every_dtype(WHERE, "Where", VALUE_DTYPES, by=1),
             dtypes=[("bool", d, d) for d in VALUE_DTYPES])
