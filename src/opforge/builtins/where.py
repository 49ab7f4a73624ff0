"""where: out = x where condition else y, with NumPy broadcasting of all three.

The kernel walks the output with add.py's broadcasting helpers, carrying one
offset per input, in ranges of rows on opforge's threads.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import TensorSpec
from opforge.builtins.add import BROADCAST_HELPERS, sum_to
from opforge.builtins.common import NUMERIC, every_dtype
from opforge.infer import broadcast_shapes

if TYPE_CHECKING:
    import numpy.typing as npt

where = opforge.op("where(Tensor condition, Tensor x, Tensor y) -> Tensor out",
                   traits=["no_side_effect", "elementwise"],
                   doc="Elementwise choice: x where condition is true, else y (broadcasting all three); "
                       "condition is bool, x and y share a dtype.")


@where.infer
def where_infer(condition: TensorSpec, x: TensorSpec, y: TensorSpec) -> TensorSpec:
    return TensorSpec(broadcast_shapes(condition.shape, x.shape, y.shape), x.dtype)


@where.check
def where_check(condition: TensorSpec, x: TensorSpec, y: TensorSpec) -> None:
    if condition.dtype != "bool":
        raise opforge.DTypeError(f"op 'where': input 'condition' has dtype {condition.dtype}; it must be bool "
                                 "(compare with a comparison op, or cast it)")
    if x.dtype != y.dtype:
        raise opforge.DTypeError(f"op 'where': inputs 'x' ({x.dtype}) and 'y' ({y.dtype}) must have one dtype")


@where.reference
def where_reference(condition: npt.NDArray[Any], x: npt.NDArray[Any], y: npt.NDArray[Any]) -> npt.NDArray[Any]:
    out: npt.NDArray[Any] = np.where(condition, x, y)
    return out


@where.grad(save=["condition", "x", "y"])
def where_grad(saved: Any, dout: Any) -> tuple[None, Any, Any]:
    ops = opforge.ops
    zero = np.zeros((), dout.dtype)
    return (None, sum_to(ops.where(saved.condition, dout, zero), saved.x),
            sum_to(ops.where(saved.condition, zero, dout), saved.y))


WHERE = BROADCAST_HELPERS + r"""
#include <cstring>
#include <type_traits>

// n elements of out, each input read with its own element step (1:
// contiguous, 0: broadcast).  Both values are loaded before the choice, so
// the all-contiguous loop is a branch-free blend the compiler vectorizes.
// The contiguous loop chooses by bits (a mask from the condition byte), which
// vectorizes for every element type and never branches on the data.
typedef std::conditional<sizeof(T) == 8, uint64_t,
        std::conditional<sizeof(T) == 4, uint32_t, std::conditional<sizeof(T) == 2, uint16_t, uint8_t>::type>::type>::type
    Bits;

static void Choose(const bool *c, int64_t ic, const T *x, int64_t ix, const T *y, int64_t iy, T *out, int64_t n) {
  if (ic == 1 && ix == 1 && iy == 1) {
    const uint8_t *cb = reinterpret_cast<const uint8_t *>(c);
    for (int64_t i = 0; i < n; i++) {
      Bits a, b, r;
      std::memcpy(&a, x + i, sizeof(T));
      std::memcpy(&b, y + i, sizeof(T));
      const Bits mask = Bits(0) - Bits(cb[i] != 0);
      r = (a & mask) | (b & ~mask);
      std::memcpy(out + i, &r, sizeof(T));
    }
  } else if (ic == 0) {  // one condition for the whole run: a copy of one side
    const T *from = c[0] ? x : y;
    const int64_t step = c[0] ? ix : iy;
    for (int64_t i = 0; i < n; i++) out[i] = from[i * step];
  } else {
    for (int64_t i = 0; i < n; i++) {
      const T a = x[i * ix], b = y[i * iy];
      out[i] = c[i * ic] ? a : b;
    }
  }
}

extern "C" int Where(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                     void *stream, void *extra) {
  const bool *c = static_cast<const bool *>(params[0]);
  const T *x = static_cast<const T *>(params[1]);
  const T *y = static_cast<const T *>(params[2]);
  T *out = static_cast<T *>(params[3]);
  const int rank = ndims[3];
  const int64_t n = Count(rank, shapes[3]);
  if (n == 0) return 0;
  if (Count(ndims[0], shapes[0]) == n && Count(ndims[1], shapes[1]) == n && Count(ndims[2], shapes[2]) == n) {
    // all of the output's shape: one linear run, cut into ranges for the pool
    opforge::parallel_for(0, n, OPFORGE_GRAIN,
                          [&](int64_t lo, int64_t hi) { Choose(c + lo, 1, x + lo, 1, y + lo, 1, out + lo, hi - lo); });
    return 0;
  }
  // Rows of the coalesced output, one offset per input carried by an
  // odometer (stride 0 along the dims it is broadcast over); ranges of rows in parallel.
  std::vector<int64_t> shape(shapes[3], shapes[3] + rank);
  std::vector<int64_t> strides[3] = {std::vector<int64_t>(rank + 1), std::vector<int64_t>(rank + 1),
                                     std::vector<int64_t>(rank + 1)};
  for (int k = 0; k < 3; k++) BroadcastStrides(ndims[k], shapes[k], rank, strides[k].data());
  shape.push_back(1);  // room for a 0-d output's one element
  const int m = Coalesce(rank, shape.data(), 3, strides);
  const int64_t inner = shape[m - 1];
  opforge::parallel_for(0, n / inner, RowGrain(inner), [&](int64_t r0, int64_t r1) {
    ForRows<3>(m, shape.data(), strides, r0, r1, [&](const int64_t *off, int64_t start) {
      Choose(c + off[0], strides[0][m - 1], x + off[1], strides[1][m - 1], y + off[2], strides[2][m - 1],
             out + start, inner);
    });
  });
  return 0;
}
"""
VALUE_DTYPES = NUMERIC + ["bool"]
where.kernel(function="Where", code=every_dtype(WHERE, "Where", VALUE_DTYPES, by=1),
             dtypes=[("bool", d, d) for d in VALUE_DTYPES], cflags=["-fno-trapping-math"])
