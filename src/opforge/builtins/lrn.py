"""lrn: local response normalization across channels (ONNX LRN).

For x of shape N x C x ... :
``y = x / (bias + alpha / size * sum of x^2 over channels c - (size - 1) // 2
.. c + ceil((size - 1) / 2))^beta`` (the window clipped to 0..C-1).  The
kernels (float32, float64; generic and AVX2 builds) keep a running sum of
squares along the channels in double, for blocks of positions run on opforge's
pool, and take d^-beta as e^(-beta log d) in the element type with vecmath.h.
The gradient is ``lrn_grad``: with d = bias + alpha / size * S,
``dx_k = dy_k d_k^-beta - 2 alpha beta / size * x_k * sum over the channels c
whose window holds k of dy_c x_c d_c^(-beta-1)``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.common import FLOATS, floating_point
from opforge.builtins.exp import VECMATH
from opforge.builtins.max_pool import gradient_op

if TYPE_CHECKING:
    import numpy.typing as npt

    from opforge import TensorSpec

LRN_ATTRS = "int size, float alpha=0.0001, float beta=0.75, float bias=1.0"
lrn = opforge.op(f"lrn(Tensor x, *, {LRN_ATTRS}) -> Tensor y",
                 traits=["no_side_effect"],
                 doc="ONNX LRN: x / (bias + alpha / size * sum of squares over a window of size channels)^beta.")
lrn.def_infer(infer.same_as(0))
is_float = floating_point("lrn", "x")


@lrn.check
def lrn_check(x: TensorSpec, *, size: int, alpha: float, beta: float, bias: float) -> str | None:
    is_float(x)
    if size < 1:
        return f"'size' is {size}; it must be >= 1"
    if x.rank is not None and x.rank < 2:
        return f"input 'x' has rank {x.rank}; lrn needs N x C x ... (rank >= 2)"
    return None


def window_sums(values: npt.NDArray[Any], size: int, transposed: bool = False) -> npt.NDArray[Any]:
    """Per channel c, the sum of ``values`` over its window c - before .. c + after (clipped); transposed: over
    the channels whose windows hold c (c - after .. c + before)."""
    channels = values.shape[1]
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    if transposed:
        before, after = after, before
    total = np.zeros_like(values)
    for c in range(channels):
        total[:, c] = values[:, max(0, c - before): min(channels, c + after + 1)].sum(axis=1)
    return total


def denominators(x: npt.NDArray[Any], size: int, alpha: float, bias: float) -> npt.NDArray[Any]:
    """d = bias + alpha / size * (the window sums of x^2), with the attributes as the kernel receives them."""
    alpha, bias = (np.float64(np.float32(v)) for v in (alpha, bias))
    return bias + alpha / size * window_sums(np.square(x.astype(np.float64)), size)


@lrn.reference(fallback=True)
def lrn_reference(x: npt.NDArray[Any], *, size: int, alpha: float, beta: float, bias: float) -> npt.NDArray[Any]:
    y: npt.NDArray[Any] = x / denominators(x, size, alpha, bias) ** np.float64(np.float32(beta))
    return y.astype(x.dtype)


@lrn.grad(save=["x"])
def lrn_grad_rule(saved: Any, dy: Any, **attrs: Any) -> Any:
    return opforge.ops.lrn_grad(dy, saved.x, **attrs)


LRN_CC = r"""
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "custom_aot_extra.h"
#include "opforge/parallel.h"
#include "vecmath.h"

