"""cumsum: running sums of x along ``axis`` (ONNX CumSum).

``exclusive`` leaves each element out of its own sum (the first sum is 0);
``reverse`` sums from the end of the axis toward its start.  y has x's shape
and dtype, and sums accumulate in that dtype, in order along the axis, as
NumPy's cumsum does (integers wrap around on overflow, as in NumPy).

The C++ kernel is a real scan: a line of the axis at a time when the axis is
the innermost dim, else whole rows of the dims after the axis at once (a
vectorized add of one row to the running row), with the lines or row blocks
split across opforge's thread pool.  The gradient is the cumsum of dy the
other way along the axis, with the same ``exclusive``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.common import NUMERIC, every_dtype
from opforge.sbp import partial_sum, split

if TYPE_CHECKING:
    import numpy.typing as npt

    from opforge import TensorSpec
    from opforge.sbp import SBPValue

cumsum = opforge.op("cumsum(Tensor x, *, int axis, bool exclusive=False, bool reverse=False) -> Tensor y",
                    traits=["no_side_effect"],
                    doc="Running sums along axis; exclusive leaves each element out of its own sum, reverse sums "
                        "from the end of the axis. y has x's shape and dtype.")
cumsum.def_infer(infer.same_as(0))


@cumsum.check
def cumsum_check(x: TensorSpec, *, axis: int, exclusive: bool, reverse: bool) -> None:
    if x.dtype == "bool" or x.dtype.startswith("complex"):
        raise opforge.DTypeError(f"op 'cumsum': input 'x' has dtype {x.dtype}; cumsum takes integer or "
                                 "floating-point tensors")
    if x.rank is None:
        return
    if x.rank == 0:
        raise opforge.ShapeError("op 'cumsum': input 'x' is 0-d; cumsum needs rank >= 1")
    if not -x.rank <= axis < x.rank:
        raise opforge.ShapeError(f"op 'cumsum': attribute 'axis' is {axis}, out of range for input 'x' of rank "
                                 f"{x.rank} (valid: {-x.rank}..{x.rank - 1})")


@cumsum.sbp
def cumsum_sbp(x: TensorSpec, *, axis: int, exclusive: bool, reverse: bool) -> list[dict[str, SBPValue]]:
    # Each line along `axis` is scanned on its own, so any other axis splits; running sums of addends of x
    # are addends of y (a linear op).
    if not x.rank:
        return []
    signatures: list[dict[str, SBPValue]] = [{"x": split(k), "y": split(k)} for k in range(x.rank)
                                             if k != axis % x.rank]
    return signatures + [{"x": partial_sum, "y": partial_sum}]


@cumsum.reference(fallback=True)
def cumsum_reference(x: npt.NDArray[Any], *, axis: int, exclusive: bool = False,
                     reverse: bool = False) -> npt.NDArray[Any]:
    moved = np.moveaxis(x, axis, -1)
    if reverse:
        moved = moved[..., ::-1]
    with np.errstate(over="ignore"):
        sums = np.cumsum(moved, axis=-1, dtype=x.dtype)
    if exclusive:  # each sum moves one place on; the first is 0
        sums = np.concatenate([np.zeros_like(sums[..., :1]), sums[..., :-1]], axis=-1)
    if reverse:
        sums = sums[..., ::-1]
    y: npt.NDArray[Any] = np.ascontiguousarray(np.moveaxis(sums, -1, axis))
    return y


@cumsum.grad(save=[])
def cumsum_grad(saved: Any, dy: Any, *, axis: int, exclusive: bool, reverse: bool) -> Any:
    # y_j sums x_i over i <= j (i < j when exclusive): x_i reaches every y_j with j >= i (j > i).
    return opforge.ops.cumsum(dy, axis=axis, exclusive=exclusive, reverse=not reverse)


CUMSUM_CC = r"""
#include <cstdint>
#include <type_traits>

