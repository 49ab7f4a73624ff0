// CPU version of add_mul_div.cu: three outputs x + y, x * y and x / y.
#include <cstring>
#include "custom_aot_extra.h"

extern "C" int CustomAddMulDiv(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                               void *stream, void *extra) {
  constexpr int kOutput = 2;
  if (nparam != 5) return 1;  // two inputs and three outputs
  for (int i = 0; i < nparam; i++) {
    if (std::strcmp(dtypes[i], "float32") != 0) return 2;
  }
  const float *x = static_cast<const float *>(params[0]);
  const float *y = static_cast<const float *>(params[1]);
  float *sum = static_cast<float *>(params[2]);
  float *product = static_cast<float *>(params[3]);
  float *quotient = static_cast<float *>(params[4]);
  int64_t size = 1;
  for (int i = 0; i < ndims[kOutput]; i++) size *= shapes[kOutput][i];
  for (int64_t i = 0; i < size; i++) {
    sum[i] = x[i] + y[i];
    product[i] = x[i] * y[i];
    quotient[i] = x[i] / y[i];
  }
  return 0;
}
