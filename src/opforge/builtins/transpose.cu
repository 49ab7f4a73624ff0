// transpose on the GPU: y's axis k is x's axis perm[k] (empty perm: the last
// two swapped).  Elements are moved by size (1, 2, 4 or 8 bytes), so one
// library serves every dtype.  y's dims are merged where x stays contiguous
// across them (as in the CPU kernel); a batched matrix transpose -- the
// common case, and what an empty perm gives -- goes through 32x32 tiles in
// shared memory so both the reads and the writes are coalesced; any other
// permutation maps each output index to its input offset.  Launches go on the
// caller's stream; nothing synchronizes.
#include <cstdint>
#include <cstring>
#include <vector>

#include "custom_aot_extra.h"
#include "elements.h"
#include "opforge_cuda.h"

namespace {

constexpr int kThreads = 256;
constexpr int kMaxRank = 12;  // after merging; more is a non-zero return
constexpr int kTile = 32, kRows = 8;

struct Geometry {  // y's dims, outermost first, and x's element strides along them
  int rank;
  int64_t size[kMaxRank];
  int64_t stride[kMaxRank];
};

template <typename E>
__global__ void Gather(const E *x, E *y, int64_t n, Geometry g) {
  OPFORGE_GRID_STRIDE(i, n) {
    int64_t rest = i, offset = 0;
    for (int d = g.rank - 1; d >= 0; d--) {
      offset += (rest % g.size[d]) * g.stride[d];
      rest /= g.size[d];
    }
    y[i] = x[offset];
  }
}

// x is [batch, cols, rows], y is [batch, rows, cols]: y[b, r, c] = x[b, c, r].
template <typename E>
__global__ void Tiled(const E *x, E *y, int64_t batch, int64_t rows, int64_t cols) {
  __shared__ E tile[kTile][kTile + 1];  // +1: columns fall in different banks
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kTile, c0 = static_cast<int64_t>(blockIdx.y) * kTile;
  for (int64_t b = blockIdx.z; b < batch; b += gridDim.z) {
    const E *xb = x + b * rows * cols;
    E *yb = y + b * rows * cols;
    for (int j = threadIdx.y; j < kTile; j += kRows) {
      const int64_t c = c0 + j, r = r0 + threadIdx.x;
      if (c < cols && r < rows) tile[j][threadIdx.x] = xb[c * rows + r];
    }
    __syncthreads();
    for (int j = threadIdx.y; j < kTile; j += kRows) {
      const int64_t r = r0 + j, c = c0 + threadIdx.x;
      if (r < rows && c < cols) yb[r * cols + c] = tile[threadIdx.x][j];
    }
    __syncthreads();  // the tile is read before the next batch entry overwrites it
  }
}

template <typename E>
int Launch(const void *x_ptr, void *y_ptr, int64_t n, const Geometry &g, cudaStream_t stream) {
  const E *x = static_cast<const E *>(x_ptr);
  E *y = static_cast<E *>(y_ptr);
  // A batched matrix transpose: y = [batch,] rows, cols with x's strides [rows * cols,] 1, rows.
  const int m = g.rank;
  const bool matrix = m >= 2 && g.stride[m - 2] == 1 && g.stride[m - 1] == g.size[m - 2] &&
                      (m == 2 || (m == 3 && g.stride[0] == g.size[1] * g.size[2]));
  if (matrix) {
    const int64_t rows = g.size[m - 2], cols = g.size[m - 1], batch = m == 3 ? g.size[0] : 1;
    const int64_t grid_x = (rows + kTile - 1) / kTile, grid_y = (cols + kTile - 1) / kTile;
    if (grid_x < (int64_t(1) << 31) && grid_y < 65536) {
      const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y),
                      static_cast<unsigned>(batch < 65535 ? batch : 65535));
      Tiled<E><<<grid, dim3(kTile, kRows), 0, stream>>>(x, y, batch, rows, cols);
      return OpforgeLaunched("TransposeGpu");
    }
  }
  Gather<E><<<OpforgeBlocks(n, kThreads), kThreads, 0, stream>>>(x, y, n, g);
  return OpforgeLaunched("TransposeGpu");
}

}  // namespace

extern "C" int TransposeGpu(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                            void *stream, void *extra_ptr) {
  AotExtra *extra = static_cast<AotExtra *>(extra_ptr);
  if (nparam < 2 || std::strcmp(dtypes[0], dtypes[1]) != 0) return 1;
  const int rank = ndims[0];
  const int64_t *shape = shapes[0];
  std::vector<int64_t> perm = extra->Attr<std::vector<int64_t>>("perm");
  if (perm.empty()) {
    if (rank < 2) return 2;
    for (int d = 0; d < rank; d++) perm.push_back(d);
    std::swap(perm[rank - 1], perm[rank - 2]);
  }
  if (static_cast<int>(perm.size()) != rank) return 2;  // the op's check rejects these first
  std::vector<bool> seen(rank, false);
  for (int64_t &axis : perm) {
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank || seen[axis]) return 2;
    seen[axis] = true;
  }
  const int64_t size = ElementSize(dtypes[0]), n = ElementCount(rank, shape);
  if (ElementCount(ndims[1], shapes[1]) != n) return 3;
  if (n == 0) return 0;
  std::vector<int64_t> xstride(rank);
  for (int d = rank - 1; d >= 0; d--) xstride[d] = d == rank - 1 ? 1 : xstride[d + 1] * shape[d + 1];
  Geometry g{};
  for (int k = 0; k < rank; k++) {
    const int64_t axis = perm[k];
    if (shape[axis] == 1) continue;
    if (g.rank > 0 && g.stride[g.rank - 1] == xstride[axis] * shape[axis]) {  // contiguous in x: one dim
      g.size[g.rank - 1] *= shape[axis];
      g.stride[g.rank - 1] = xstride[axis];
      continue;
    }
    if (g.rank == kMaxRank) return 4;
    g.size[g.rank] = shape[axis];
    g.stride[g.rank] = xstride[axis];
    g.rank++;
  }
  void *y = params[1];
  const void *x = params[0];
  cudaStream_t s = OpforgeStream(stream);
  if (g.rank == 0 || (g.rank == 1 && g.stride[0] == 1)) {  // the same order: one copy
    if (cudaMemcpyAsync(y, x, n * size, cudaMemcpyDeviceToDevice, s) != cudaSuccess) return OpforgeLaunched("a copy");
    return 0;
  }
  switch (size) {
    case 1: return Launch<uint8_t>(x, y, n, g, s);
    case 2: return Launch<uint16_t>(x, y, n, g, s);
    case 4: return Launch<uint32_t>(x, y, n, g, s);
    case 8: return Launch<uint64_t>(x, y, n, g, s);
  }
  return 5;
}