#include "custom_aot_extra.h"
#include "opforge/parallel.h"

typedef OPFORGE_T T;
// Integers add as unsigned: overflow wraps (as in NumPy) instead of being undefined.
template <typename V, bool = std::is_integral_v<V>>
struct Accumulator { typedef V type; };
template <typename V>
struct Accumulator<V, true> { typedef std::make_unsigned_t<V> type; };
typedef typename Accumulator<T>::type Acc;

// params: x, y.  x viewed as (outer, n, inner) around the axis.  Each step
// along the axis (forward or backward) adds a row of `inner` elements to the
// running row; exclusive writes the running row before adding.
extern "C" int CumSum(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                      void *stream, void *extra_ptr) {
  try {
    AotExtra *extra = static_cast<AotExtra *>(extra_ptr);
    const int rank = ndims[0];
    int64_t axis = extra->Attr<int64_t>("axis");
    const bool exclusive = extra->Attr<bool>("exclusive"), reverse = extra->Attr<bool>("reverse");
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank) return 1;  // the op's check rejects these first
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < rank; d++) {
      if (d < axis) outer *= shapes[0][d];
      if (d > axis) inner *= shapes[0][d];
    }
    const int64_t n = shapes[0][axis];
    if (outer * n * inner == 0) return 0;
    const T *x = static_cast<const T *>(params[0]);
    T *y = static_cast<T *>(params[1]);
    const int64_t first = reverse ? n - 1 : 0, step = reverse ? -inner : inner;
    // Columns [c0, c1) of block o: the scan along the axis, a vectorizable row add per step.
    auto scan = [&](int64_t o, int64_t c0, int64_t c1) {
      const T *xs = x + o * n * inner + first * inner;
      T *ys = y + o * n * inner + first * inner;
      if (c1 - c0 == 1) {  // one line: the sum in a register
        Acc sum = 0;
        for (int64_t j = 0, at = c0; j < n; j++, at += step) {
          const Acc v = static_cast<Acc>(xs[at]);
          if (exclusive) {
            ys[at] = static_cast<T>(sum);
            sum += v;
          } else {
            sum += v;
            ys[at] = static_cast<T>(sum);
          }
        }
        return;
      }
      // The previous output row is the running row (exclusive: the previous output plus the previous input).
      for (int64_t c = c0; c < c1; c++) ys[c] = exclusive ? T(0) : xs[c];
      for (int64_t j = 1; j < n; j++) {
        const T *xr = xs + j * step, *xp = xr - step;
        T *yr = ys + j * step, *yp = yr - step;
        if (exclusive) {
          for (int64_t c = c0; c < c1; c++) yr[c] = static_cast<T>(static_cast<Acc>(yp[c]) + static_cast<Acc>(xp[c]));
        } else {
          for (int64_t c = c0; c < c1; c++) yr[c] = static_cast<T>(static_cast<Acc>(yp[c]) + static_cast<Acc>(xr[c]));
        }
      }
    };
    // Work items: (block, run of columns) with runs of up to 1024 columns, about 16K elements or more each.
    const int64_t width = inner < 1024 ? inner : 1024, runs = (inner + width - 1) / width;
    const int64_t grain = n * width >= (1 << 14) ? 1 : (1 << 14) / (n * width);
    opforge::parallel_for(0, outer * runs, grain, [&](int64_t w0, int64_t w1) {
      for (int64_t w = w0; w < w1; w++) {
        const int64_t o = w / runs, c0 = w % runs * width, c1 = c0 + width < inner ? c0 + width : inner;
        scan(o, c0, c1);
      }
    });
  } catch (...) {  // (attribute lookups and the pool's own failures stay on this side of the ABI)
    return 2;
  }
  return 0;
}
"""
cumsum.kernel(function="CumSum", code=every_dtype(CUMSUM_CC, "CumSum", NUMERIC), dtypes=[(d,) for d in NUMERIC])
