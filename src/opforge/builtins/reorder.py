"""reorder: convert a tensor between data layouts.

``ndarray`` is the plain row-major NCHW layout; ``nchw16c`` blocks the
channels by 16 (N, C/16, H, W, 16), zero-padding C to a multiple of 16, so
that vector kernels read 16 channels of one pixel contiguously.  The layout
pass inserts this op where a producer and its consumer disagree.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import TensorSpec
from opforge.spec import LAYOUTS

if TYPE_CHECKING:
    import numpy.typing as npt

reorder = opforge.op("reorder(Tensor x, *, str layout='nchw16c') -> Tensor y", traits=["no_side_effect"],
                     doc="Convert x to the given layout ('ndarray' or 'nchw16c').")


@reorder.check
def _(x: TensorSpec, *, layout: str) -> str | None:
    if layout not in LAYOUTS:
        return f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}"
    if x.layout == layout:  # the kernel converts from the other layout
        return f"x is already in layout {layout}"
    if layout == "nchw16c" and x.rank is not None and x.rank != 4:
        return f"nchw16c needs a 4-d NCHW tensor, got rank {x.rank}"
    return None


@reorder.infer
def _(x: TensorSpec, *, layout: str) -> TensorSpec:
    return TensorSpec(x.shape, x.dtype, layout)


@reorder.grad()
def _(saved: Any, dy: Any, *, layout: str) -> Any:
    return opforge.ops.reorder(dy, layout="ndarray" if layout == "nchw16c" else "nchw16c")


def to_blocked(x: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """NumPy reference of ndarray -> nchw16c, as the flat padded buffer."""
    n, c, h, w = x.shape
    padded = np.zeros((n, -(-c // 16) * 16, h, w), x.dtype)
    padded[:, :c] = x
    blocked: npt.NDArray[Any] = padded.reshape(n, -1, 16, h, w).transpose(0, 1, 3, 4, 2).copy()
    return blocked


reorder.kernel(function="Reorder", dtypes={"x": ["float32", "float64"]}, layout="any", code=r"""
#include <string>

#include "custom_aot_extra.h"

typedef OPFORGE_T T;

// Only the target layout is passed; the source is the other one.
extern "C" int Reorder(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                       void *stream, void *extra) {
  const T *x = static_cast<const T *>(params[0]);
  T *y = static_cast<T *>(params[1]);
  const std::string layout = static_cast<AotExtra *>(extra)->Attr<std::string>("layout");
  if (ndims[0] != 4) return 3;
  const int64_t n = shapes[0][0], c = shapes[0][1], h = shapes[0][2], w = shapes[0][3];
  const int64_t blocks = (c + 15) / 16, hw = h * w;
  const bool to_blocked = layout == "nchw16c";
  for (int64_t b = 0; b < n; b++)
    for (int64_t cb = 0; cb < blocks; cb++)
      for (int64_t p = 0; p < hw; p++)
        for (int64_t lane = 0; lane < 16; lane++) {
          const int64_t channel = cb * 16 + lane;
          const int64_t blocked = ((b * blocks + cb) * hw + p) * 16 + lane;
          const int64_t plain = (b * c + channel) * hw + p;
          if (to_blocked) {
            y[blocked] = channel < c ? x[plain] : T(0);
          } else if (channel < c) {
            y[plain] = x[blocked];
          }
        }
  return 0;
}
""")
