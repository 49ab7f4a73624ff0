// Compiled by the tests themselves (g++ in a subprocess) into a prebuilt
// library, then loaded by path: y = alpha * x + w.
#include <cstdint>

#include "custom_aot_extra.h"

extern "C" int PrebuiltAxpy(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                            void *stream, void *extra) {
  if (nparam != 3) return 1;
  float alpha = static_cast<AotExtra *>(extra)->Attr<float>("alpha");
  const float *x = static_cast<const float *>(params[0]);
  const float *w = static_cast<const float *>(params[1]);
  float *y = static_cast<float *>(params[2]);
  int64_t n = 1;
  for (int i = 0; i < ndims[2]; ++i) n *= shapes[2][i];
  for (int64_t i = 0; i < n; ++i) y[i] = alpha * x[i] + w[i];
  return 0;
}
