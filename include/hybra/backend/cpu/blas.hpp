#pragma once
// Typed C++ wrappers over OpenBLAS's CBLAS (row-major gemm, gemv, dot), so
// ops/linalg.hpp picks a routine by element type through overloading and
// never deals with CBLAS enums or 32-bit `blasint` sizes itself.
#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <string_view>

#include "../../core/error.hpp"
#include "threads.hpp"

namespace hybra::backend::cpu::blas {

namespace detail {
// OpenBLAS here is built with 32-bit integers: a size that does not fit is
// reported rather than silently truncated.
inline blasint to_blasint(std::int64_t v, std::string_view routine) {
  if (v < std::numeric_limits<blasint>::min() || v > std::numeric_limits<blasint>::max())
    fail<ValueError>(routine, ": size or stride ", v, " does not fit in BLAS's ", sizeof(blasint) * 8, "-bit integers");
  return static_cast<blasint>(v);
}
inline CBLAS_TRANSPOSE flag(bool trans) { return trans ? CblasTrans : CblasNoTrans; }

// OpenBLAS's thread count is one process-wide setting, not per call: each
// call sets it to the calling op's share of the cores when that differs from
// the last setting (it changes as CPU devices come into use, or by
// set_num_threads), so that devices computing at once do not each use every core.
inline void share_threads() {
  static std::atomic<int> current{0};
  const int want = available_threads();
  if (current.exchange(want, std::memory_order_relaxed) != want) openblas_set_num_threads(want);
}
}  // namespace detail

// C (m x n) = alpha * op(A) (m x k) * op(B) (k x n) + beta * C, row-major;
// op(X) is X or its transpose. lda/ldb/ldc are the row strides of the stored
// matrices (A is stored k x m when trans_a).
inline void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                 const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                 std::int64_t ldc) {
  using detail::to_blasint;
  detail::share_threads();
  cblas_sgemm(CblasRowMajor, detail::flag(trans_a), detail::flag(trans_b), to_blasint(m, "sgemm"),
              to_blasint(n, "sgemm"), to_blasint(k, "sgemm"), alpha, a, to_blasint(lda, "sgemm"), b,
              to_blasint(ldb, "sgemm"), beta, c, to_blasint(ldc, "sgemm"));
}
inline void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
                 const double* a, std::int64_t lda, const double* b, std::int64_t ldb, double beta, double* c,
                 std::int64_t ldc) {
  using detail::to_blasint;
  detail::share_threads();
  cblas_dgemm(CblasRowMajor, detail::flag(trans_a), detail::flag(trans_b), to_blasint(m, "dgemm"),
              to_blasint(n, "dgemm"), to_blasint(k, "dgemm"), alpha, a, to_blasint(lda, "dgemm"), b,
              to_blasint(ldb, "dgemm"), beta, c, to_blasint(ldc, "dgemm"));
}

// y = alpha * op(A) x + beta * y, with A stored m x n row-major (row stride
// lda); op(A) is n x m when trans.
inline void gemv(bool trans, std::int64_t m, std::int64_t n, float alpha, const float* a, std::int64_t lda,
                 const float* x, std::int64_t incx, float beta, float* y, std::int64_t incy) {
  using detail::to_blasint;
  detail::share_threads();
  cblas_sgemv(CblasRowMajor, detail::flag(trans), to_blasint(m, "sgemv"), to_blasint(n, "sgemv"), alpha, a,
              to_blasint(lda, "sgemv"), x, to_blasint(incx, "sgemv"), beta, y, to_blasint(incy, "sgemv"));
}
inline void gemv(bool trans, std::int64_t m, std::int64_t n, double alpha, const double* a, std::int64_t lda,
                 const double* x, std::int64_t incx, double beta, double* y, std::int64_t incy) {
  using detail::to_blasint;
  detail::share_threads();
  cblas_dgemv(CblasRowMajor, detail::flag(trans), to_blasint(m, "dgemv"), to_blasint(n, "dgemv"), alpha, a,
              to_blasint(lda, "dgemv"), x, to_blasint(incx, "dgemv"), beta, y, to_blasint(incy, "dgemv"));
}

// x . y over n elements. Long vectors are split into pieces that fit
// blasint, so only the strides are limited to 32 bits.
inline float dot(std::int64_t n, const float* x, std::int64_t incx, const float* y, std::int64_t incy) {
  constexpr std::int64_t piece = std::numeric_limits<blasint>::max();
  const blasint ix = detail::to_blasint(incx, "sdot"), iy = detail::to_blasint(incy, "sdot");
  float s = 0;
  detail::share_threads();
  for (std::int64_t i = 0; i < n; i += piece)
    s += cblas_sdot(static_cast<blasint>(std::min(piece, n - i)), x + i * incx, ix, y + i * incy, iy);
  return s;
}
inline double dot(std::int64_t n, const double* x, std::int64_t incx, const double* y, std::int64_t incy) {
  constexpr std::int64_t piece = std::numeric_limits<blasint>::max();
  const blasint ix = detail::to_blasint(incx, "ddot"), iy = detail::to_blasint(incy, "ddot");
  double s = 0;
  detail::share_threads();
  for (std::int64_t i = 0; i < n; i += piece)
    s += cblas_ddot(static_cast<blasint>(std::min(piece, n - i)), x + i * incx, ix, y + i * incy, iy);
  return s;
}

}  // namespace hybra::backend::cpu::blas
