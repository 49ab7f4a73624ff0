// softplus(x) = log(1 + exp(x)) without overflow: the CPU kernel of examples/train_step.py, torch_train.py
// and jax_train.py.
#include <cmath>
#include "custom_aot_extra.h"

extern "C" int Softplus(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                        void *stream, void *extra) {
  const OPFORGE_T *x = static_cast<const OPFORGE_T *>(params[0]);
  OPFORGE_T *y = static_cast<OPFORGE_T *>(params[1]);
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  for (int64_t i = 0; i < n; i++) y[i] = std::max(x[i], OPFORGE_T(0)) + std::log1p(std::exp(-std::abs(x[i])));
  return 0;
}
