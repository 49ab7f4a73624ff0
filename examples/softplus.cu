// softplus on the GPU, on the caller's stream: the CUDA kernel of examples/torch_train.py and jax_train.py.
#include "opforge_cuda.h"

__global__ void SoftplusKernel(const OPFORGE_T *x, OPFORGE_T *y, int64_t n) {
  OPFORGE_GRID_STRIDE(i, n) y[i] = max(x[i], OPFORGE_T(0)) + log1p(exp(-abs(x[i])));
}

extern "C" int SoftplusGpu(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                           void *stream, void *extra) {
  const int64_t n = OpforgeCount(ndims[0], shapes[0]);
  SoftplusKernel<<<OpforgeBlocks(n, 256), 256, 0, OpforgeStream(stream)>>>(
      static_cast<const OPFORGE_T *>(params[0]), static_cast<OPFORGE_T *>(params[1]), n);
  return OpforgeLaunched("SoftplusKernel");
}
