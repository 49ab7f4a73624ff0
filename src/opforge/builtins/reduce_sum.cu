// reduce_sum on the GPU: y = x summed over `axes` (all when empty).
// x's dims are split into kept ones (y's, in order) and reduced ones, each
// list with neighbours merged where x is contiguous across them.  When x's
// innermost dim is reduced (or y is small), one block sums one output, its
// threads reading neighbouring elements; otherwise one thread sums one
// output, neighbouring threads reading neighbouring elements.  Sums are kept
// in double for float32/float64 (as the CPU kernel does), float for float16,
// int64 for integers.  Launches go on the caller's stream; nothing synchronizes.
#include <cstdint>
#include <cstring>
#include <vector>

#include "custom_aot_extra.h"
#include "opforge_cuda.h"
#include "reduce_axes.h"

namespace {

constexpr int kThreads = 256;
constexpr int kMaxDims = 12;  // per list, after merging; more is a non-zero return
constexpr int64_t kSmallOutput = 2048;

template <typename T>
struct Acc {
  typedef double type;
};
template <>
struct Acc<__half> {
  typedef float type;
};
template <>
struct Acc<int32_t> {
  typedef int64_t type;
};
template <>
struct Acc<int64_t> {
  typedef int64_t type;
};

struct Dims {  // sizes and x's element strides, outermost first
  int count;
  int64_t size[kMaxDims];
  int64_t stride[kMaxDims];
};

__device__ __forceinline__ int64_t Offset(const Dims &dims, int64_t index) {
  int64_t offset = 0;
  for (int d = dims.count - 1; d >= 0; d--) {
    offset += (index % dims.size[d]) * dims.stride[d];
    index /= dims.size[d];
  }
  return offset;
}

template <typename T>
__global__ void SumPerThread(const T *x, T *y, int64_t ny, int64_t nr, Dims kept, Dims reduced) {
  typedef typename Acc<T>::type A;
  OPFORGE_GRID_STRIDE(o, ny) {
    const T *base = x + Offset(kept, o);
    A sum = 0;
    for (int64_t r = 0; r < nr; r++) sum += A(base[Offset(reduced, r)]);
    y[o] = T(sum);
  }
}

template <typename T>
__global__ void SumPerBlock(const T *x, T *y, int64_t ny, int64_t nr, Dims kept, Dims reduced) {
  typedef typename Acc<T>::type A;
  __shared__ A partial[kThreads];
  for (int64_t o = blockIdx.x; o < ny; o += gridDim.x) {
    const T *base = x + Offset(kept, o);
    A sum = 0;
    for (int64_t r = threadIdx.x; r < nr; r += blockDim.x) sum += A(base[Offset(reduced, r)]);
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int half = kThreads / 2; half > 0; half >>= 1) {
      if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
      __syncthreads();
    }
    if (threadIdx.x == 0) y[o] = T(partial[0]);
    __syncthreads();  // partial[0] read before the next output overwrites it
  }
}

// Appends a dim, merged into the previous one when x steps through both as one.
bool Push(Dims *dims, int64_t size, int64_t stride) {
  const int c = dims->count;
  if (c > 0 && dims->stride[c - 1] == stride * size) {
    dims->size[c - 1] *= size;
    dims->stride[c - 1] = stride;
    return true;
  }
  if (c == kMaxDims) return false;
  dims->size[c] = size;
  dims->stride[c] = stride;
  dims->count = c + 1;
  return true;
}

template <typename T>
int Launch(void **params, int64_t ny, int64_t nr, const Dims &kept, const Dims &reduced, bool per_block,
           cudaStream_t stream) {
  const T *x = static_cast<const T *>(params[0]);
  T *y = static_cast<T *>(params[1]);
  if (per_block) {
    const int64_t cap = int64_t(1) << 30;
    SumPerBlock<T><<<static_cast<unsigned>(ny < cap ? ny : cap), kThreads, 0, stream>>>(x, y, ny, nr, kept, reduced);
  } else {
    SumPerThread<T><<<OpforgeBlocks(ny, kThreads), kThreads, 0, stream>>>(x, y, ny, nr, kept, reduced);
  }
  return OpforgeLaunched("ReduceSumGpu");
}

}  // namespace

extern "C" int ReduceSumGpu(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                            void *stream, void *extra_ptr) {
  AotExtra *extra = static_cast<AotExtra *>(extra_ptr);
  if (nparam < 2 || std::strcmp(dtypes[0], dtypes[1]) != 0) return 1;
  const int rank = ndims[0];
  const int64_t *shape = shapes[0];
  std::vector<bool> reduced;
  if (const int bad = ReducedAxes(extra, rank, ndims[1], &reduced)) return 1 + bad;  // 2: axes, 3: y's rank

  Dims kept_dims{}, reduced_dims{};
  int64_t stride = 1, ny = 1, nr = 1;
  std::vector<int64_t> strides(rank);
  for (int d = rank - 1; d >= 0; d--) {
    strides[d] = stride;
    stride *= shape[d];
  }
  bool inner_reduced = false;  // x's innermost dim of size > 1 is reduced
  for (int d = 0; d < rank; d++) {
    if (shape[d] == 1) continue;
    inner_reduced = reduced[d];
    if (!(reduced[d] ? Push(&reduced_dims, shape[d], strides[d]) : Push(&kept_dims, shape[d], strides[d]))) return 4;
    (reduced[d] ? nr : ny) *= shape[d];
  }
  if (OpforgeCount(ndims[1], shapes[1]) != ny) return 5;
  if (ny == 0) return 0;
  const bool per_block = inner_reduced || ny < kSmallOutput;
  cudaStream_t s = OpforgeStream(stream);
  const char *d = dtypes[0];
  if (!std::strcmp(d, "float32")) return Launch<float>(params, ny, nr, kept_dims, reduced_dims, per_block, s);
  if (!std::strcmp(d, "float64")) return Launch<double>(params, ny, nr, kept_dims, reduced_dims, per_block, s);
  if (!std::strcmp(d, "float16")) return Launch<__half>(params, ny, nr, kept_dims, reduced_dims, per_block, s);
  if (!std::strcmp(d, "int32")) return Launch<int32_t>(params, ny, nr, kept_dims, reduced_dims, per_block, s);
  if (!std::strcmp(d, "int64")) return Launch<int64_t>(params, ny, nr, kept_dims, reduced_dims, per_block, s);
  return 6;
}
