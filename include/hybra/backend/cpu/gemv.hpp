#pragma once
// y = W x for one input row, or a few (up to gemv_max_rows): a dense layer at
// batch 1 to 4, W N x K row-major. The product is bound by reading W once,
// which the few rows share. OpenBLAS does not serve this case well. Its GEMM
// has no few-row path (it packs W as for any GEMM: at batch 2 the
// classifiers of AlexNet and VGG took 2-3x their batch-1 time), and its GEMV is slow on the development
// machine, whose OpenBLAS 0.3.21 takes the Sapphire Rapids VM for a Prescott
// and runs SSE3 kernels; even with the right kernels its calls cost more
// than these rows (docs/benchmarks.md, "Figures behind constants of the code").
//
// Rows that do not start on 64 bytes (ldw * sizeof(T) not a multiple of 64)
// run slower: every AVX-512 load then spans two cache lines.
//
// The fast paths come from GCC's function multiversioning (one clone per ISA,
// picked once at load time), so the header needs no -march flag. Not under
// ThreadSanitizer: the loader runs the clones' resolver before TSan is set up,
// and the instrumented resolver crashes at startup.
#include <cstdint>

#include "../../engine/helping.hpp"
#include "threads.hpp"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__ELF__) && \
    !defined(__SANITIZE_THREAD__)
#define HYBRA_GEMV_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"), flatten))
#else
#define HYBRA_GEMV_CLONES
#endif

namespace hybra::backend::cpu {

namespace detail {
// R rows of W times M rows of x at once: each x vector is loaded once per R
// rows, each W vector once per M rows, and R * M * L independent sums hide
// the add latency. Each output is summed in an order fixed by this source
// alone: lane l of L sums k = l mod L, then the lanes are added pairwise.
// No reduction is left to the compiler (an `omp simd reduction` order
// depends on the vector width it picks for each loop), so an output's value
// does not depend on which rows it is computed with (nor on how many input
// rows, up to gemv_max_rows, come with it), and threaded and single-thread
// results are bit-identical. (Across machines they may not be: the AVX2 and
// AVX-512 clones fuse each multiply-add, the default one cannot.)
//
// Speed needs acc in registers. The `GCC unroll` pragmas make GCC unroll the
// row and halving loops at -O1/-O2 too (else acc stays on the stack: 2x
// slower), and the K % L tail is masked lanes rather than a loop of its own
// length, which would index acc by a runtime value.
template <int R, int M, class T>
inline void gemv_block(const T* w, std::int64_t ldw, const T* x, std::int64_t ldx, T* y, std::int64_t ldy,
                       std::int64_t K) {
  constexpr int L = 64 / sizeof(T);  // one AVX-512 register
  T acc[R][M][L] = {};
  const std::int64_t kv = K - K % L;
  for (std::int64_t k = 0; k < kv; k += L)
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int m = 0; m < M; ++m)
#pragma omp simd
        for (int l = 0; l < L; ++l) acc[r][m][l] += w[r * ldw + k + l] * x[m * ldx + k + l];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int m = 0; m < M; ++m) {
#pragma omp simd
      for (int l = 0; l < L; ++l)
        if (kv + l < K) acc[r][m][l] += w[r * ldw + kv + l] * x[m * ldx + kv + l];
#pragma GCC unroll 8
      for (int h = L / 2; h > 0; h /= 2)
#pragma omp simd
        for (int l = 0; l < h; ++l) acc[r][m][l] += acc[r][m][l + h];
      y[m * ldy + r] = acc[r][m][0];
    }
}

// W's rows [row_begin, row_end) times M rows of x (row stride K) into M rows
// of y (row stride ldy).
template <int M, class T>
inline void gemv_rows_of(const T* w, std::int64_t ldw, const T* x, T* y, std::int64_t ldy, std::int64_t K,
                         std::int64_t row_begin, std::int64_t row_end) {
  std::int64_t n = row_begin;
  for (; n + 4 <= row_end; n += 4) gemv_block<4, M>(w + n * ldw, ldw, x, K, y + n, ldy, K);
  for (; n < row_end; ++n) gemv_block<1, M>(w + n * ldw, ldw, x, K, y + n, ldy, K);
}
}  // namespace detail

// The most input rows one pass over W serves.
inline constexpr std::int64_t gemv_max_rows = 4;

// y[m * N + n] = sum_k w[n * ldw + k] * x[m * K + k] for W's rows [row_begin,
// row_end) and m < rows (<= gemv_max_rows), on the calling thread.
template <class T>
HYBRA_GEMV_CLONES void gemv_rows(const T* w, std::int64_t ldw, const T* x, T* y, std::int64_t N, std::int64_t K,
                                 std::int64_t rows, std::int64_t row_begin, std::int64_t row_end) {
  switch (rows) {
    case 1: return detail::gemv_rows_of<1>(w, ldw, x, y, N, K, row_begin, row_end);
    case 2: return detail::gemv_rows_of<2>(w, ldw, x, y, N, K, row_begin, row_end);
    case 3: return detail::gemv_rows_of<3>(w, ldw, x, y, N, K, row_begin, row_end);
    default: return detail::gemv_rows_of<4>(w, ldw, x, y, N, K, row_begin, row_end);
  }
}

// Rows are split over an OpenMP team only when W is beyond one core's L2,
// where the team pays. A W that fits gains little from a second OpenMP
// thread, which a woken team costs back and more: its threads keep spinning
// after the loop, and on a machine with no spare core they then take the core
// the engine or the caller needs (a chain of such layers ran hundreds of
// times slower; docs/benchmarks.md, "Figures behind constants of the code").
// Such a W is split in two instead with a thread already spinning in
// a wait, if one takes the second half (engine/helping.hpp); smaller ones
// gain less than the hand-over costs.
inline constexpr std::int64_t gemv_parallel_bytes = std::int64_t{4} << 20;
inline constexpr std::int64_t gemv_help_bytes = std::int64_t{256} << 10;

// y (rows x N) = x (rows x K) W^T for all N rows of W, rows <=
// gemv_max_rows; x and y contiguous.
template <class T>
void gemv(const T* w, std::int64_t ldw, const T* x, T* y, std::int64_t N, std::int64_t K, std::int64_t rows = 1) {
  const std::int64_t bytes = N * K * static_cast<std::int64_t>(sizeof(T));
  auto run = [&](std::int64_t begin, std::int64_t end) { gemv_rows(w, ldw, x, y, N, K, rows, begin, end); };
  if (bytes >= gemv_parallel_bytes) return parallel_for(N, K * rows, run);
  if (bytes < gemv_help_bytes || N < 8 || share_threads() < 2) return run(0, N);
  const std::int64_t half = (N / 2 + 3) / 4 * 4;  // whole 4-row blocks
  auto part = [&](int c) { c == 0 ? run(0, half) : run(half, N); };
  engine::detail::help_board().run(2, part);
}

}  // namespace hybra::backend::cpu

#undef HYBRA_GEMV_CLONES
