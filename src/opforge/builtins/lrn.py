"""lrn: local response normalization across channels (ONNX LRN).

For x of shape N x C x ... :
``y = x / (bias + alpha / size * sum of x^2 over channels c - (size - 1) // 2
.. c + ceil((size - 1) / 2))^beta`` (the window clipped to 0..C-1).  The
kernel keeps a running sum of squares along the channels, per spatial
position.  No gradient (trait no_grad): models use LRN for inference; train
with another normalization.
"""
import numpy as np

import opforge
from opforge import infer
from opforge.builtins.common import floating_point

lrn = opforge.op("lrn(Tensor x, *, int size, float alpha=0.0001, float beta=0.75, float bias=1.0) -> Tensor y",
                 traits=["no_side_effect", "no_grad"],
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


@lrn.reference(fallback=True)
def lrn_reference(x, *, size, alpha, beta, bias):
    squares = np.square(x.astype(np.float64))
    channels = x.shape[1]
    total = np.zeros_like(squares)
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    for c in range(channels):
        total[:, c] = squares[:, max(0, c - before): min(channels, c + after + 1)].sum(axis=1)
    alpha, beta, bias = (np.float64(np.float32(v)) for v in (alpha, beta, bias))  # as the kernel receives them
    return (x / (bias + alpha / size * total) ** beta).astype(x.dtype)


lrn.kernel(function="Lrn", dtypes=[(d,) for d in ("float32", "float64")], code=r"""
#include <cmath>
#include <cstring>
#include <vector>

#include "custom_aot_extra.h"

template <typename T>
static int Run(const T *x, T *y, int ndim, const int64_t *shape, AotExtra *extra) {
  if (ndim < 2) return 1;
  const int64_t size = extra->Attr<int64_t>("size");
  if (size < 1) return 1;
  const double alpha = extra->Attr<float>("alpha"), beta = extra->Attr<float>("beta"),
               bias = extra->Attr<float>("bias");
  const int64_t n = shape[0], c = shape[1], before = (size - 1) / 2, after = size - 1 - before;
  int64_t inner = 1;
  for (int d = 2; d < ndim; d++) inner *= shape[d];
  const double scale = alpha / static_cast<double>(size);
  std::vector<double> sum(inner);
  for (int64_t b = 0; b < n; b++) {
    const T *xb = x + b * c * inner;
    T *yb = y + b * c * inner;
    // sum holds, per position, the squares of channels [lo, hi) -- the window of channel ch
    std::fill(sum.begin(), sum.end(), 0.0);
    int64_t hi = 0;
    for (int64_t ch = 0; ch < c; ch++) {
      const int64_t want_hi = std::min(c, ch + after + 1), lo = ch - before;
      for (; hi < want_hi; hi++)
        for (int64_t i = 0; i < inner; i++) sum[i] += static_cast<double>(xb[hi * inner + i]) * xb[hi * inner + i];
      if (lo - 1 >= 0)
        for (int64_t i = 0; i < inner; i++) {
          sum[i] -= static_cast<double>(xb[(lo - 1) * inner + i]) * xb[(lo - 1) * inner + i];
          if (sum[i] < 0) sum[i] = 0;  // rounding of the running sum
        }
      for (int64_t i = 0; i < inner; i++)
        yb[ch * inner + i] = static_cast<T>(xb[ch * inner + i] / std::pow(bias + scale * sum[i], beta));
    }
  }
  return 0;
}

extern "C" int Lrn(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                   void *stream, void *extra) {
  AotExtra *e = static_cast<AotExtra *>(extra);
  if (!std::strcmp(dtypes[0], "float32"))
    return Run(static_cast<const float *>(params[0]), static_cast<float *>(params[1]), ndims[0], shapes[0], e);
  if (!std::strcmp(dtypes[0], "float64"))
    return Run(static_cast<const double *>(params[0]), static_cast<double *>(params[1]), ndims[0], shapes[0], e);
  return 2;
}
""")