namespace {

// x's layout (N, C, positions per channel) and the attributes.
struct Window {
  int64_t n, c, inner, before, after;
  double scale, beta, bias;  // scale = alpha / size
};

bool ReadWindow(int ndim, const int64_t *shape, AotExtra *extra, Window *w) {
  if (ndim < 2) return false;
  const int64_t size = extra->Attr<int64_t>("size");
  if (size < 1) return false;
  w->n = shape[0];
  w->c = shape[1];
  w->inner = 1;
  for (int d = 2; d < ndim; d++) w->inner *= shape[d];
  w->before = (size - 1) / 2;
  w->after = size - 1 - w->before;
  w->scale = extra->Attr<float>("alpha") / static_cast<double>(size);
  w->beta = extra->Attr<float>("beta");
  w->bias = extra->Attr<float>("bias");
  return true;
}

// The channel loops run over blocks of this many positions (their running sums stay in cache); the
// (sample, block) items run on opforge's pool.
const int64_t kBlock = 256;
const int64_t kParallelWork = 1 << 15;

// Runs body(scratch, sample, first position, positions) for every block of positions of every sample, on
// the pool; each range of blocks makes one Scratch(w) for its own use.
template <typename Scratch, typename Body>
void ForBlocks(const Window &w, Body body) {
  const int64_t blocks = (w.inner + kBlock - 1) / kBlock;
  const int64_t grain = std::max<int64_t>(1, kParallelWork / std::max<int64_t>(1, w.c * kBlock));
  opforge::parallel_for(0, w.n * blocks, grain, [&](int64_t lo, int64_t hi) {
    Scratch scratch(w);
    for (int64_t item = lo; item < hi; item++) {
      const int64_t first = item % blocks * kBlock;
      body(scratch, item / blocks, first, std::min(kBlock, w.inner - first));
    }
  });
}

struct NoScratch {
  explicit NoScratch(const Window &) {}
};

// Backward's per-block values of every channel.
template <typename T>
struct ChannelScratch {
  std::vector<T> power, t;  // d^-beta, dy x d^(-beta-1)
  explicit ChannelScratch(const Window &w) : power(w.c * kBlock), t(w.c * kBlock) {}
};

// Running window sums along the channels of one block of m positions (row ch of `rows` at
// rows + ch * stride): window(ch, sum) for each channel ch, with sum[i] the window's total at position i
// (double: the running sum adds and subtracts).  square: whether to sum the squares of the rows.
template <typename T, typename Window_>
void WindowSums(int64_t channels, int64_t before, int64_t after, const T *rows, int64_t stride, int64_t m,
                bool square, double *sum, Window_ window) {
  std::fill(sum, sum + m, 0.0);
  int64_t hi = 0;
  for (int64_t ch = 0; ch < channels; ch++) {
    for (const int64_t want = std::min(channels, ch + after + 1); hi < want; hi++) {
      const T *r = rows + hi * stride;
      if (square)
        for (int64_t i = 0; i < m; i++) sum[i] += static_cast<double>(r[i]) * r[i];
      else
        for (int64_t i = 0; i < m; i++) sum[i] += r[i];
    }
    const int64_t gone = ch - before - 1;  // the channel that just left the window
    if (gone >= 0) {
      const T *r = rows + gone * stride;
      if (square)  // clamped: the running sum's rounding must not make a sum of squares negative
        for (int64_t i = 0; i < m; i++) sum[i] = std::max(0.0, sum[i] - static_cast<double>(r[i]) * r[i]);
      else
        for (int64_t i = 0; i < m; i++) sum[i] -= r[i];
    }
    window(ch, sum);
  }
}

// d^-beta for d = bias + scale * sum: e^(-beta log d) in T with vecmath.h (vectorised), d rounded to T.
template <typename T>
void PowerOfDenominator(const Window &w, const double *sum, int64_t m, T *d, T *power) {
  const T nbeta = static_cast<T>(-w.beta);
  for (int64_t i = 0; i < m; i++) d[i] = static_cast<T>(w.bias + w.scale * sum[i]);
  for (int64_t i = 0; i < m; i++) power[i] = vecmath::Exp(nbeta * vecmath::Log(d[i]));
}

// params: x, y.
template <typename T>
void Forward(const Window &w, const T *x, T *y) {
  ForBlocks<NoScratch>(w, [&](NoScratch &, int64_t b, int64_t first, int64_t m) {
    double sum[kBlock];
    T d[kBlock], power[kBlock];
    const int64_t at = b * w.c * w.inner + first;
    WindowSums(w.c, w.before, w.after, x + at, w.inner, m, true, sum, [&](int64_t ch, const double *s) {
      PowerOfDenominator(w, s, m, d, power);
      const T *xr = x + at + ch * w.inner;
      T *yr = y + at + ch * w.inner;
      for (int64_t i = 0; i < m; i++) yr[i] = xr[i] * power[i];
    });
  });
}

// params: dy, x, dx.  Per block: every channel's d^-beta and t = dy x d^(-beta-1), then the sums of t over
// the channels whose windows hold each channel (the window transposed: after and before swapped).
template <typename T>
void Backward(const Window &w, const T *dy, const T *x, T *dx) {
  const T factor = static_cast<T>(2 * w.scale * w.beta);
  ForBlocks<ChannelScratch<T>>(w, [&](ChannelScratch<T> &scratch, int64_t b, int64_t first, int64_t m) {
    double sum[kBlock];
    T d[kBlock];
    std::vector<T> &power = scratch.power, &t = scratch.t;
    const int64_t at = b * w.c * w.inner + first;
    WindowSums(w.c, w.before, w.after, x + at, w.inner, m, true, sum, [&](int64_t ch, const double *s) {
      T *p = power.data() + ch * kBlock, *tr = t.data() + ch * kBlock;
      PowerOfDenominator(w, s, m, d, p);
      const T *xr = x + at + ch * w.inner, *dyr = dy + at + ch * w.inner;
      for (int64_t i = 0; i < m; i++) tr[i] = dyr[i] * xr[i] * p[i] / d[i];
    });
    WindowSums(w.c, w.after, w.before, t.data(), kBlock, m, false, sum, [&](int64_t ch, const double *spread) {
      const T *p = power.data() + ch * kBlock;
      const T *xr = x + at + ch * w.inner, *dyr = dy + at + ch * w.inner;
      T *dxr = dx + at + ch * w.inner;
      for (int64_t i = 0; i < m; i++) dxr[i] = dyr[i] * p[i] - factor * xr[i] * static_cast<T>(spread[i]);
    });
  });
}

}  // namespace

