#pragma once
// The product C (M x n) = A (M x K) B (K x n) + bias, for small M: the
// filters (M) by a matrix of an image's windows in conv2d and its data
// gradient (ops/conv.hpp, ops/conv_backward.hpp), where a GEMM would pack
// its operands for little reuse.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "isa.hpp"

namespace hybra::backend::cpu {

// A tile keeps Rows x Vectors accumulator registers and runs down the whole
// of K: per k it loads Vectors of B's row and broadcasts Rows of A's column.
// Each element is summed in k order with no reduction left to the compiler,
// so its value depends neither on the tile it is in nor on the thread, and
// the eager op and a captured plan give the same bits. (Across machines they
// may not: the AVX2 and AVX-512 variants fuse each multiply-add.)
template <class T>
struct Product {
  const T* a;
  std::int64_t lda;
  // B's row k is b + b_rows[k], readable (and initialised) up to a vector
  // (16 floats) past n: the last tile computes columns it does not store.
  const T* b;
  const std::int64_t* b_rows;
  const T* bias;  // M values, or null
  T* c;
  std::int64_t ldc;
  std::int64_t M, K, n;
};

template <class T, int Lanes, int Rows, int Vectors>
inline void product_tile(const Product<T>& p, std::int64_t i, std::int64_t j) {
  typedef T V __attribute__((vector_size(Lanes * sizeof(T))));
  // `x - V{}` is x in every lane: a bare broadcast (V{} + x would not be,
  // as -0 + 0 is +0, so the compiler would have to add).
  V acc[Rows][Vectors];
  // GCC 12 at -O3 takes the broadcast below for a read of the uninitialised
  // acc (-Wmaybe-uninitialized, in every program that trains a convolution).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#pragma GCC unroll 16
  for (int r = 0; r < Rows; ++r) {
    const T init = p.bias ? p.bias[i + r] : T(0);
#pragma GCC unroll 8
    for (int v = 0; v < Vectors; ++v) acc[r][v] = init - V{};
  }
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
  const T* a = p.a + i * p.lda;
  for (std::int64_t k = 0; k < p.K; ++k) {
    const T* b = p.b + p.b_rows[k] + j;
    V bv[Vectors];
#pragma GCC unroll 8
    for (int v = 0; v < Vectors; ++v) std::memcpy(&bv[v], b + v * Lanes, sizeof(V));
#pragma GCC unroll 16
    for (int r = 0; r < Rows; ++r) {
      const V av = a[r * p.lda + k] - V{};
#pragma GCC unroll 8
      for (int v = 0; v < Vectors; ++v) acc[r][v] += av * bv[v];
    }
  }
  const std::int64_t cols = std::min<std::int64_t>(Lanes * Vectors, p.n - j);
  T* c = p.c + i * p.ldc + j;
#pragma GCC unroll 16
  for (int r = 0; r < Rows; ++r, c += p.ldc) {
    if (cols == Lanes * Vectors) {
#pragma GCC unroll 8
      for (int v = 0; v < Vectors; ++v) std::memcpy(c + v * Lanes, &acc[r][v], sizeof(V));
    } else {
      T row[Lanes * Vectors];
#pragma GCC unroll 8
      for (int v = 0; v < Vectors; ++v) std::memcpy(row + v * Lanes, &acc[r][v], sizeof(V));
      std::memcpy(c, row, static_cast<std::size_t>(cols) * sizeof(T));
    }
  }
}

// A's rows in near-equal blocks of at most MaxRows, for the columns of one
// tile, Vectors x Lanes wide, from column j.
template <class T, int Lanes, int MaxRows, int Vectors>
inline void product_column_tile(const Product<T>& p, std::int64_t j) {
  const std::int64_t blocks = (p.M + MaxRows - 1) / MaxRows;
  std::int64_t i = 0;
  for (std::int64_t block = 0; block < blocks; ++block) {
    const std::int64_t rows = p.M / blocks + (block < p.M % blocks ? 1 : 0);
    [&]<int... R>(std::integer_sequence<int, R...>) {
      ((rows == R + 1 ? (product_tile<T, Lanes, R + 1, Vectors>(p, i, j), 0) : 0), ...);
    }
    (std::make_integer_sequence<int, MaxRows>{});
    i += rows;
  }
}

// Tiles of Vectors x Lanes columns, each read from L1 by every block of A's
// rows; the columns left over go one vector at a time (a narrower tile for
// each width would compile one more variant per number of rows).
template <class T, int Lanes, int MaxRows, int Vectors>
inline void product_tiles(const Product<T>& p) {
  std::int64_t j = 0;
  for (; j + Lanes * Vectors <= p.n; j += Lanes * Vectors) product_column_tile<T, Lanes, MaxRows, Vectors>(p, j);
  for (; j < p.n; j += Lanes) product_column_tile<T, Lanes, MaxRows, 1>(p, j);
}

// Per instruction set, as many accumulators as leave registers for B's
// vectors and A's broadcast: 32 zmm (AVX-512), 16 ymm (AVX2), 16 xmm.
#ifdef HYBRA_ISA_VARIANTS
template <class T>
__attribute__((target("arch=x86-64-v4"), flatten)) void product_avx512(const Product<T>& p) {
  product_tiles<T, 64 / sizeof(T), 6, 4>(p);
}
template <class T>
__attribute__((target("arch=x86-64-v3"), flatten)) void product_avx2(const Product<T>& p) {
  product_tiles<T, 32 / sizeof(T), 6, 2>(p);
}
#endif
template <class T>
__attribute__((flatten)) void product_generic(const Product<T>& p) {
  product_tiles<T, 16 / sizeof(T), 4, 2>(p);
}

template <class T>
using ProductFn = void (*)(const Product<T>&);

template <class T>
std::vector<ProductFn<T>> product_variants() {
#ifdef HYBRA_ISA_VARIANTS
  return runnable_variants<ProductFn<T>>(&product_avx512<T>, &product_avx2<T>, &product_generic<T>);
#else
  return runnable_variants<ProductFn<T>>(nullptr, nullptr, &product_generic<T>);
#endif
}

template <class T>
void product(const Product<T>& p) {
  static const ProductFn<T> fastest = product_variants<T>().front();
  fastest(p);
}

}  // namespace hybra::backend::cpu
