/*
 * opforge_blas.h: the CBLAS functions opforge's built-in linear kernels call.
 *
 * OpenBLAS comes from the scipy-openblas32 wheel, which prefixes its CBLAS
 * names with "scipy_" and uses 32-bit integers.  Kernels link no library:
 * opforge.runtime.blas loads OpenBLAS with RTLD_GLOBAL before a kernel
 * library that uses these is loaded, and the loader resolves them then.
 * Sizes above INT32_MAX do not fit; kernels check with OpforgeBlasFits.
 */
#ifndef OPFORGE_BLAS_H_
#define OPFORGE_BLAS_H_

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "opforge/parallel.h"

enum { OpforgeBlasRowMajor = 101 };
enum { OpforgeBlasNoTrans = 111, OpforgeBlasTrans = 112 };

extern "C" {
void scipy_cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
                       int lda, const float *b, int ldb, float beta, float *c, int ldc);
void scipy_cblas_dgemm(int order, int trans_a, int trans_b, int m, int n, int k, double alpha, const double *a,
                       int lda, const double *b, int ldb, double beta, double *c, int ldc);
void scipy_cblas_sgemv(int order, int trans, int m, int n, float alpha, const float *a, int lda, const float *x,
                       int incx, float beta, float *y, int incy);
void scipy_cblas_dgemv(int order, int trans, int m, int n, double alpha, const double *a, int lda, const double *x,
                       int incx, double beta, double *y, int incy);
int scipy_openblas_get_num_threads(void);
}

// The CBLAS gemm of each element type.
inline void OpforgeCblasGemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
                             int lda, const float *b, int ldb, float beta, float *c, int ldc) {
  scipy_cblas_sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
inline void OpforgeCblasGemm(int order, int trans_a, int trans_b, int m, int n, int k, double alpha, const double *a,
                             int lda, const double *b, int ldb, double beta, double *c, int ldc) {
  scipy_cblas_dgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// The CBLAS gemv of each element type: y = alpha * op(A) @ x + beta * y.
inline void OpforgeCblasGemv(int order, int trans, int m, int n, float alpha, const float *a, int lda,
                             const float *x, int incx, float beta, float *y, int incy) {
  scipy_cblas_sgemv(order, trans, m, n, alpha, a, lda, x, incx, beta, y, incy);
}
inline void OpforgeCblasGemv(int order, int trans, int m, int n, double alpha, const double *a, int lda,
                             const double *x, int incx, double beta, double *y, int incy) {
  scipy_cblas_dgemv(order, trans, m, n, alpha, a, lda, x, incx, beta, y, incy);
}

// Row-major C = alpha * op(A) @ op(B) + beta * C for T = float or double, op(X) = X or X^T;
// lda, ldb, ldc are the row lengths of A, B and C as stored.  Empty sizes are fine: with k == 0
// (which BLAS would refuse, lda < 1) C becomes beta * C.
template <typename T>
inline void OpforgeGemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T *a, int64_t lda,
                        const T *b, int64_t ldb, T beta, T *c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
    return;
  }
  // One row or one column of output (a batch-1 fully connected layer): gemv
  // reads the matrix once, where gemm would first pack it.
  if (m == 1) {  // y = x @ op(B), x = A's one row (a column of A^T when A is transposed)
    OpforgeCblasGemv(OpforgeBlasRowMajor, trans_b ? OpforgeBlasNoTrans : OpforgeBlasTrans, int(trans_b ? n : k),
                     int(trans_b ? k : n), alpha, b, int(ldb), a, trans_a ? int(lda) : 1, beta, c, 1);
    return;
  }
  if (n == 1) {  // y = op(A) @ x, x = B's one column (a row of B^T when B is transposed)
    OpforgeCblasGemv(OpforgeBlasRowMajor, trans_a ? OpforgeBlasTrans : OpforgeBlasNoTrans, int(trans_a ? k : m),
                     int(trans_a ? m : k), alpha, a, int(lda), b, trans_b ? 1 : int(ldb), beta, c, int(ldc));
    return;
  }
  OpforgeCblasGemm(OpforgeBlasRowMajor, trans_a ? OpforgeBlasTrans : OpforgeBlasNoTrans,
                   trans_b ? OpforgeBlasTrans : OpforgeBlasNoTrans, int(m), int(n), int(k), alpha, a, int(lda), b,
                   int(ldb), beta, c, int(ldc));
}

