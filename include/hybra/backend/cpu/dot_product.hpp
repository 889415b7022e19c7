#pragma once
// The pixel-sum product C (M x N) += A B^T, A and B read along pixels: conv2d's
// weight gradient (ops/conv_backward.hpp), whose sums run along an image's
// pixels.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "isa.hpp"

namespace hybra::backend::cpu {

// A's row i is a + i lda, B's row j is b + b_rows[j], both `len` elements
// long (a multiple of 16), in each of `segments` segments: segment s adds
// s a_seg to A's rows and s b_seg to B's. A tile keeps Rows x Cols vectors
// of partial sums, one per element of C, runs down every segment, then adds
// each vector's lanes pairwise. An element's sum therefore depends neither
// on its tile nor on the thread; tiles past M or N recompute the last row
// or column and store nothing for it.
template <class T>
struct DotProduct {
  const T* a;
  std::int64_t lda;
  const T* b;
  const std::int64_t* b_rows;
  T* c;
  std::int64_t ldc;
  std::int64_t M, N, len, segments, a_seg, b_seg;
};

// v's lanes added pairwise: lane l += lane l + w, for w = Lanes / 2, ..., 1.
// (Vectors go by reference: passing them by value to a function compiled for
// another instruction set would change its ABI.)
template <int W, class V, std::size_t... I>
inline void add_lanes_from(V& v, std::index_sequence<I...>) {
  v += __builtin_shufflevector(v, v, ((I + W) % sizeof...(I))...);
}
template <class T, int Lanes, class V>
inline T lane_sum(const V& acc) {
  static_assert(Lanes <= 16);
  V v = acc;
  if constexpr (Lanes >= 16) add_lanes_from<8>(v, std::make_index_sequence<Lanes>{});
  if constexpr (Lanes >= 8) add_lanes_from<4>(v, std::make_index_sequence<Lanes>{});
  if constexpr (Lanes >= 4) add_lanes_from<2>(v, std::make_index_sequence<Lanes>{});
  if constexpr (Lanes >= 2) add_lanes_from<1>(v, std::make_index_sequence<Lanes>{});
  return v[0];
}

template <class T, int Lanes, int Rows, int Cols>
inline void dot_tile(const DotProduct<T>& p, std::int64_t i, std::int64_t j) {
  typedef T V __attribute__((vector_size(Lanes * sizeof(T))));
  V acc[Rows][Cols];
#pragma GCC unroll 8
  for (int r = 0; r < Rows; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < Cols; ++c) acc[r][c] = V{};
  std::int64_t a_off[Rows], b_off[Cols];
#pragma GCC unroll 8
  for (int r = 0; r < Rows; ++r) a_off[r] = std::min(i + r, p.M - 1) * p.lda;
#pragma GCC unroll 8
  for (int c = 0; c < Cols; ++c) b_off[c] = p.b_rows[std::min(j + c, p.N - 1)];
  for (std::int64_t s = 0; s < p.segments; ++s) {
    const T* ar[Rows];
    const T* br[Cols];
#pragma GCC unroll 8
    for (int r = 0; r < Rows; ++r) ar[r] = p.a + s * p.a_seg + a_off[r];
#pragma GCC unroll 8
    for (int c = 0; c < Cols; ++c) br[c] = p.b + s * p.b_seg + b_off[c];
    for (std::int64_t q = 0; q < p.len; q += Lanes) {
      V bv[Cols];
#pragma GCC unroll 8
      for (int c = 0; c < Cols; ++c) std::memcpy(&bv[c], br[c] + q, sizeof(V));
#pragma GCC unroll 8
      for (int r = 0; r < Rows; ++r) {
        V av;
        std::memcpy(&av, ar[r] + q, sizeof(V));
#pragma GCC unroll 8
        for (int c = 0; c < Cols; ++c) acc[r][c] += av * bv[c];
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < Rows; ++r) {
    if (i + r >= p.M) break;
    T* c = p.c + (i + r) * p.ldc + j;
#pragma GCC unroll 8
    for (int k = 0; k < Cols; ++k)
      if (j + k < p.N) c[k] += lane_sum<T, Lanes>(acc[r][k]);
  }
}

template <class T, int Lanes, int Rows, int Cols>
inline void dot_tiles(const DotProduct<T>& p) {
  for (std::int64_t i = 0; i < p.M; i += Rows)
    for (std::int64_t j = 0; j < p.N; j += Cols) dot_tile<T, Lanes, Rows, Cols>(p, i, j);
}

inline std::int64_t padded_to(std::int64_t n, std::int64_t block) { return (n + block - 1) / block * block; }

// 24 vectors of sums in 32 zmm registers, with 4 + 6 for A's and B's
// vectors: 6 x 4 or 4 x 6 tiles, whichever recomputes less; 9 of 16
// registers elsewhere.
#ifdef HYBRA_ISA_VARIANTS
template <class T>
__attribute__((target("arch=x86-64-v4"), flatten)) void dot_avx512(const DotProduct<T>& p) {
  if (padded_to(p.M, 6) * padded_to(p.N, 4) <= padded_to(p.M, 4) * padded_to(p.N, 6))
    dot_tiles<T, 64 / sizeof(T), 6, 4>(p);
  else
    dot_tiles<T, 64 / sizeof(T), 4, 6>(p);
}
template <class T>
__attribute__((target("arch=x86-64-v3"), flatten)) void dot_avx2(const DotProduct<T>& p) {
  dot_tiles<T, 32 / sizeof(T), 3, 3>(p);
}
#endif
template <class T>
__attribute__((flatten)) void dot_generic(const DotProduct<T>& p) {
  dot_tiles<T, 16 / sizeof(T), 3, 3>(p);
}

template <class T>
using DotFn = void (*)(const DotProduct<T>&);

template <class T>
std::vector<DotFn<T>> dot_variants() {
#ifdef HYBRA_ISA_VARIANTS
  return runnable_variants<DotFn<T>>(&dot_avx512<T>, &dot_avx2<T>, &dot_generic<T>);
#else
  return runnable_variants<DotFn<T>>(nullptr, nullptr, &dot_generic<T>);
#endif
}

template <class T>
void dot_product(const DotProduct<T>& p) {
  static const DotFn<T> fastest = dot_variants<T>().front();
  fastest(p);
}

}  // namespace hybra::backend::cpu
