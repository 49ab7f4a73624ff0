"""lrn: local response normalization across channels (ONNX LRN).

For x of shape N x C x ... :
``y = x / (bias + alpha / size * sum of x^2 over channels c - (size - 1) // 2
.. c + ceil((size - 1) / 2))^beta`` (the window clipped to 0..C-1).  The
kernel keeps a running sum of squares along the channels, per spatial
position.  The gradient is ``lrn_grad``: with d = bias + alpha / size * S,
``dx_k = dy_k d_k^-beta - 2 alpha beta / size * x_k * sum over the channels c
whose window holds k of dy_c x_c d_c^(-beta-1)``.
"""
import numpy as np

import opforge
from opforge import infer
from opforge.builtins.common import FLOATS, floating_point
from opforge.builtins.max_pool import GRADIENT_DTYPES, gradient_op

LRN_ATTRS = "int size, float alpha=0.0001, float beta=0.75, float bias=1.0"
lrn = opforge.op(f"lrn(Tensor x, *, {LRN_ATTRS}) -> Tensor y",
                 traits=["no_side_effect"],
                 doc="ONNX LRN: x / (bias + alpha / size * sum of squares over a window of size channels)^beta.")
lrn.def_infer(infer.same_as(0))
is_float = floating_point("lrn", "x")


@lrn.check
def lrn_check(x, *, size, alpha, beta, bias):
    is_float(x)
    if size < 1:
        return f"'size' is {size}; it must be >= 1"
    if x.rank is not None and x.rank < 2:
        return f"input 'x' has rank {x.rank}; lrn needs N x C x ... (rank >= 2)"
    return None


def window_sums(values, size, transposed=False):
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


def denominators(x, size, alpha, bias):
    """d = bias + alpha / size * (the window sums of x^2), with the attributes as the kernel receives them."""
    alpha, bias = (np.float64(np.float32(v)) for v in (alpha, bias))
    return bias + alpha / size * window_sums(np.square(x.astype(np.float64)), size)


@lrn.reference(fallback=True)
def lrn_reference(x, *, size, alpha, beta, bias):
    return (x / denominators(x, size, alpha, bias) ** np.float64(np.float32(beta))).astype(x.dtype)


@lrn.grad(save=["x"])
def lrn_grad_rule(saved, dy, **attrs):
    return opforge.ops.lrn_grad(dy, saved.x, **attrs)


LRN_CC = r"""
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "custom_aot_extra.h"

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

// params: x, y.  A running sum of squares along the channels, per position.
template <typename T>
void Forward(const Window &w, const T *x, T *y) {
  const int64_t c = w.c, inner = w.inner;
  std::vector<double> sum(inner);
  for (int64_t b = 0; b < w.n; b++) {
    const T *xb = x + b * c * inner;
    T *yb = y + b * c * inner;
    // sum holds, per position, the squares of channels [lo, hi) -- the window of channel ch
    std::fill(sum.begin(), sum.end(), 0.0);
    int64_t hi = 0;
    for (int64_t ch = 0; ch < c; ch++) {
      const int64_t want_hi = std::min(c, ch + w.after + 1), lo = ch - w.before;
      for (; hi < want_hi; hi++)
        for (int64_t i = 0; i < inner; i++) sum[i] += static_cast<double>(xb[hi * inner + i]) * xb[hi * inner + i];
      if (lo - 1 >= 0)
        for (int64_t i = 0; i < inner; i++) {
          sum[i] -= static_cast<double>(xb[(lo - 1) * inner + i]) * xb[(lo - 1) * inner + i];
          if (sum[i] < 0) sum[i] = 0;  // rounding of the running sum
        }
      for (int64_t i = 0; i < inner; i++)
        yb[ch * inner + i] = static_cast<T>(xb[ch * inner + i] / std::pow(w.bias + w.scale * sum[i], w.beta));
    }
  }
}

// params: dy, x, dx.
template <typename T>
void Backward(const Window &w, const T *dy, const T *x, T *dx) {
  const int64_t c = w.c, inner = w.inner;
  std::vector<double> d(c * inner), t(c * inner);  // denominators; dy x d^(-beta-1)
  for (int64_t b = 0; b < w.n; b++) {
    const int64_t at = b * c * inner;
    for (int64_t ch = 0; ch < c; ch++)
      for (int64_t i = 0; i < inner; i++) {
        double sum = 0;
        for (int64_t k = std::max<int64_t>(0, ch - w.before); k <= std::min(c - 1, ch + w.after); k++) {
          const double v = x[at + k * inner + i];
          sum += v * v;
        }
        const int64_t j = ch * inner + i;
        d[j] = w.bias + w.scale * sum;
        t[j] = static_cast<double>(dy[at + j]) * x[at + j] * std::pow(d[j], -w.beta - 1);
      }
    for (int64_t ch = 0; ch < c; ch++)
      for (int64_t i = 0; i < inner; i++) {
        double spread = 0;  // over the channels whose windows hold ch
        for (int64_t k = std::max<int64_t>(0, ch - w.after); k <= std::min(c - 1, ch + w.before); k++)
          spread += t[k * inner + i];
        const int64_t j = ch * inner + i;
        dx[at + j] = static_cast<T>(dy[at + j] * std::pow(d[j], -w.beta) -
                                    2 * w.scale * w.beta * static_cast<double>(x[at + j]) * spread);
      }
  }
}

}  // namespace

extern "C" int Lrn(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                   void *stream, void *extra) {
  Window w;
  if (!ReadWindow(ndims[0], shapes[0], static_cast<AotExtra *>(extra), &w)) return 1;
  if (!std::strcmp(dtypes[0], "float32"))
    Forward(w, static_cast<const float *>(params[0]), static_cast<float *>(params[1]));
  else if (!std::strcmp(dtypes[0], "float64"))
    Forward(w, static_cast<const double *>(params[0]), static_cast<double *>(params[1]));
  else return 2;
  return 0;
}

extern "C" int LrnGrad(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                       void *stream, void *extra) {
  Window w;
  if (!ReadWindow(ndims[1], shapes[1], static_cast<AotExtra *>(extra), &w)) return 1;
  if (!std::strcmp(dtypes[0], "float32"))
    Backward(w, static_cast<const float *>(params[0]), static_cast<const float *>(params[1]),
             static_cast<float *>(params[2]));
  else if (!std::strcmp(dtypes[0], "float64"))
    Backward(w, static_cast<const double *>(params[0]), static_cast<const double *>(params[1]),
             static_cast<double *>(params[2]));
  else return 2;
  return 0;
}
"""
lrn.kernel(function="Lrn", dtypes=[(d,) for d in FLOATS], code=LRN_CC)


# -- the gradient -----------------------------------------------------------------

lrn_grad = gradient_op("lrn", LRN_ATTRS, lrn_check, infer.same_as(0), doc="Gradient of lrn with respect to x.",
                       traits=["no_side_effect"])


@lrn_grad.reference(fallback=True)
def lrn_grad_reference(dy, x, *, size, alpha, beta, bias):
    d = denominators(x, size, alpha, bias)
    alpha, beta = np.float64(np.float32(alpha)), np.float64(np.float32(beta))
    dy64, x64 = dy.astype(np.float64), x.astype(np.float64)
    spread = window_sums(dy64 * x64 * d ** (-beta - 1), size, transposed=True)
    return (dy64 * d ** -beta - 2 * alpha * beta / size * x64 * spread).astype(dy.dtype)


lrn_grad.kernel(function="LrnGrad", dtypes=GRADIENT_DTYPES, code=LRN_CC)
