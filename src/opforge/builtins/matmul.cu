// matmul on the GPU through cuBLAS (loaded at run time: opforge_cublas.h).
// y = a @ b for (..., m, k) @ (..., k, n), batch dims equal or 1.  cuBLAS is
// column-major: a row-major (m, n) = (m, k) @ (k, n) is the column-major
// y^T = b^T @ a^T, so b goes first and nothing is transposed.  One strided
// batched call covers a batch where each side is either whole or one matrix
// for all entries (stride 0); other broadcasts call gemm per batch entry.
// Everything goes on the caller's stream; nothing synchronizes.
#include <cstdint>
#include <cstring>

#include "custom_aot_extra.h"
#include "opforge_cublas.h"
#include "opforge_cuda.h"

namespace {

bool FitsInt(int64_t v) { return v >= 0 && v <= INT32_MAX; }

void Gemm(OpforgeCublasHandle_t h, int m, int n, int k, const float *a, const float *b, float *y) {
  const float one = 1, zero = 0;
  OpforgeCublasCheck(OpforgeCublasLibrary().Sgemm(h, OpforgeCublasOpN, OpforgeCublasOpN, n, m, k, &one, b, n, a, k,
                                                  &zero, y, n), "cublasSgemm");
}
void Gemm(OpforgeCublasHandle_t h, int m, int n, int k, const double *a, const double *b, double *y) {
  const double one = 1, zero = 0;
  OpforgeCublasCheck(OpforgeCublasLibrary().Dgemm(h, OpforgeCublasOpN, OpforgeCublasOpN, n, m, k, &one, b, n, a, k,
                                                  &zero, y, n), "cublasDgemm");
}
void GemmBatched(OpforgeCublasHandle_t h, int m, int n, int k, const float *a, long long stride_a, const float *b,
                 long long stride_b, float *y, int batch) {
  const float one = 1, zero = 0;
  OpforgeCublasCheck(OpforgeCublasLibrary().SgemmStridedBatched(h, OpforgeCublasOpN, OpforgeCublasOpN, n, m, k, &one,
                                                                b, n, stride_b, a, k, stride_a, &zero, y, n,
                                                                static_cast<long long>(m) * n, batch),
                     "cublasSgemmStridedBatched");
}
void GemmBatched(OpforgeCublasHandle_t h, int m, int n, int k, const double *a, long long stride_a, const double *b,
                 long long stride_b, double *y, int batch) {
  const double one = 1, zero = 0;
  OpforgeCublasCheck(OpforgeCublasLibrary().DgemmStridedBatched(h, OpforgeCublasOpN, OpforgeCublasOpN, n, m, k, &one,
                                                                b, n, stride_b, a, k, stride_a, &zero, y, n,
                                                                static_cast<long long>(m) * n, batch),
                     "cublasDgemmStridedBatched");
}

template <typename T>
int MatMul(void **params, int *ndims, int64_t **shapes, cudaStream_t stream) {
  const T *a = static_cast<const T *>(params[0]);
  const T *b = static_cast<const T *>(params[1]);
  T *y = static_cast<T *>(params[2]);
  const int rank = ndims[0];
  if (rank < 2 || ndims[1] != rank || ndims[2] != rank) return 1;  // inference rejects these first
  const int64_t *as = shapes[0], *bs = shapes[1], *ys = shapes[2];
  const int64_t m = as[rank - 2], k = as[rank - 1], n = bs[rank - 1];
  if (bs[rank - 2] != k || ys[rank - 2] != m || ys[rank - 1] != n) return 2;
  int64_t batch = 1;
  bool a_whole = true, a_single = true, b_whole = true, b_single = true;
  for (int d = 0; d < rank - 2; d++) {
    if ((as[d] != ys[d] && as[d] != 1) || (bs[d] != ys[d] && bs[d] != 1)) return 3;
    batch *= ys[d];
    a_whole = a_whole && as[d] == ys[d];
    a_single = a_single && as[d] == 1;
    b_whole = b_whole && bs[d] == ys[d];
    b_single = b_single && bs[d] == 1;
  }
  if (batch * m * n == 0) return 0;
  if (k == 0) {  // an empty sum: zeros
    if (cudaMemsetAsync(y, 0, batch * m * n * sizeof(T), stream) != cudaSuccess) return OpforgeLaunched("a memset");
    return 0;
  }
  if (!FitsInt(m) || !FitsInt(n) || !FitsInt(k) || !FitsInt(batch) || !FitsInt(batch * m)) return 4;
  OpforgeCublasHandle_t handle = OpforgeCublasHandle(stream);
  if (a_whole && b_single) {  // the batch's rows of a are one (batch * m, k) matrix
    Gemm(handle, static_cast<int>(batch * m), static_cast<int>(n), static_cast<int>(k), a, b, y);
  } else if ((a_whole || a_single) && (b_whole || b_single)) {
    GemmBatched(handle, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), a, a_single ? 0 : m * k, b,
                b_single ? 0 : k * n, y, static_cast<int>(batch));
  } else {
    for (int64_t s = 0; s < batch; s++) {
      // The batch index s of y, split into dims, gives a's and b's matrices (0 along a broadcast dim).
      int64_t rest = s, offset_a = 0, offset_b = 0, stride_a = m * k, stride_b = k * n;
      for (int d = rank - 3; d >= 0; d--) {
        const int64_t index = rest % ys[d];
        rest /= ys[d];
        if (as[d] != 1) offset_a += index * stride_a;
        if (bs[d] != 1) offset_b += index * stride_b;
        stride_a *= as[d];
        stride_b *= bs[d];
      }
      Gemm(handle, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), a + offset_a, b + offset_b,
           y + s * m * n);
    }
  }
  return OpforgeLaunched("MatMulGpu (cuBLAS gemm)");
}

}  // namespace

extern "C" int MatMulGpu(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                         void *extra) {
  if (nparam < 3 || std::strcmp(dtypes[0], dtypes[1]) != 0 || std::strcmp(dtypes[0], dtypes[2]) != 0) return 5;
  if (!std::strcmp(dtypes[0], "float32")) return MatMul<float>(params, ndims, shapes, OpforgeStream(stream));
  if (!std::strcmp(dtypes[0], "float64")) return MatMul<double>(params, ndims, shapes, OpforgeStream(stream));
  return 6;
}
