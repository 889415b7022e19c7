#pragma once
// Typed C++ wrappers over OpenBLAS's CBLAS (row-major gemm, gemv, dot), so
// ops/linalg.hpp picks a routine by element type through overloading and
// never deals with CBLAS enums or 32-bit `blasint` sizes itself.
#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string_view>
#include <type_traits>

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

// OpenBLAS runs on the calling thread only; hybra splits a product's rows
// over its own team (parallel_for) instead. OpenBLAS's pthreads pool would
// otherwise compete for the cores with the OpenMP team still spinning after
// the previous fused loop, which cost LeNet's training step up to half its
// time on two cores (docs/benchmarks.md, bench_train).
inline void single_threaded() {
  static const bool once = (openblas_set_num_threads(1), true);
  (void)once;
}

// Calls product(first, count) over [0, rows) split into one range per
// thread; `cost` is the work of one row.
template <class Product>
void over_rows(std::int64_t rows, std::int64_t cost, Product&& product) {
  single_threaded();
  parallel_for(rows, cost, [&](std::int64_t begin, std::int64_t end) {
    if (end > begin) product(begin, end - begin);
  });
}
}  // namespace detail

// C (m x n) = alpha * op(A) (m x k) * op(B) (k x n) + beta * C, row-major;
// op(X) is X or its transpose. lda/ldb/ldc are the row strides of the stored
// matrices (A is stored k x m when trans_a).
template <class T>
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a,
          std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "blas::gemm: float or double");
  using detail::to_blasint;
  constexpr std::string_view name = std::is_same_v<T, float> ? "sgemm" : "dgemm";
  const blasint bn = to_blasint(n, name), bk = to_blasint(k, name), ba = to_blasint(lda, name),
                bb = to_blasint(ldb, name), bc = to_blasint(ldc, name);
  to_blasint(m, name);
  detail::over_rows(m, n * k, [&](std::int64_t first, std::int64_t rows) {
    const T* a_rows = trans_a ? a + first : a + first * lda;
    if constexpr (std::is_same_v<T, float>)
      cblas_sgemm(CblasRowMajor, detail::flag(trans_a), detail::flag(trans_b), static_cast<blasint>(rows), bn, bk,
                  alpha, a_rows, ba, b, bb, beta, c + first * ldc, bc);
    else
      cblas_dgemm(CblasRowMajor, detail::flag(trans_a), detail::flag(trans_b), static_cast<blasint>(rows), bn, bk,
                  alpha, a_rows, ba, b, bb, beta, c + first * ldc, bc);
  });
}

// y = alpha * op(A) x + beta * y, with A stored m x n row-major (row stride
// lda); op(A) is n x m when trans.
template <class T>
void gemv(bool trans, std::int64_t m, std::int64_t n, T alpha, const T* a, std::int64_t lda, const T* x,
          std::int64_t incx, T beta, T* y, std::int64_t incy) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "blas::gemv: float or double");
  using detail::to_blasint;
  constexpr std::string_view name = std::is_same_v<T, float> ? "sgemv" : "dgemv";
  const blasint bm = to_blasint(m, name), bn = to_blasint(n, name), ba = to_blasint(lda, name),
                bx = to_blasint(incx, name), by = to_blasint(incy, name);
  // Rows of op(A): A's rows, or its columns when trans (then each takes m
  // rows of A and the other dimension is cut).
  const std::int64_t rows = trans ? n : m, row_cost = trans ? m : n;
  detail::over_rows(rows, row_cost, [&](std::int64_t first, std::int64_t count) {
    const blasint cut = static_cast<blasint>(count);
    const T* a_rows = trans ? a + first : a + first * lda;
    if constexpr (std::is_same_v<T, float>)
      cblas_sgemv(CblasRowMajor, detail::flag(trans), trans ? bm : cut, trans ? cut : bn, alpha, a_rows, ba, x, bx,
                  beta, y + first * incy, by);
    else
      cblas_dgemv(CblasRowMajor, detail::flag(trans), trans ? bm : cut, trans ? cut : bn, alpha, a_rows, ba, x, bx,
                  beta, y + first * incy, by);
  });
}

// x . y over n elements. Long vectors are split into pieces that fit
// blasint, so only the strides are limited to 32 bits.
inline float dot(std::int64_t n, const float* x, std::int64_t incx, const float* y, std::int64_t incy) {
  constexpr std::int64_t piece = std::numeric_limits<blasint>::max();
  const blasint ix = detail::to_blasint(incx, "sdot"), iy = detail::to_blasint(incy, "sdot");
  float s = 0;
  detail::single_threaded();
  for (std::int64_t i = 0; i < n; i += piece)
    s += cblas_sdot(static_cast<blasint>(std::min(piece, n - i)), x + i * incx, ix, y + i * incy, iy);
  return s;
}
inline double dot(std::int64_t n, const double* x, std::int64_t incx, const double* y, std::int64_t incy) {
  constexpr std::int64_t piece = std::numeric_limits<blasint>::max();
  const blasint ix = detail::to_blasint(incx, "ddot"), iy = detail::to_blasint(incy, "ddot");
  double s = 0;
  detail::single_threaded();
  for (std::int64_t i = 0; i < n; i += piece)
    s += cblas_ddot(static_cast<blasint>(std::min(piece, n - i)), x + i * incx, ix, y + i * incy, iy);
  return s;
}

}  // namespace hybra::backend::cpu::blas
