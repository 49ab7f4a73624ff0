"""add: y = a + b, with NumPy broadcasting.

The template for a binary elementwise op: the output shape is the broadcast
of the inputs (inference), and the kernel, which sees every input's and the
output's shape, works out the broadcast itself.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.common import GPU_NUMERIC, gpu_source, same_dtypes
from opforge.sbp import partial_sum

if TYPE_CHECKING:
    import numpy.typing as npt

    from opforge import TensorSpec
    from opforge.sbp import SBPValue

add = opforge.op("add(Tensor a, Tensor b) -> Tensor y", traits=["no_side_effect", "elementwise"],
                 doc="Elementwise sum with NumPy broadcasting; y has the dtype of a.")
add.def_infer(infer.broadcast())
add.fuse_as("{a} + {b}")


@add.sbp
def add_sbp(a: TensorSpec, b: TensorSpec) -> list[dict[str, SBPValue]]:
    # Beside the elementwise splits: addends of a plus addends of b are addends of y.
    return [{"a": partial_sum, "b": partial_sum, "y": partial_sum}] if summable(a, b) else []


def summable(*specs: TensorSpec) -> bool:
    """Whether partial sums pass through a linear op on inputs of these specs: one numeric dtype.
    (y takes a's dtype, so mixed dtypes round or truncate each addend; bools add as logical or.)"""
    return len({s.dtype for s in specs}) == 1 and specs[0].dtype != "bool"


@add.reference(fallback=True)
def add_reference(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> npt.NDArray[Any]:
    y: npt.NDArray[Any] = np.add(a, b).astype(a.dtype, copy=False)
    return y


@add.grad(save=["a", "b"])
def add_grad(saved: Any, dy: Any) -> tuple[Any, Any]:
    return sum_to(dy, saved.a), sum_to(dy, saved.b)


def sum_to(dy: Any, like: Any) -> Any:
    """dy summed over the dims along which ``like`` was broadcast (for gradients)."""
    dy_shape, like_shape = spec_shape(dy), spec_shape(like)
    if dy_shape == like_shape:
        return dy
    extra = len(dy_shape) - len(like_shape)
    axes = list(range(extra)) + [extra + k for k, d in enumerate(like_shape) if d == 1 and dy_shape[extra + k] != 1]
    summed = opforge.ops.reduce_sum(dy, axes=axes, keep_dims=True) if axes else dy
    return opforge.ops.reshape(summed, shape=list(like_shape))


def spec_shape(x: Any) -> tuple[int, ...]:
    """The shape a rule reasons about: -1 for unknown dims (a traced value's ``shape`` holds symbolic dims)."""
    return x.spec.shape if hasattr(x, "spec") else np.shape(x)


# One broadcasting source for every binary elementwise op: OPFORGE_BINARY is
# the operation (mul.py and sub.py compile this same source with their own).
# Both inputs are typed, so each variant takes a and b of one dtype; mixed
# dtypes match no native kernel and fall back to the reference.
# Integer overflow is undefined in C++ (NumPy wraps): keep sums in range.
BINARY_DTYPES = {"a": ["float32", "float64", "int32", "int64"], "b": ["float32", "float64", "int32", "int64"]}
BROADCAST_HELPERS = r"""
#include <vector>

#include "custom_aot_extra.h"
#include "opforge/parallel.h"

#ifndef OPFORGE_BINARY
#define OPFORGE_BINARY(x, y) ((x) + (y))
#endif

// Elements per parallel range: arrays up to this size run on the calling
// thread, as waking the pool costs more than it saves there.
#ifndef OPFORGE_GRAIN
#define OPFORGE_GRAIN (1 << 16)
#endif

typedef OPFORGE_T T;
#ifdef OPFORGE_T_y
typedef OPFORGE_T_y Y;  // an output dtype of its own (comparisons give bool)
#else
typedef T Y;
#endif

static int64_t Count(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  return n;
}

// Element strides of an input read at the output's rank: 0 along the dims it
// is broadcast over (missing leading dims and size-1 dims), so one index walk
// over the output addresses every input.
static void BroadcastStrides(int ndim, const int64_t *shape, int rank, int64_t *strides) {
  int64_t stride = 1;
  for (int d = rank - 1; d >= 0; d--) {
    int k = d - (rank - ndim);
    if (k < 0) {
      strides[d] = 0;
      continue;
    }
    strides[d] = shape[k] == 1 ? 0 : stride;
    stride *= shape[k];
  }
}

// Merges neighbouring output dims that every input steps through alike
// (contiguously, or broadcast over both), and drops size-1 dims, so that the
// innermost dim is as long as it can be: (4096, 4096) + (4096,) stays 2-D, but
// (8, 512, 512) + (8, 512, 512) becomes one run.  Returns the new rank (>= 1).
static int Coalesce(int rank, int64_t *shape, int inputs, std::vector<int64_t> *strides) {
  int m = 0;
  for (int d = 0; d < rank; d++) {
    if (shape[d] == 1) continue;
    bool merge = m > 0;
    for (int k = 0; k < inputs && merge; k++) merge = strides[k][m - 1] == strides[k][d] * shape[d];
    if (merge) {
      shape[m - 1] *= shape[d];
      for (int k = 0; k < inputs; k++) strides[k][m - 1] = strides[k][d];
    } else {
      shape[m] = shape[d];
      for (int k = 0; k < inputs; k++) strides[k][m] = strides[k][d];
      m++;
    }
  }
  if (m == 0) {  // a single element
    shape[0] = 1;
    for (int k = 0; k < inputs; k++) strides[k][0] = 0;
    m = 1;
  }
  return m;
}

// Calls row(offsets, start) for the output rows [r0, r1) of a coalesced walk:
// each row is shape[rank - 1] elements from output offset `start`, and
// offsets[k] is input k's offset there.  The outer index is an odometer
// started from r0, so ranges run independently on several threads.
template <int K, typename Row>
static void ForRows(int rank, const int64_t *shape, const std::vector<int64_t> *strides, int64_t r0, int64_t r1,
                    const Row &row) {
  std::vector<int64_t> index(rank, 0);
  int64_t off[K] = {};
  for (int64_t r = r0, d = rank - 2; d >= 0; d--) {
    index[d] = r % shape[d];
    r /= shape[d];
    for (int k = 0; k < K; k++) off[k] += index[d] * strides[k][d];
  }
  const int64_t inner = shape[rank - 1];
  for (int64_t q = r0; q < r1; q++) {
    row(off, q * inner);
    for (int d = rank - 2; d >= 0; d--) {
      for (int k = 0; k < K; k++) off[k] += strides[k][d];
      if (++index[d] < shape[d]) break;
      for (int k = 0; k < K; k++) off[k] -= strides[k][d] * shape[d];
      index[d] = 0;
    }
  }
}

// The rows a parallel range should hold at least, for rows of `inner` elements.
static int64_t RowGrain(int64_t inner) { return inner >= OPFORGE_GRAIN ? 1 : OPFORGE_GRAIN / inner; }
"""
# (where.py builds its three-input kernel on the helpers above.)
BINARY_BROADCAST = BROADCAST_HELPERS + r"""
// n elements of y from a and b read with element steps ia and ib (1:
// contiguous, 0: one value broadcast): the common steps get loops of their
// own, which the compiler vectorizes.
static void Span(const T *a, int64_t ia, const T *b, int64_t ib, Y *y, int64_t n) {
  if (ia == 1 && ib == 1) {
    for (int64_t i = 0; i < n; i++) y[i] = OPFORGE_BINARY(a[i], b[i]);
  } else if (ia == 1 && ib == 0) {
    const T s = b[0];
    for (int64_t i = 0; i < n; i++) y[i] = OPFORGE_BINARY(a[i], s);
  } else if (ia == 0 && ib == 1) {
    const T s = a[0];
    for (int64_t i = 0; i < n; i++) y[i] = OPFORGE_BINARY(s, b[i]);
  } else {
    for (int64_t i = 0; i < n; i++) y[i] = OPFORGE_BINARY(a[i * ia], b[i * ib]);
  }
}

extern "C" int Binary(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                   void *stream, void *extra) {
  const T *a = static_cast<const T *>(params[0]);
  const T *b = static_cast<const T *>(params[1]);
  Y *y = static_cast<Y *>(params[2]);
#ifdef OPFORGE_LAYOUT_NCHW16C
  // Channel-blocked tensors of one shape: elementwise over the padded buffer.
  if (ndims[0] != 4 || ndims[1] != 4) return 3;
  for (int d = 0; d < 4; d++)
    if (shapes[0][d] != shapes[1][d]) return 4;
  const int64_t padded = shapes[0][0] * ((shapes[0][1] + 15) / 16 * 16) * shapes[0][2] * shapes[0][3];
  opforge::parallel_for(0, padded, OPFORGE_GRAIN,
                     [&](int64_t lo, int64_t hi) { Span(a + lo, 1, b + lo, 1, y + lo, hi - lo); });
  return 0;
#endif
  const int rank = ndims[2];
  const int64_t n = Count(rank, shapes[2]);
  const int64_t na = Count(ndims[0], shapes[0]), nb = Count(ndims[1], shapes[1]);
  if (n == 0) return 0;

  // Fast paths.  An input with as many elements as the output is laid out
  // like it (broadcasting only ever adds size-1 dims), so it is read linearly.
  if ((na == n || na == 1) && (nb == n || nb == 1)) {
    const int64_t ia = na == n ? 1 : 0, ib = nb == n ? 1 : 0;
    opforge::parallel_for(0, n, OPFORGE_GRAIN,
                       [&](int64_t lo, int64_t hi) { Span(a + lo * ia, ia, b + lo * ib, ib, y + lo, hi - lo); });
    return 0;
  }

  // General case: rows of the coalesced output (rows of a matrix plus a row
  // vector, or plus a column, are contiguous or broadcast runs), each input's
  // offset carried by an odometer over the outer dims; ranges of rows in parallel.
  std::vector<int64_t> shape(shapes[2], shapes[2] + rank);
  std::vector<int64_t> strides[2] = {std::vector<int64_t>(rank), std::vector<int64_t>(rank)};
  BroadcastStrides(ndims[0], shapes[0], rank, strides[0].data());
  BroadcastStrides(ndims[1], shapes[1], rank, strides[1].data());
  const int m = Coalesce(rank, shape.data(), 2, strides);
  const int64_t inner = shape[m - 1], ia = strides[0][m - 1], ib = strides[1][m - 1];
  opforge::parallel_for(0, n / inner, RowGrain(inner), [&](int64_t r0, int64_t r1) {
    ForRows<2>(m, shape.data(), strides, r0, r1, [&](const int64_t *off, int64_t start) {
      Span(a + off[0], ia, b + off[1], ib, y + start, inner);
    });
  });
  return 0;
}
"""

add.kernel(function="Binary", dtypes=BINARY_DTYPES, code=BINARY_BROADCAST, name="Add")
add.kernel(function="Binary", dtypes={"a": ["float32", "float64"], "b": ["float32", "float64"]},
           code=BINARY_BROADCAST, name="Add", layout="nchw16c")
# GPU: elementwise.cu, the same broadcasting (AddGpu / SubGpu / MulGpu share one library).
GPU_BINARY_DTYPES = same_dtypes(GPU_NUMERIC, inputs=2)
add.kernel(source=gpu_source("elementwise.cu", "AddGpu"), device="gpu", dtypes=GPU_BINARY_DTYPES)