// OpforgeGemm on opforge's pool: a product worth more than one thread is cut into blocks of C's
// columns where it has more columns than rows, else of its rows (each task packs again the operand the
// blocks share: the smaller one), that the pool's threads multiply with OpenBLAS on one thread each
// (opforge loads it so, see runtime/blas.py; given threads of its own, OpenBLAS gets the product whole).
// One block per thread, each of at least kOpforgeGemmTaskWork multiply-adds and a multiple of 16 wide
// (the last takes the rest, so none is narrow: a one-wide block would run as gemv, which adds in another
// order); on one thread the product is one call.  (A 1024^3 product on two threads: 193 GFLOP/s in two
// blocks of rows, 176 in two of columns, 157 in four of columns, 178 for OpenBLAS's own threads.)
// A product with one row or one column of output (a batch-1 fully connected layer) is cut too, each block
// a gemv (memory-bound: each core reads its part of the matrix), but only with k >= 64: for k <= 48 and
// up to 16384 outputs OpenBLAS has another gemv, which adds in another order (a block has at least
// kOpforgeGemmTaskWork / k outputs, so none would reach it today; the bound keeps it so).  Every block is
// OpenBLAS's product over the whole of k, by the kernel it would use on the whole, so each element is
// summed as OpenBLAS sums it alone: tests/test_conv_tasks.py checks the same bits on 1, 2, 3 and 16
// threads.
constexpr int64_t kOpforgeGemmTaskWork = int64_t(1) << 22;

// Whether OpforgeGemmParallel would cut this product (else it runs as one call).
inline bool OpforgeGemmCuts(int64_t m, int64_t n, int64_t k) {
  const int64_t work = m * n * std::max<int64_t>(k, 0), length = m <= n ? n : m;
  // (the sizes first: a small product asks neither the pool nor OpenBLAS anything)
  return work >= 2 * kOpforgeGemmTaskWork && length >= 32 && (std::min(m, n) > 1 || k >= 64) &&
         opforge::num_threads() > 1 && scipy_openblas_get_num_threads() <= 1;
}

template <typename T>
inline void OpforgeGemmParallel(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T *a,
                                int64_t lda, const T *b, int64_t ldb, T beta, T *c, int64_t ldc) {
  if (!OpforgeGemmCuts(m, n, k)) {
    OpforgeGemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  const bool by_columns = m < n;  // cut the larger dim of the output (the smaller operand is packed again)
  const int64_t length = by_columns ? n : m;
  const int64_t threads = opforge::num_threads(), work = m * n * k;
  const int64_t tasks = std::min({threads, work / kOpforgeGemmTaskWork, length / 16});
  const int64_t width = std::max<int64_t>(16, length / tasks / 16 * 16);
  const int64_t blocks = std::max<int64_t>(1, length / width);  // the last one takes the rest
  opforge::parallel_for(0, blocks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; t++) {
      const int64_t first = t * width, count = t == blocks - 1 ? length - first : width;
      if (by_columns)
        OpforgeGemm(trans_a, trans_b, m, count, k, alpha, a, lda, trans_b ? b + first * ldb : b + first, ldb, beta,
                    c + first, ldc);
      else
        OpforgeGemm(trans_a, trans_b, count, n, k, alpha, trans_a ? a + first : a + first * lda, lda, b, ldb, beta,
                    c + first * ldc, ldc);
    }
  });
}

// Whether every size fits OpenBLAS's 32-bit integers.
inline bool OpforgeBlasFits(std::initializer_list<int64_t> sizes) {
  for (int64_t s : sizes)
    if (s < 0 || s > INT32_MAX) return false;
  return true;
}

#endif  // OPFORGE_BLAS_H_
