// aot-ABI kernels for tests/test_mindspore_compat.py and the seed-style programs in tests/seeds/.
#include <cstdint>
#include <cstring>

#include "custom_aot_extra.h"

namespace {

int64_t Elements(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

}  // namespace

// RowMaxArg: per row of a 2-D float64 input, the maximum (float64) and its column (int64).
// It writes what its registration row says, whatever the host allocated.
extern "C" int RowMaxArg(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                         void *extra) {
  if (nparam != 3 || ndims[0] != 2) return 1;
  const double *x = static_cast<const double *>(params[0]);
  double *top = static_cast<double *>(params[1]);
  int64_t *where = static_cast<int64_t *>(params[2]);
  const int64_t rows = shapes[0][0], cols = shapes[0][1];
  for (int64_t r = 0; r < rows; ++r) {
    int64_t best = 0;
    for (int64_t c = 1; c < cols; ++c) {
      if (x[r * cols + c] > x[r * cols + best]) best = c;
    }
    top[r] = x[r * cols + best];
    where[r] = best;
  }
  return 0;
}

// Square: y = x * x on float32 (nparam is checked: one input, one output).
extern "C" int Square(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                      void *extra) {
  if (nparam != 2 || std::strcmp(dtypes[0], "float32") != 0) return 1;
  const float *x = static_cast<const float *>(params[0]);
  float *y = static_cast<float *>(params[1]);
  const int64_t n = Elements(ndims[0], shapes[0]);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * x[i];
  return 0;
}

// SquareGrad: dx = 2 * x * dout on float32, the backward kernel of Square.
extern "C" int SquareGrad(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                          void *extra) {
  if (nparam != 3) return 1;
  const float *x = static_cast<const float *>(params[0]);
  const float *dout = static_cast<const float *>(params[1]);
  float *dx = static_cast<float *>(params[2]);
  const int64_t n = Elements(ndims[0], shapes[0]);
  for (int64_t i = 0; i < n; ++i) dx[i] = 2.0f * x[i] * dout[i];
  return 0;
}

// Axis: writes Attr<int64_t>("reduce_axis") and Attr<float>("scale") into a float64 output of two elements.
extern "C" int Axis(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                    void *extra_void) {
  auto *extra = static_cast<AotExtra *>(extra_void);
  double *y = static_cast<double *>(params[nparam - 1]);
  y[0] = static_cast<double>(extra->Attr<int64_t>("reduce_axis"));
  y[1] = static_cast<double>(extra->Attr<float>("scale"));
  return 0;
}
