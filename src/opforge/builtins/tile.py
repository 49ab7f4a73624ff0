"""tile: y = x repeated ``repeats[d]`` times along each dim d (ONNX Tile, np.tile).

The kernel views y of shape [r0*d0, r1*d1, ...] as [r0, d0, r1, d1, ...]:
x broadcast along the r dims, elements.h's strided copy as in expand.py
(bytes, one library for every dtype).  The gradient reshapes dy the same way and sums
the r dims.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import TensorSpec
from opforge.builtins.common import HEADER_DIRS, known_dims

if TYPE_CHECKING:
    import numpy.typing as npt

tile = opforge.op("tile(Tensor x, *, int[] repeats) -> Tensor y", traits=["no_side_effect"],
                  doc="Repeat x repeats[d] times along each dim d (one repeat count >= 0 per dim).")


@tile.check
def tile_check(x: TensorSpec, *, repeats: Sequence[int]) -> str | None:
    if any(r < 0 for r in repeats):
        return f"attribute 'repeats' {list(repeats)} has negative counts; counts are >= 0"
    if x.rank is not None and len(repeats) != x.rank:
        return f"attribute 'repeats' has {len(repeats)} entries, input 'x' has rank {x.rank}: give one per dim"
    return None


@tile.infer
def tile_infer(x: TensorSpec, *, repeats: Sequence[int]) -> TensorSpec:
    if x.rank is None:
        return TensorSpec([-1] * len(repeats), x.dtype)
    return TensorSpec([-1 if d == -1 else d * r for d, r in zip(x.shape, repeats)], x.dtype)


@tile.reference(fallback=True)
def tile_reference(x: npt.NDArray[Any], *, repeats: Sequence[int]) -> npt.NDArray[Any]:
    y: npt.NDArray[Any] = np.tile(x, repeats) if x.ndim else x.copy()
    return y


@tile.grad(save=["x"])
def tile_grad(saved: Any, dy: Any, *, repeats: Sequence[int]) -> Any:
    dims = known_dims(saved.x)
    if -1 in dims:
        raise opforge.ShapeError(f"op 'tile': its gradient needs the dims of input 'x' known; got {list(dims)}")
    if not dims:
        return dy
    pairs = [v for r, d in zip(repeats, dims) for v in (r, d)]
    summed = opforge.ops.reduce_sum(opforge.ops.reshape(dy, shape=pairs), axes=list(range(0, len(pairs), 2)))
    return summed


tile.kernel(function="Tile", include_dirs=HEADER_DIRS, code=r"""
#include <vector>

#include "custom_aot_extra.h"
#include "elements.h"

// params: x, y.  y as [r0, d0, r1, d1, ...]: stride 0 along each r, x's along each d.
extern "C" int Tile(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                    void *stream, void *extra) {
  const int rank = ndims[0];
  if (ndims[1] != rank) return 1;
  std::vector<int64_t> out(2 * rank), from(2 * rank);
  int64_t stride = 1;
  for (int k = rank - 1; k >= 0; k--) {
    const int64_t dim = shapes[0][k];
    if (dim == 0 || shapes[1][k] % dim) return 2;  // an empty x never gets here: y is empty too
    out[2 * k] = shapes[1][k] / dim;
    from[2 * k] = 0;
    out[2 * k + 1] = dim;
    from[2 * k + 1] = stride;
    stride *= dim;
  }
  return StridedCopyOf(dtypes[0], params[0], params[1], out, from);
}
""")
