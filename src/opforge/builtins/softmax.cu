// softmax on the GPU: y = exp(x - max) / sum(exp(x - max)) along `axis`.
// x is viewed as [outer, len, inner].  Along the last axis (inner == 1) with
// rows of kRowsFrom or more, one block takes a row and reduces it
// cooperatively; otherwise one thread takes a lane (o, i) and walks len
// (neighbouring threads read neighbouring elements when inner > 1).  float16 is computed in float, sums are kept in float (double
// for float64).  Launches go on the caller's stream; nothing synchronizes.
#include <cstdint>
#include <cstring>

#include "custom_aot_extra.h"
#include "opforge_cuda.h"

namespace {

constexpr int kThreads = 256;  // a multiple of the warp size (BlockReduce relies on it)
constexpr int64_t kRowsFrom = 128;  // shorter rows would leave most of a block idle

struct Max {
  template <typename A>
  __device__ A operator()(A a, A b) const { return b > a ? b : a; }
};
struct Sum {
  template <typename A>
  __device__ A operator()(A a, A b) const { return a + b; }
};

// Every thread's v combined; every thread gets the result.
template <typename A, typename Op>
__device__ A BlockReduce(A v, Op op) {
  __shared__ A partial[32];
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, offset));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  __syncthreads();  // the previous call's readers are done with `partial`
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = partial[0];
  for (int w = 1; w < warps; w++) v = op(v, partial[w]);
  return v;
}

template <typename T>
__global__ void SoftmaxRows(const T *x, T *y, int64_t rows, int64_t len) {
  typedef typename OpforgeMath<T>::type M;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T *xr = x + row * len;
    T *yr = y + row * len;
    M top = -INFINITY;
    for (int64_t l = threadIdx.x; l < len; l += blockDim.x) top = Max()(top, M(xr[l]));
    top = BlockReduce(top, Max());
    M sum = 0;
    for (int64_t l = threadIdx.x; l < len; l += blockDim.x) {
      const M e = OpforgeExp(M(xr[l]) - top);
      yr[l] = T(e);
      sum += e;
    }
    const M scale = M(1) / BlockReduce(sum, Sum());
    for (int64_t l = threadIdx.x; l < len; l += blockDim.x) yr[l] = T(M(yr[l]) * scale);
  }
}

template <typename T>
__global__ void SoftmaxLanes(const T *x, T *y, int64_t outer, int64_t len, int64_t inner) {
  typedef typename OpforgeMath<T>::type M;
  OPFORGE_GRID_STRIDE(lane, outer * inner) {
    const int64_t o = lane / inner, i = lane % inner;
    const T *xo = x + o * len * inner + i;
    T *yo = y + o * len * inner + i;
    M top = M(xo[0]);
    for (int64_t l = 1; l < len; l++) top = Max()(top, M(xo[l * inner]));
    M sum = 0;
    for (int64_t l = 0; l < len; l++) {
      const M e = OpforgeExp(M(xo[l * inner]) - top);
      yo[l * inner] = T(e);
      sum += e;
    }
    const M scale = M(1) / sum;
    for (int64_t l = 0; l < len; l++) yo[l * inner] = T(M(yo[l * inner]) * scale);
  }
}

template <typename T>
int Launch(void **params, int64_t outer, int64_t len, int64_t inner, cudaStream_t stream) {
  const T *x = static_cast<const T *>(params[0]);
  T *y = static_cast<T *>(params[1]);
  if (inner == 1 && len >= kRowsFrom) {
    const int64_t cap = int64_t(1) << 30;
    SoftmaxRows<T><<<static_cast<unsigned>(outer < cap ? outer : cap), kThreads, 0, stream>>>(x, y, outer, len);
  } else {
    SoftmaxLanes<T><<<OpforgeBlocks(outer * inner, kThreads), kThreads, 0, stream>>>(x, y, outer, len, inner);
  }
  return OpforgeLaunched("SoftmaxGpu");
}

}  // namespace

extern "C" int SoftmaxGpu(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                          void *stream, void *extra_ptr) {
  AotExtra *extra = static_cast<AotExtra *>(extra_ptr);
  if (nparam < 2 || std::strcmp(dtypes[0], dtypes[1]) != 0) return 1;
  const int rank = ndims[0];
  int64_t axis = extra->Attr<int64_t>("axis");
  if (axis < 0) axis += rank > 0 ? rank : 1;
  if (axis < 0 || axis >= (rank > 0 ? rank : 1)) return 2;  // the op's check rejects this first
  int64_t outer = 1, len = 1, inner = 1;
  for (int d = 0; d < rank; d++) {
    if (d < axis) outer *= shapes[0][d];
    else if (d == axis) len = shapes[0][d];
    else inner *= shapes[0][d];
  }
  if (OpforgeCount(ndims[1], shapes[1]) != outer * len * inner) return 3;
  if (outer * len * inner == 0) return 0;
  cudaStream_t s = OpforgeStream(stream);
  if (!std::strcmp(dtypes[0], "float32")) return Launch<float>(params, outer, len, inner, s);
  if (!std::strcmp(dtypes[0], "float64")) return Launch<double>(params, outer, len, inner, s);
  if (!std::strcmp(dtypes[0], "float16")) return Launch<__half>(params, outer, len, inner, s);
  return 4;
}
