"""trilu: the upper (or lower) triangle of each matrix in x's last two dims,
the rest set to zero (ONNX Trilu; np.triu / np.tril).

Element (i, j) of a matrix is kept where j >= i + k (upper) or j <= i + k
(lower): k = 0 is the main diagonal, k > 0 moves it right, k < 0 left.  The
C++ kernel moves elements without looking at their values, so one library
serves every dtype (elements.h's element widths): each row is a memcpy of
the kept run and a fill of zeros around it, rows in parallel ranges.  The
gradient is the same mask applied to dy.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.common import HEADER_DIRS
from opforge.sbp import partial_sum, split

if TYPE_CHECKING:
    import numpy.typing as npt

    from opforge import TensorSpec
    from opforge.sbp import SBPValue

trilu = opforge.op("trilu(Tensor x, *, bool upper=True, int k=0) -> Tensor y", traits=["no_side_effect"],
                   doc="The upper (upper=True: j >= i + k) or lower (j <= i + k) triangle of each matrix in x's "
                       "last two dims, zeros elsewhere.")
trilu.def_infer(infer.same_as(0))


@trilu.check
def trilu_check(x: TensorSpec, *, upper: bool, k: int) -> None:
    if x.rank is not None and x.rank < 2:
        raise opforge.ShapeError(f"op 'trilu': input 'x' has rank {x.rank}; trilu needs rank >= 2 (matrices in "
                                 "the last two dims)")


@trilu.sbp
def trilu_sbp(x: TensorSpec, *, upper: bool, k: int) -> list[dict[str, SBPValue]]:
    # The mask depends on the index within a matrix: the batch dims split, the last two do not; a mask
    # of addends of x gives addends of y.
    signatures: list[dict[str, SBPValue]] = [{"x": split(d), "y": split(d)} for d in range((x.rank or 2) - 2)]
    return signatures + [{"x": partial_sum, "y": partial_sum}]


@trilu.reference(fallback=True)
def trilu_reference(x: npt.NDArray[Any], *, upper: bool = True, k: int = 0) -> npt.NDArray[Any]:
    rows, columns = x.shape[-2:]
    i, j = np.arange(rows)[:, None], np.arange(columns)[None, :]
    keep = j >= i + k if upper else j <= i + k
    y: npt.NDArray[Any] = np.where(keep, x, np.zeros((), x.dtype))
    return y


@trilu.grad(save=[])
def trilu_grad(saved: Any, dy: Any, *, upper: bool, k: int) -> Any:
    return opforge.ops.trilu(dy, upper=upper, k=k)


trilu.kernel(function="Trilu", include_dirs=HEADER_DIRS, code=r"""
#include <algorithm>
#include <cstring>

#include "custom_aot_extra.h"
#include "elements.h"

// Rows of every matrix: row i keeps the columns [lo, hi) and is zero outside them.
template <typename E>
static int KeepBands(const E *x, E *y, int64_t rows, int64_t m, int64_t n, bool upper, int64_t k) {
  const int64_t grain = std::max<int64_t>(1, OPFORGE_COPY_GRAIN / (std::max<int64_t>(n, 1) * sizeof(E)));
  opforge::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
      const int64_t i = r % m;
      // (i + k may fall outside [0, n]: the row is then all kept or all zero)
      const int64_t edge = std::clamp<int64_t>(upper ? i + k : i + k + 1, 0, n);
      const int64_t lo = upper ? edge : 0, hi = upper ? n : edge;
      const E *in = x + r * n;
      E *out = y + r * n;
      FillRun(out, lo, E(0));
      if (hi > lo) std::memcpy(out + lo, in + lo, (hi - lo) * sizeof(E));
      FillRun(out + hi, n - hi, E(0));
    }
  });
  return 0;
}

// params: x, y (x's shape, rank >= 2).
extern "C" int Trilu(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                     void *stream, void *extra_ptr) {
  try {
    AotExtra *extra = static_cast<AotExtra *>(extra_ptr);
    const int rank = ndims[0];
    if (rank < 2) return 1;  // the op's check rejects these first
    const bool upper = extra->Attr<bool>("upper");
    int64_t k = extra->Attr<int64_t>("k");
    const int64_t m = shapes[0][rank - 2], n = shapes[0][rank - 1];
    k = std::clamp<int64_t>(k, -m - 1, n + 1);  // beyond these every row is whole or empty: no overflow in i + k
    const int64_t rows = ElementCount(rank - 1, shapes[0]);
    if (rows == 0 || n == 0) return 0;
    const void *x = params[0];
    void *y = params[1];
#define OPFORGE_TRILU(E) return KeepBands(static_cast<const E *>(x), static_cast<E *>(y), rows, m, n, upper, k)
    OPFORGE_BY_ELEMENT_SIZE(ElementSize(dtypes[0]), OPFORGE_TRILU)
#undef OPFORGE_TRILU
  } catch (...) {  // (attribute lookups and the pool's own failures stay on this side of the ABI)
    return 2;
  }
}
""")
