// GPU kernels of the elementwise built-ins, one library for all of them (one
// nvcc build): the unary ops (neg, abs, relu, leaky_relu, exp, log, sqrt,
// tanh, sigmoid) and the broadcasting binary ops (add, sub, mul, div,
// maximum, minimum).  Each exported function picks
// its element type from the dtype name at run time; float16 is computed in
// float.  Inputs and outputs are contiguous device memory; every launch goes
// on the caller's stream and nothing synchronizes.
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "custom_aot_extra.h"
#include "opforge_cuda.h"

namespace {

constexpr int kThreads = 256;
constexpr int kMaxRank = 12;  // after merging dims; more is a non-zero return

// 16 bytes of elements, loaded and stored as one access when aligned.
template <typename T>
struct alignas(16) Pack {
  static constexpr int kWidth = 16 / sizeof(T);
  T v[kWidth];
};

static bool Aligned(const void *p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// ---------------------------------------------------------------- operations

struct NegOp {
  template <typename M>
  __device__ M operator()(M x) const { return -x; }
};
struct AbsOp {  // fabs for floats: -0.0 gives 0.0 and NaN stays NaN, as in np.abs
  template <typename M>
  __device__ M operator()(M x) const {
    if constexpr (std::is_floating_point<M>::value) return fabs(x);
    else return x < M(0) ? -x : x;
  }
};
struct ReluOp {  // NaN (x != x) passes through, as np.maximum does
  template <typename M>
  __device__ M operator()(M x) const { return x > M(0) || x != x ? x : M(0); }
};
struct LeakyReluOp {
  float alpha;  // the attribute crosses the ABI as float (as in the CPU kernel)
  template <typename M>
  __device__ M operator()(M x) const { return x > M(0) ? x : M(alpha) * x; }
};
struct ExpOp {
  template <typename M>
  __device__ M operator()(M x) const { return OpforgeExp(x); }
};
// Correctly rounded sqrt and division in float (fast math would give the
// approximate ones), and log through log1pf near 1, where logf's absolute
// error would be a large relative one.
__device__ __forceinline__ float Sqrt(float x) { return __fsqrt_rn(x); }
__device__ __forceinline__ double Sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float Divide(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double Divide(double a, double b) { return a / b; }
__device__ __forceinline__ float Log(float x) { return x >= 0.5f && x <= 2.0f ? log1pf(x - 1.0f) : logf(x); }
__device__ __forceinline__ double Log(double x) { return log(x); }

struct SqrtOp {
  template <typename M>
  __device__ M operator()(M x) const { return Sqrt(x); }
};
struct LogOp {
  template <typename M>
  __device__ M operator()(M x) const { return Log(x); }
};
struct TanhOp {
  template <typename M>
  __device__ M operator()(M x) const { return OpforgeTanh(x); }
};
struct SigmoidOp {  // exp(-x) -> inf for very negative x gives 0, -> 0 for large x gives 1
  template <typename M>
  __device__ M operator()(M x) const { return M(1) / (M(1) + OpforgeExp(-x)); }
};

struct AddOp {
  template <typename M>
  __device__ M operator()(M a, M b) const { return a + b; }
};
struct SubOp {
  template <typename M>
  __device__ M operator()(M a, M b) const { return a - b; }
};
struct MulOp {
  template <typename M>
  __device__ M operator()(M a, M b) const { return a * b; }
};
struct DivOp {
  template <typename M>
  __device__ M operator()(M a, M b) const { return Divide(a, b); }
};
struct MaximumOp {  // a NaN on either side gives NaN, as np.maximum does
  template <typename M>
  __device__ M operator()(M a, M b) const { return a != a || a > b ? a : b; }
};
struct MinimumOp {
  template <typename M>
  __device__ M operator()(M a, M b) const { return a != a || a < b ? a : b; }
};

template <typename T, typename F>
__device__ __forceinline__ T Apply(F f, T x) {
  typedef typename OpforgeMath<T>::type M;
  return T(f(M(x)));
}
template <typename T, typename F>
__device__ __forceinline__ T Apply(F f, T a, T b) {
  typedef typename OpforgeMath<T>::type M;
  return T(f(M(a), M(b)));
}

// ------------------------------------------------------------------- unary

template <typename T, typename F>
__global__ void UnaryScalar(const T *x, T *y, int64_t n, F f) {
  OPFORGE_GRID_STRIDE(i, n) y[i] = Apply(f, x[i]);
}

// 16-byte loads and stores over the packs, then the tail element by element.
template <typename T, typename F>
__global__ void UnaryPacked(const T *x, T *y, int64_t n, F f) {
  constexpr int W = Pack<T>::kWidth;
  const int64_t packs = n / W;
  const Pack<T> *xp = reinterpret_cast<const Pack<T> *>(x);
  Pack<T> *yp = reinterpret_cast<Pack<T> *>(y);
  OPFORGE_GRID_STRIDE(p, packs) {
    Pack<T> v = xp[p];
#pragma unroll
    for (int k = 0; k < W; k++) v.v[k] = Apply(f, v.v[k]);
    yp[p] = v;
  }
  OPFORGE_GRID_STRIDE(i, n - packs * W) y[packs * W + i] = Apply(f, x[packs * W + i]);
}

template <typename T, typename F>
int LaunchUnary(void **params, int64_t n, cudaStream_t stream, F f, const char *name) {
  const T *x = static_cast<const T *>(params[0]);
  T *y = static_cast<T *>(params[1]);
  if (n == 0) return 0;
  if (Aligned(x) && Aligned(y)) {
    UnaryPacked<T><<<OpforgeBlocks(n / Pack<T>::kWidth + 1, kThreads), kThreads, 0, stream>>>(x, y, n, f);
  } else {
    UnaryScalar<T><<<OpforgeBlocks(n, kThreads), kThreads, 0, stream>>>(x, y, n, f);
  }
  return OpforgeLaunched(name);
}

// x then y, same shape and dtype; Ints: whether the op has integer variants.
template <bool Ints, typename F>
int Unary(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream, F f,
          const char *name) {
  if (nparam < 2 || std::strcmp(dtypes[0], dtypes[1]) != 0) return 1;
  const int64_t n = OpforgeCount(ndims[0], shapes[0]);
  if (OpforgeCount(ndims[1], shapes[1]) != n) return 2;
  cudaStream_t s = OpforgeStream(stream);
  const char *d = dtypes[0];
  if (!std::strcmp(d, "float32")) return LaunchUnary<float>(params, n, s, f, name);
  if (!std::strcmp(d, "float64")) return LaunchUnary<double>(params, n, s, f, name);
  if (!std::strcmp(d, "float16")) return LaunchUnary<__half>(params, n, s, f, name);
  if constexpr (Ints) {
    if (!std::strcmp(d, "int32")) return LaunchUnary<int32_t>(params, n, s, f, name);
    if (!std::strcmp(d, "int64")) return LaunchUnary<int64_t>(params, n, s, f, name);
  }
  return 3;  // a dtype this kernel was not declared for
}

// ------------------------------------------------------------------ binary

template <typename T, typename F>
__global__ void BinarySame(const T *a, const T *b, T *y, int64_t n, F f) {
  OPFORGE_GRID_STRIDE(i, n) y[i] = Apply(f, a[i], b[i]);
}

template <typename T, typename F>
__global__ void BinarySamePacked(const T *a, const T *b, T *y, int64_t n, F f) {
  constexpr int W = Pack<T>::kWidth;
  const int64_t packs = n / W;
  const Pack<T> *ap = reinterpret_cast<const Pack<T> *>(a);
  const Pack<T> *bp = reinterpret_cast<const Pack<T> *>(b);
  Pack<T> *yp = reinterpret_cast<Pack<T> *>(y);
  OPFORGE_GRID_STRIDE(p, packs) {
    Pack<T> u = ap[p];
    const Pack<T> v = bp[p];
#pragma unroll
    for (int k = 0; k < W; k++) u.v[k] = Apply(f, u.v[k], v.v[k]);
    yp[p] = u;
  }
  OPFORGE_GRID_STRIDE(i, n - packs * W) y[packs * W + i] = Apply(f, a[packs * W + i], b[packs * W + i]);
}

// One side a single element (read once per thread from device memory).
template <typename T, typename F, bool ScalarA>
__global__ void BinaryScalar(const T *a, const T *b, T *y, int64_t n, F f) {
  const T s = ScalarA ? a[0] : b[0];
  OPFORGE_GRID_STRIDE(i, n) y[i] = ScalarA ? Apply(f, s, b[i]) : Apply(f, a[i], s);
}

// The output's dims (merged) and each input's element strides along them, 0
// where it is broadcast.  Passed by value as a kernel parameter.
struct Geometry {
  int rank;
  int64_t shape[kMaxRank];
  int64_t sa[kMaxRank];
  int64_t sb[kMaxRank];
};

template <typename T, typename F>
__global__ void BinaryBroadcast(const T *a, const T *b, T *y, int64_t n, Geometry g, F f) {
  OPFORGE_GRID_STRIDE(i, n) {
    int64_t rest = i, oa = 0, ob = 0;
    for (int d = g.rank - 1; d >= 0; d--) {
      const int64_t c = rest % g.shape[d];
      rest /= g.shape[d];
      oa += c * g.sa[d];
      ob += c * g.sb[d];
    }
    y[i] = Apply(f, a[oa], b[ob]);
  }
}

// Element strides of an input read at the output's rank (0 along broadcast dims).
void BroadcastStrides(int ndim, const int64_t *shape, int rank, int64_t *strides) {
  int64_t stride = 1;
  for (int d = rank - 1; d >= 0; d--) {
    const int k = d - (rank - ndim);
    if (k < 0) {
      strides[d] = 0;
      continue;
    }
    strides[d] = shape[k] == 1 ? 0 : stride;
    stride *= shape[k];
  }
}

// The output's dims without size-1 ones, neighbours merged where both inputs
// step through them as through one dim.  False when more than kMaxRank remain.
bool MakeGeometry(int ndim_a, const int64_t *shape_a, int ndim_b, const int64_t *shape_b, int rank,
                  const int64_t *out, Geometry *g) {
  int64_t sa[64], sb[64];
  if (rank > 64) return false;
  BroadcastStrides(ndim_a, shape_a, rank, sa);
  BroadcastStrides(ndim_b, shape_b, rank, sb);
  g->rank = 0;
  for (int d = 0; d < rank; d++) {
    if (out[d] == 1) continue;
    const int r = g->rank;
    if (r > 0 && g->sa[r - 1] == sa[d] * out[d] && g->sb[r - 1] == sb[d] * out[d]) {
      g->shape[r - 1] *= out[d];
      g->sa[r - 1] = sa[d];
      g->sb[r - 1] = sb[d];
      continue;
    }
    if (r == kMaxRank) return false;
    g->shape[r] = out[d];
    g->sa[r] = sa[d];
    g->sb[r] = sb[d];
    g->rank = r + 1;
  }
  return true;
}

template <typename T, typename F>
int LaunchBinary(void **params, int *ndims, int64_t **shapes, cudaStream_t stream, F f, const char *name) {
  const T *a = static_cast<const T *>(params[0]);
  const T *b = static_cast<const T *>(params[1]);
  T *y = static_cast<T *>(params[2]);
  const int rank = ndims[2];
  const int64_t n = OpforgeCount(rank, shapes[2]);
  const int64_t na = OpforgeCount(ndims[0], shapes[0]), nb = OpforgeCount(ndims[1], shapes[1]);
  if (ndims[0] > rank || ndims[1] > rank) return 4;
  if (n == 0) return 0;
  const unsigned blocks = OpforgeBlocks(n, kThreads);
  // An input with as many elements as the output is laid out like it
  // (broadcasting only adds size-1 dims), so it is read linearly.
  if (na == n && nb == n) {
    if (Aligned(a) && Aligned(b) && Aligned(y))
      BinarySamePacked<T><<<OpforgeBlocks(n / Pack<T>::kWidth + 1, kThreads), kThreads, 0, stream>>>(a, b, y, n, f);
    else
      BinarySame<T><<<blocks, kThreads, 0, stream>>>(a, b, y, n, f);
  } else if (na == n && nb == 1) {
    BinaryScalar<T, F, false><<<blocks, kThreads, 0, stream>>>(a, b, y, n, f);
  } else if (na == 1 && nb == n) {
    BinaryScalar<T, F, true><<<blocks, kThreads, 0, stream>>>(a, b, y, n, f);
  } else {
    Geometry g;
    if (!MakeGeometry(ndims[0], shapes[0], ndims[1], shapes[1], rank, shapes[2], &g)) return 5;
    BinaryBroadcast<T><<<blocks, kThreads, 0, stream>>>(a, b, y, n, g, f);
  }
  return OpforgeLaunched(name);
}

// a, b, then y; one dtype for all three (mixed dtypes match no GPU kernel).
template <bool Ints, typename F>
int Binary(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream, F f,
           const char *name) {
  if (nparam < 3 || std::strcmp(dtypes[0], dtypes[1]) != 0 || std::strcmp(dtypes[0], dtypes[2]) != 0) return 1;
  cudaStream_t s = OpforgeStream(stream);
  const char *d = dtypes[0];
  if (!std::strcmp(d, "float32")) return LaunchBinary<float>(params, ndims, shapes, s, f, name);
  if (!std::strcmp(d, "float64")) return LaunchBinary<double>(params, ndims, shapes, s, f, name);
  if (!std::strcmp(d, "float16")) return LaunchBinary<__half>(params, ndims, shapes, s, f, name);
  if constexpr (Ints) {
    if (!std::strcmp(d, "int32")) return LaunchBinary<int32_t>(params, ndims, shapes, s, f, name);
    if (!std::strcmp(d, "int64")) return LaunchBinary<int64_t>(params, ndims, shapes, s, f, name);
  }
  return 3;
}

}  // namespace

#define OPFORGE_ABI \
  int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream, void *extra
#define OPFORGE_ARGS nparam, params, ndims, shapes, dtypes, stream

extern "C" {

int NegGpu(OPFORGE_ABI) { return Unary<true>(OPFORGE_ARGS, NegOp(), "NegGpu"); }
int AbsGpu(OPFORGE_ABI) { return Unary<true>(OPFORGE_ARGS, AbsOp(), "AbsGpu"); }
int SqrtGpu(OPFORGE_ABI) { return Unary<false>(OPFORGE_ARGS, SqrtOp(), "SqrtGpu"); }
int LogGpu(OPFORGE_ABI) { return Unary<false>(OPFORGE_ARGS, LogOp(), "LogGpu"); }
int ReluGpu(OPFORGE_ABI) { return Unary<true>(OPFORGE_ARGS, ReluOp(), "ReluGpu"); }
int ExpGpu(OPFORGE_ABI) { return Unary<false>(OPFORGE_ARGS, ExpOp(), "ExpGpu"); }
int TanhGpu(OPFORGE_ABI) { return Unary<false>(OPFORGE_ARGS, TanhOp(), "TanhGpu"); }
int SigmoidGpu(OPFORGE_ABI) { return Unary<false>(OPFORGE_ARGS, SigmoidOp(), "SigmoidGpu"); }

int LeakyReluGpu(OPFORGE_ABI) {
  LeakyReluOp op{static_cast<AotExtra *>(extra)->Attr<float>("alpha")};
  return Unary<false>(OPFORGE_ARGS, op, "LeakyReluGpu");
}

int AddGpu(OPFORGE_ABI) { return Binary<true>(OPFORGE_ARGS, AddOp(), "AddGpu"); }
int SubGpu(OPFORGE_ABI) { return Binary<true>(OPFORGE_ARGS, SubOp(), "SubGpu"); }
int MulGpu(OPFORGE_ABI) { return Binary<true>(OPFORGE_ARGS, MulOp(), "MulGpu"); }
int DivGpu(OPFORGE_ABI) { return Binary<false>(OPFORGE_ARGS, DivOp(), "DivGpu"); }
int MaximumGpu(OPFORGE_ABI) { return Binary<true>(OPFORGE_ARGS, MaximumOp(), "MaximumGpu"); }
int MinimumGpu(OPFORGE_ABI) { return Binary<true>(OPFORGE_ARGS, MinimumOp(), "MinimumGpu"); }

}  // extern "C"