typedef OPFORGE_T T;

extern "C" int Lrn(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                   void *stream, void *extra) {
  try {
    Window w;
    if (!ReadWindow(ndims[0], shapes[0], static_cast<AotExtra *>(extra), &w)) return 1;
    Forward(w, static_cast<const T *>(params[0]), static_cast<T *>(params[1]));
    return 0;
  } catch (...) {  // (attribute lookup, the pool, allocation): nothing crosses the ABI
    return 2;
  }
}

extern "C" int LrnGrad(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                       void *stream, void *extra) {
  try {
    Window w;
    if (!ReadWindow(ndims[1], shapes[1], static_cast<AotExtra *>(extra), &w)) return 1;
    Backward(w, static_cast<const T *>(params[0]), static_cast<const T *>(params[1]), static_cast<T *>(params[2]));
    return 0;
  } catch (...) {
    return 2;
  }
}
"""
for _isa in (None, "avx2"):  # vecmath.h's rules: explicit FMAs only, selects as blends
    lrn.kernel(function="Lrn", dtypes={"x": FLOATS}, isa=_isa, code=LRN_CC,
               include_dirs=VECMATH["include_dirs"], cflags=VECMATH["cflags"])
del _isa


# -- the gradient -----------------------------------------------------------------

lrn_grad = gradient_op("lrn", LRN_ATTRS, lrn_check, infer.same_as(0), doc="Gradient of lrn with respect to x.",
                       traits=["no_side_effect"])


@lrn_grad.reference(fallback=True)
def lrn_grad_reference(dy: npt.NDArray[Any], x: npt.NDArray[Any], *, size: int, alpha: float, beta: float,
                       bias: float) -> npt.NDArray[Any]:
    d = denominators(x, size, alpha, bias)
    alpha, beta = np.float64(np.float32(alpha)), np.float64(np.float32(beta))
    dy64, x64 = dy.astype(np.float64), x.astype(np.float64)
    spread = window_sums(dy64 * x64 * d ** (-beta - 1), size, transposed=True)
    dx: npt.NDArray[Any] = dy64 * d ** -beta - 2 * alpha * beta / size * x64 * spread
    return dx.astype(dy.dtype)


for _isa in (None, "avx2"):
    lrn_grad.kernel(function="LrnGrad", dtypes={"dy": FLOATS, "x": FLOATS}, isa=_isa, code=LRN_CC,
                    include_dirs=VECMATH["include_dirs"], cflags=VECMATH["cflags"])
del _isa
