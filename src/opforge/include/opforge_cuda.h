/*
 * opforge_cuda.h -- small helpers for CUDA kernels on the aot ABI (.cu sources).
 *
 *   OPFORGE_GRID_STRIDE(i, n)      a grid-stride loop over [0, n) with int64_t indices
 *   OpforgeBlocks(work, threads)   blocks for `work` items, `threads` per block (at least 1)
 *   OpforgeLaunched(what)          after a launch: 0, or throws with the CUDA error's text
 *   OpforgeFail(message)           throws std::runtime_error(message)
 *   OpforgeMath<T>::type           the type to compute T in: float for __half (float16), else T
 *   OpforgeExp(x), OpforgeTanh(x)  exp and tanh that stay accurate under --use_fast_math
 *
 * A kernel function launches on the `stream` it is given and never
 * synchronizes.  Bad input is a non-zero return code.  Errors that deserve
 * words (a failed launch, a library that is missing) are thrown from the
 * kernel's host code: opforge calls every entry point inside try/catch and
 * raises opforge.KernelError naming the op, the kernel function and the
 * message, so no exception goes past opforge's native layer into Python.
 *
 * A launch is checked with cudaGetLastError, which does not wait for the
 * kernel: it catches configuration errors (too many threads, too much shared
 * memory, no kernel image for this GPU).  Errors while the kernel runs show
 * later, at the next synchronizing call.
 */
#ifndef OPFORGE_CUDA_H_
#define OPFORGE_CUDA_H_

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>

#define OPFORGE_GRID_STRIDE(i, n)                                                           \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

// Blocks to cover `work` items; capped (the loops above stride over the rest),
// and at least one so an empty launch is still a valid configuration.
static inline unsigned OpforgeBlocks(int64_t work, int threads) {
  const int64_t cap = int64_t(1) << 30;
  int64_t blocks = (work + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  return static_cast<unsigned>(blocks < cap ? blocks : cap);
}

[[noreturn]] static inline void OpforgeFail(const std::string &message) { throw std::runtime_error(message); }

// cudaGetLastError after a launch (it also clears a non-sticky error, so the
// next call does not see this one again).
static inline int OpforgeLaunched(const char *what) {
  const cudaError_t error = cudaGetLastError();
  if (error == cudaSuccess) return 0;
  char message[300];
  std::snprintf(message, sizeof(message), "CUDA launch of %s failed: %s (cudaError %d)", what,
                cudaGetErrorString(error), static_cast<int>(error));
  OpforgeFail(message);
}

template <typename T>
struct OpforgeMath {
  typedef T type;
};
template <>
struct OpforgeMath<__half> {
  typedef float type;
};

// opforge compiles .cu sources with --use_fast_math, which turns expf into
// ex2.approx(x * log2(e)) -- its error grows with |x| (2 + 1.17|x| ulp) -- and
// tanhf into tanh.approx (about 5e-4 relative).  These keep float results
// within a few ulp, as the CPU kernels' std::exp / std::tanh are.
__device__ __forceinline__ float OpforgeExp(float x) {
  if (x != x) return x;
  x = fminf(fmaxf(x, -104.0f), 89.0f);  // beyond: 0 and inf, without an inf - inf below
  const float n = rintf(x * 1.44269504f);
  float r = fmaf(n, -0.693145751953125f, x);  // x - n ln2 in two steps (ln2's high part is exact in n's range)
  r = fmaf(n, -1.428606765330187e-06f, r);
  return ldexpf(exp2f(r * 1.44269504f), static_cast<int>(n));  // |r| <= ln2 / 2: exp2's error stays ~2 ulp
}
__device__ __forceinline__ double OpforgeExp(double x) { return exp(x); }

__device__ __forceinline__ float OpforgeTanh(float x) {
  const float a = fabsf(x);
  const float e = expm1f(2.0f * a);  // expm1f is not one of the functions fast math swaps for an intrinsic
  return copysignf(a > 9.0f ? 1.0f : e / (e + 2.0f), x);  // tanh(9) rounds to 1 in float; NaN passes through
}
__device__ __forceinline__ double OpforgeTanh(double x) { return tanh(x); }

static inline cudaStream_t OpforgeStream(void *stream) { return static_cast<cudaStream_t>(stream); }

static inline int64_t OpforgeCount(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  return n;
}

#endif  // OPFORGE_CUDA_H_
