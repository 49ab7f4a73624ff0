"""expand: y = x broadcast with ``shape`` (ONNX Expand).

The broadcast goes both ways, as NumPy's does: y's shape is the broadcast of
x's shape and ``shape``, so a 1 in ``shape`` keeps x's dim.  The kernel
moves elements as bytes (one library for every dtype) with elements.h's
strided copy, as tile.py does.  The
gradient sums dy over the broadcast axes.
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

expand = opforge.op("expand(Tensor x, *, Shape shape) -> Tensor y", traits=["no_side_effect"],
                    doc="Broadcast x with shape (NumPy rules, both ways: a 1 in shape keeps x's dim).")


def broadcast_dims(x_shape: Sequence[int], shape: Sequence[int], op_name: str = "expand") -> list[int]:
    """The broadcast of x's dims (-1: unknown) with ``shape``; ShapeError where they clash."""
    rank = max(len(x_shape), len(shape))
    a = (1,) * (rank - len(x_shape)) + tuple(x_shape)
    b = (1,) * (rank - len(shape)) + tuple(shape)
    out = []
    for d, (m, n) in enumerate(zip(a, b)):
        if n == 1 or m == n:
            out.append(m)
        elif m == 1 or m == -1:  # an unknown dim of x must be 1 or n
            out.append(n)
        else:
            raise opforge.ShapeError(f"op '{op_name}': input 'x' of shape {list(x_shape)} does not broadcast with "
                                     f"shape {list(shape)} (dim {d}: {m} against {n})")
    return out


@expand.check
def expand_check(x: TensorSpec, *, shape: Sequence[int]) -> str | None:
    if any(d < 0 for d in shape):
        return f"attribute 'shape' {list(shape)} has negative dims; dims are >= 0"
    if x.rank is not None:
        broadcast_dims(x.shape, shape)
    return None


@expand.infer
def expand_infer(x: TensorSpec, *, shape: Sequence[int]) -> TensorSpec:
    if x.rank is None:
        return TensorSpec(None, x.dtype)
    return TensorSpec(broadcast_dims(x.shape, shape), x.dtype)


@expand.reference(fallback=True)
def expand_reference(x: npt.NDArray[Any], *, shape: Sequence[int]) -> npt.NDArray[Any]:
    y: npt.NDArray[Any] = np.broadcast_to(x, broadcast_dims(x.shape, shape)).copy()
    return y


@expand.grad(save=["x"])
def expand_grad(saved: Any, dy: Any, *, shape: Sequence[int]) -> Any:
    dims = known_dims(saved.x)
    out = broadcast_dims(dims, shape)
    lead = len(out) - len(dims)
    axes = list(range(lead))
    for k, d in enumerate(dims):
        if d == -1 and out[lead + k] != -1:  # x's dim is 1 or out's: which decides the sum
            raise opforge.ShapeError(f"op 'expand': its gradient needs dim {k} of input 'x' (unknown) against "
                                     f"shape {list(shape)}: known dims only")
        if d == 1 and out[lead + k] != 1:
            axes.append(lead + k)
    if axes:
        dy = opforge.ops.reduce_sum(dy, axes=axes, keep_dims=True)
    if lead:
        dy = opforge.ops.squeeze(dy, axes=list(range(lead)))
    return dy



# y written in order, x read at element strides, 0 along broadcast dims
# (elements.h's StridedCopy: merged dims, rows of memcpy or fills, threaded).
expand.kernel(function="Expand", include_dirs=HEADER_DIRS, code=r"""
#include <vector>

#include "custom_aot_extra.h"
#include "elements.h"

// params: x, y.  y's rank is at least x's; x's dims align to y's last ones.
extern "C" int Expand(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                      void *stream, void *extra) {
  const int xr = ndims[0], yr = ndims[1];
  if (yr < xr) return 1;
  std::vector<int64_t> out(shapes[1], shapes[1] + yr), from(yr, 0);
  int64_t stride = 1;
  for (int k = xr - 1; k >= 0; k--) {
    const int64_t dim = shapes[0][k], o = out[yr - xr + k];
    if (dim != o && dim != 1) return 2;  // inference disagrees
    from[yr - xr + k] = dim == 1 ? 0 : stride;
    stride *= dim;
  }
  return StridedCopyOf(dtypes[0], params[0], params[1], out, from);
}
""")
