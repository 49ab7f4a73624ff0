"""expand: y = x broadcast with ``shape`` (ONNX Expand).

The broadcast goes both ways, as NumPy's does: y's shape is the broadcast of
x's shape and ``shape``, so a 1 in ``shape`` keeps x's dim.  The kernel
copies bytes (one library for every dtype); tile.py uses the same walk.  The
gradient sums dy over the broadcast axes.
"""
from pathlib import Path

import numpy as np

import opforge
from opforge import TensorSpec
from opforge.builtins.common import known_dims

expand = opforge.op("expand(Tensor x, *, Shape shape) -> Tensor y", traits=["no_side_effect"],
                    doc="Broadcast x with shape (NumPy rules, both ways: a 1 in shape keeps x's dim).")


def broadcast_dims(x_shape, shape, op_name="expand"):
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
def expand_check(x, *, shape):
    if any(d < 0 for d in shape):
        return f"attribute 'shape' {list(shape)} has negative dims; dims are >= 0"
    if x.rank is not None:
        broadcast_dims(x.shape, shape)
    return None


@expand.infer
def expand_infer(x, *, shape):
    if x.rank is None:
        return TensorSpec(None, x.dtype)
    return TensorSpec(broadcast_dims(x.shape, shape), x.dtype)


@expand.reference(fallback=True)
def expand_reference(x, *, shape):
    return np.broadcast_to(x, broadcast_dims(x.shape, shape)).copy()


@expand.grad(save=["x"])
def expand_grad(saved, dy, *, shape):
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


# y walked in order; x is read at byte offsets with stride 0 along broadcast
# dims.  Dims are merged where contiguous in both, and the innermost run is
# a memcpy (x contiguous there) or a fill (x's element repeated).
BROADCAST_COPY = r"""
#include <cstdint>
#include <cstring>
#include <vector>

#include "elements.h"

// out: y's dims; from: x's byte stride along each (0: broadcast).
static void BroadcastCopy(const char *x, char *y, std::vector<int64_t> out, std::vector<int64_t> from,
                          int64_t size) {
  int64_t n = 1;
  for (int64_t d : out) n *= d;
  if (n == 0) return;
  std::vector<int64_t> dim, stride;  // merged, size-1 dims dropped
  for (size_t k = 0; k < out.size(); k++) {
    if (out[k] == 1) continue;
    if (!dim.empty() && stride.back() == from[k] * out[k]) {
      dim.back() *= out[k];
      stride.back() = from[k];
    } else {
      dim.push_back(out[k]);
      stride.push_back(from[k]);
    }
  }
  if (dim.empty()) {
    std::memcpy(y, x, size);
    return;
  }
  const int m = static_cast<int>(dim.size());
  const int64_t inner = dim[m - 1], step = stride[m - 1];
  std::vector<int64_t> index(m, 0);
  int64_t offset = 0;
  for (int64_t done = 0; done < n; done += inner) {
    const char *row = x + offset;
    if (step == size) {
      std::memcpy(y, row, inner * size);
    } else if (step == 0) {  // one element repeated: write it, then double
      std::memcpy(y, row, size);
      for (int64_t filled = 1; filled < inner;) {
        const int64_t more = filled < inner - filled ? filled : inner - filled;
        std::memcpy(y + filled * size, y, more * size);
        filled += more;
      }
    } else {
      for (int64_t j = 0; j < inner; j++) std::memcpy(y + j * size, row + j * step, size);
    }
    y += inner * size;
    for (int d = m - 2; d >= 0; d--) {
      offset += stride[d];
      if (++index[d] < dim[d]) break;
      offset -= stride[d] * dim[d];
      index[d] = 0;
    }
  }
}
"""
HERE = [str(Path(__file__).parent)]

expand.kernel(function="Expand", include_dirs=HERE, code=BROADCAST_COPY + r"""
#include "custom_aot_extra.h"

// params: x, y.  y's rank is at least x's; x's dims align to y's last ones.
extern "C" int Expand(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                      void *stream, void *extra) {
  const int xr = ndims[0], yr = ndims[1];
  if (yr < xr) return 1;
  const int64_t size = ElementSize(dtypes[0]);
  std::vector<int64_t> out(shapes[1], shapes[1] + yr), from(yr, 0);
  int64_t stride = size;
  for (int k = xr - 1; k >= 0; k--) {
    const int64_t dim = shapes[0][k], o = out[yr - xr + k];
    if (dim != o && dim != 1) return 2;  // inference disagrees
    from[yr - xr + k] = dim == 1 ? 0 : stride;
    stride *= dim;
  }
  BroadcastCopy(static_cast<const char *>(params[0]), static_cast<char *>(params[1]), out, from, size);
  return 0;
}
""")
