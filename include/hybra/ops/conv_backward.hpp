#pragma once
// The gradients of conv2d and pooling (autograd/gradients.hpp calls them):
// ops of their own, since neither is a composition of other ops. Each is one
// engine op on contiguous float32/float64 NCHW tensors.
//
// Data gradient. With stride 1 it is itself a convolution: of dy, padded by
// dilation (k - 1) - padding, with the filters flipped in space and their
// (filter, channel) axes swapped, so it runs on conv2d's own kernel
// (conv.hpp). Other strides (and padding wider than the kernel's span)
// multiply the transposed filters by dy with conv2d's product kernel into
// columns, one per output pixel, and add each column's taps back into dx
// (col2im).
//
// Weight gradient. dW (F x K) = sum over images of dy_n (F x P) cols_n^T
// (P x K), K = channels per group x kernel area: a product whose sums run
// along pixels, so its kernel (DotProduct below) keeps a vector of partial
// sums per output element along the pixels and adds its lanes at the end.
// With stride 1, B's rows are the zero-padded input rows read from an offset
// per tap, over "wide" pixels as in conv2d_wide, with dy spread to the wide
// layout and zero on the pixels that are no output; other strides copy the
// windows out (im2col). The images are cut into pieces, pieces into chunks
// (one call of the kernel), chunks into at most 16 slots, each summed into
// its own copy of dW by one thread and the copies added in slot order at the
// end. All of it is fixed by the shapes alone, so the result does not depend
// on the thread count.
//
// Non-finite values meet the padding's zeros as in im2col (0 x inf is NaN),
// and no more: a wide pixel that is no output multiplies dy's 0 by an input
// value that window does not hold, so a chunk whose input holds an inf or a
// NaN is summed by the plain loop instead.
//
// Their times per layer, beside the forward's, are in docs/benchmarks.md
// (bench_train).
//
// Pooling. Max pooling recomputes each window's first maximum (a NaN wins,
// its first one, as the forward's max) and adds dy there; 2x2 windows with
// stride 2 and no padding that stay inside the input (LeNet's) go eight windows at a time, writing
// every element of dx once. Average pooling spreads dy / divisor along each
// window's columns into a row, then adds that row to the window's rows.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "conv.hpp"

namespace hybra {

namespace detail::nn {

inline std::int64_t round_up16(std::int64_t n) { return (n + 15) / 16 * 16; }

// A working set of about this many bytes per piece of work stays in L2.
inline constexpr std::int64_t backward_chunk_bytes = std::int64_t{1} << 20;

// ---- The pixel-sum product: C (M x N) += A B^T, A and B read along pixels ----
//
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

// ---- data gradient ----

// Stride 1, padding <= dilation (kernel - 1): dx is conv2d of dy padded by
// the rest, with w'[c, f, kh, kw] = w[f, c, KH - 1 - kh, KW - 1 - kw] (per
// group), which produces exactly H x W.
template <class T>
void conv2d_backward_data_as_conv(const T* dy, const T* w, T* dx, const Conv2dGeometry& g) {
  const std::int64_t Cg = g.C / g.groups, Fg = g.F / g.groups, taps = g.KH * g.KW;
  const Conv2dGeometry t{g.N,  g.F,  g.OH, g.OW, g.C,  g.KH,
                         g.KW, g.H,  g.W,  1,    1,    g.dh * (g.KH - 1) - g.ph,
                         g.dw * (g.KW - 1) - g.pw, g.dh, g.dw, g.groups};
  std::vector<T> flipped(static_cast<std::size_t>(g.C * Fg * taps));
  for (std::int64_t grp = 0; grp < g.groups; ++grp)
    for (std::int64_t f = 0; f < Fg; ++f)
      for (std::int64_t c = 0; c < Cg; ++c) {
        const T* src = w + ((grp * Fg + f) * Cg + c) * taps;
        T* dst = flipped.data() + ((grp * Cg + c) * Fg + f) * taps;
        for (std::int64_t k = 0; k < taps; ++k) dst[taps - 1 - k] = src[k];
      }
  conv2d<T>(dy, flipped.data(), nullptr, dx, t);
}

// Smallest ow >= 0 with ow * stride + offset >= 0, and the count of ow with
// ow * stride + offset < extent.
inline std::int64_t first_inside(std::int64_t offset, std::int64_t stride) {
  return offset >= 0 ? 0 : (-offset + stride - 1) / stride;
}
inline std::int64_t end_inside(std::int64_t offset, std::int64_t stride, std::int64_t extent) {
  return extent - 1 - offset < 0 ? 0 : (extent - 1 - offset) / stride + 1;
}

// dxg (Cg channels of one group of one image) += the columns of output
// pixels [p0, p0 + cols): col's row k = (c, kh, kw), row stride ld.
template <class T>
void col2im_add(const T* col, std::int64_t ld, std::int64_t p0, std::int64_t cols, T* dxg, const Conv2dGeometry& g,
                std::int64_t Cg) {
  for (std::int64_t c = 0; c < Cg; ++c) {
    T* dxc = dxg + c * g.H * g.W;
    for (std::int64_t kh = 0; kh < g.KH; ++kh)
      for (std::int64_t kw = 0; kw < g.KW; ++kw) {
        const T* src = col + ((c * g.KH + kh) * g.KW + kw) * ld - p0;
        const std::int64_t offset = kw * g.dw - g.pw;
        const std::int64_t ow_first = first_inside(offset, g.sw), ow_end = end_inside(offset, g.sw, g.W);
        for (std::int64_t p = p0; p < p0 + cols;) {
          const std::int64_t oh = p / g.OW, ow_begin = p % g.OW;
          const std::int64_t ow_stop = std::min(g.OW, ow_begin + (p0 + cols - p));
          p += ow_stop - ow_begin;
          const std::int64_t ih = oh * g.sh - g.ph + kh * g.dh;
          if (ih < 0 || ih >= g.H) continue;
          const std::int64_t lo = std::max(ow_begin, ow_first), hi = std::min(ow_stop, ow_end);
          T* drow = dxc + ih * g.W;
          const T* s = src + oh * g.OW;
          if (g.sw == 1) {
#pragma omp simd
            for (std::int64_t ow = lo; ow < hi; ++ow) drow[ow + offset] += s[ow];
          } else {
            for (std::int64_t ow = lo; ow < hi; ++ow) drow[ow * g.sw + offset] += s[ow];
          }
        }
      }
  }
}

// Any geometry: per (image, group), columns = w^T (K x Fg) dy (Fg x P) in
// bands of pixels, each added into dx. One thread owns an (image, group)
// and adds its bands in order.
template <class T>
void conv2d_backward_data_col2im(const T* dy, const T* w, T* dx, const Conv2dGeometry& g) {
  const std::int64_t P = g.OH * g.OW, Cg = g.C / g.groups, Fg = g.F / g.groups, K = Cg * g.KH * g.KW;
  std::vector<T> wt(static_cast<std::size_t>(g.groups * K * Fg));
  for (std::int64_t grp = 0; grp < g.groups; ++grp)
    for (std::int64_t f = 0; f < Fg; ++f)
      for (std::int64_t k = 0; k < K; ++k)
        wt[static_cast<std::size_t>((grp * K + k) * Fg + f)] = w[(grp * Fg + f) * K + k];
  const std::int64_t band = std::clamp<std::int64_t>(
      backward_chunk_bytes / 4 / ((K + Fg) * static_cast<std::int64_t>(sizeof(T))), 1, P);
  const std::int64_t ld = round_up16(band);
  std::vector<std::int64_t> b_rows(static_cast<std::size_t>(Fg));
  for (std::int64_t f = 0; f < Fg; ++f) b_rows[static_cast<std::size_t>(f)] = f * ld;
  std::atomic<bool> failed{false};
  backend::cpu::parallel_for(g.N * g.groups, Fg * K * P, [&](std::int64_t first, std::int64_t last) {
    ThreadBuffer<T> buffer((K + Fg) * ld, failed);
    if (!buffer.get()) return;
    T* col = buffer.get();
    T* d = col + K * ld;
    for (std::int64_t item = first; item < last; ++item) {
      const std::int64_t n = item / g.groups, grp = item % g.groups;
      T* dxg = dx + (n * g.C + grp * Cg) * g.H * g.W;
      std::fill_n(dxg, Cg * g.H * g.W, T(0));
      for (std::int64_t p0 = 0; p0 < P; p0 += band) {
        const std::int64_t cols = std::min(band, P - p0);
        for (std::int64_t f = 0; f < Fg; ++f)
          std::copy_n(dy + (n * g.F + grp * Fg + f) * P + p0, cols, d + f * ld);
        product(Product<T>{wt.data() + grp * K * Fg, Fg, d, b_rows.data(), nullptr, col, ld, K, Fg, cols});
        col2im_add(col, ld, p0, cols, dxg, g, Cg);
      }
    }
  });
  check_buffers(failed, "conv2d_backward_data");
}

// dx (N, C, H, W) from dy (N, F, OH, OW) and w (F, C / groups, KH, KW); all
// contiguous.
template <class T>
void conv2d_backward_data(const T* dy, const T* w, T* dx, const Conv2dGeometry& g) {
  if (g.N * g.C * g.H * g.W == 0) return;
  if (g.sh == 1 && g.sw == 1 && g.ph <= g.dh * (g.KH - 1) && g.pw <= g.dw * (g.KW - 1))
    conv2d_backward_data_as_conv(dy, w, dx, g);
  else
    conv2d_backward_data_col2im(dy, w, dx, g);
}

// ---- weight gradient ----

// How the weight gradient's work is cut, from the shapes alone. A piece is
// `count` output rows (wide) or pixels (im2col) of one image, `per_image`
// pieces an image; a chunk is `per_chunk` consecutive pieces, each one
// segment of A (its dy, rows of `len`) and of B (`b_seg` elements); chunks
// go to `slots` sums, each computed by one thread, its filters cut in
// `fparts` parts that threads may share.
struct WeightGradPlan {
  bool wide;
  std::int64_t count, per_image, rows, len, b_seg, scratch;
  std::int64_t pieces, per_chunk, chunks, slots, fparts;
};

template <class T>
WeightGradPlan weight_grad_plan(const Conv2dGeometry& g) {
  const std::int64_t Cg = g.C / g.groups, Fg = g.F / g.groups, K = Cg * g.KH * g.KW, Wp = g.W + 2 * g.pw;
  const std::int64_t size = static_cast<std::int64_t>(sizeof(T));
  WeightGradPlan plan{};
  plan.wide = g.sh == 1 && g.sw == 1;
  // Elements of a piece of `count` rows or pixels: B's segment, then A's.
  auto shape = [&](std::int64_t count) {
    plan.count = count;
    if (plan.wide) {
      plan.rows = count + g.dh * (g.KH - 1);
      plan.len = round_up16(count * Wp);
      // The last tap reads (KW - 1) dw past the channels' rows, and up to a vector past that.
      plan.b_seg = round_up16(Cg * plan.rows * Wp + g.dw * (g.KW - 1) + 16);
    } else {
      plan.len = round_up16(count);
      plan.b_seg = K * plan.len;
      plan.rows = ((count + g.OW - 1) / g.OW + 1) * g.sh + g.dh * (g.KH - 1) + 1;
      plan.scratch = Cg * plan.rows * Wp;
    }
    return (plan.b_seg + Fg * plan.len) * size;
  };
  const std::int64_t extent = plan.wide ? g.OH : g.OH * g.OW;
  const std::int64_t whole = shape(extent);
  plan.per_image = 1;
  if (whole > backward_chunk_bytes) {
    const std::int64_t parts = std::min(extent, (whole + backward_chunk_bytes - 1) / backward_chunk_bytes);
    shape((extent + parts - 1) / parts);
    plan.per_image = (extent + plan.count - 1) / plan.count;
  }
  plan.pieces = g.N * plan.per_image;
  plan.per_chunk = 1;
  if (plan.per_image == 1) {
    // Whole images: as many as fit the working set, but no fewer than 16 chunks where there are 16 images.
    const std::int64_t bytes = (plan.b_seg + Fg * plan.len) * size;
    plan.per_chunk = std::clamp<std::int64_t>(std::min(backward_chunk_bytes / bytes, (g.N + 15) / 16), 1, g.N);
  }
  plan.chunks = (plan.pieces + plan.per_chunk - 1) / plan.per_chunk;
  // At most 16 sums, and no more than 16 MiB of them.
  const std::int64_t copies = (std::int64_t{16} << 20) / size / std::max<std::int64_t>(1, g.F * K);
  plan.slots = std::clamp<std::int64_t>(std::min<std::int64_t>(plan.chunks, 16), 1, std::max<std::int64_t>(1, copies));
  plan.fparts = std::clamp<std::int64_t>(16 / plan.slots, 1, std::max<std::int64_t>(1, Fg / 16));
  return plan;
}

// The plain loop, im2col's way (the padding's zeros multiply dy): out's
// rows of filters [f0, f1) of group grp += the products of one piece.
template <class T>
void weight_grad_exact(const T* dy, const T* x, T* out, const Conv2dGeometry& g, std::int64_t n, std::int64_t grp,
                       std::int64_t oh0, std::int64_t oh1, std::int64_t f0, std::int64_t f1) {
  const std::int64_t Cg = g.C / g.groups, Fg = g.F / g.groups, K = Cg * g.KH * g.KW;
  for (std::int64_t f = f0; f < f1; ++f) {
    const T* dyf = dy + (n * g.F + grp * Fg + f) * g.OH * g.OW;
    for (std::int64_t c = 0; c < Cg; ++c) {
      const T* xc = x + (n * g.C + grp * Cg + c) * g.H * g.W;
      for (std::int64_t kh = 0; kh < g.KH; ++kh)
        for (std::int64_t kw = 0; kw < g.KW; ++kw) {
          T sum = 0;
          for (std::int64_t oh = oh0; oh < oh1; ++oh) {
            const std::int64_t ih = oh * g.sh - g.ph + kh * g.dh;
            for (std::int64_t ow = 0; ow < g.OW; ++ow) {
              const std::int64_t iw = ow * g.sw - g.pw + kw * g.dw;
              const T v = ih >= 0 && ih < g.H && iw >= 0 && iw < g.W ? xc[ih * g.W + iw] : T(0);
              sum += dyf[oh * g.OW + ow] * v;
            }
          }
          out[(f - f0) * K + (c * g.KH + kh) * g.KW + kw] += sum;
        }
    }
  }
}

template <class T>
bool all_finite(const T* p, std::int64_t n) {
  int bad = 0;
#pragma omp simd reduction(| : bad)
  for (std::int64_t i = 0; i < n; ++i) bad |= !(p[i] - p[i] == 0);
  return !bad;
}

// dw (F, C / groups, KH, KW) from dy (N, F, OH, OW) and x (N, C, H, W); all
// contiguous.
template <class T>
void conv2d_backward_weight(const T* dy, const T* x, T* dw, const Conv2dGeometry& g) {
  const std::int64_t Cg = g.C / g.groups, Fg = g.F / g.groups, K = Cg * g.KH * g.KW, Wp = g.W + 2 * g.pw;
  const std::int64_t P = g.OH * g.OW;
  if (g.F * K == 0) return;
  if (g.N * P == 0) {
    std::fill_n(dw, g.F * K, T(0));
    return;
  }
  const WeightGradPlan plan = weight_grad_plan<T>(g);
  std::vector<std::int64_t> b_rows(static_cast<std::size_t>(K));
  for (std::int64_t c = 0; c < Cg; ++c)
    for (std::int64_t kh = 0; kh < g.KH; ++kh)
      for (std::int64_t kw = 0; kw < g.KW; ++kw) {
        const std::int64_t k = (c * g.KH + kh) * g.KW + kw;
        b_rows[static_cast<std::size_t>(k)] =
            plan.wide ? (c * plan.rows + kh * g.dh) * Wp + kw * g.dw : k * plan.len;
      }
  // Slot 0 sums into dw itself, the others into copies added at the end.
  std::vector<T> copies(static_cast<std::size_t>((plan.slots - 1) * g.F * K));
  const std::int64_t units = plan.slots * plan.fparts, most_filters = (Fg + plan.fparts - 1) / plan.fparts;
  const std::int64_t a_size = plan.per_chunk * most_filters * plan.len, b_size = plan.per_chunk * plan.b_seg;
  std::atomic<bool> failed{false};
  backend::cpu::parallel_for(units, g.N * Fg * K * P * g.groups / units, [&](std::int64_t first, std::int64_t last) {
    ThreadBuffer<T> buffer(a_size + b_size + plan.scratch, failed);
    if (!buffer.get()) return;
    T* a = buffer.get();
    T* b = a + a_size;
    T* scratch = b + b_size;
    for (std::int64_t unit = first; unit < last; ++unit) {
      const std::int64_t slot = unit / plan.fparts, part = unit % plan.fparts;
      const std::int64_t f0 = Fg * part / plan.fparts, f1 = Fg * (part + 1) / plan.fparts, rows = f1 - f0;
      T* sum = slot == 0 ? dw : copies.data() + (slot - 1) * g.F * K;
      for (std::int64_t grp = 0; grp < g.groups; ++grp) std::fill_n(sum + (grp * Fg + f0) * K, rows * K, T(0));
      const std::int64_t chunk0 = plan.chunks * slot / plan.slots, chunk1 = plan.chunks * (slot + 1) / plan.slots;
      for (std::int64_t chunk = chunk0; chunk < chunk1; ++chunk) {
        const std::int64_t piece0 = chunk * plan.per_chunk, pieces = std::min(plan.per_chunk, plan.pieces - piece0);
        for (std::int64_t grp = 0; grp < g.groups; ++grp) {
          bool finite = true;
          for (std::int64_t s = 0; s < pieces; ++s) {
            const std::int64_t n = (piece0 + s) / plan.per_image, start = (piece0 + s) % plan.per_image * plan.count;
            const T* xg = x + (n * g.C + grp * Cg) * g.H * g.W;
            T* as = a + s * rows * plan.len;
            T* bs = b + s * plan.b_seg;
            if (plan.wide) {
              // Rows [start, start + count) of dy, Wp wide, zero past OW and past OH.
              copy_band(xg, g, Cg, start, plan.rows, bs, plan.rows * Wp);
              finite = finite && all_finite(bs, Cg * plan.rows * Wp);
              for (std::int64_t f = 0; f < rows; ++f) {
                const T* src = dy + (n * g.F + grp * Fg + f0 + f) * P;
                T* dst = as + f * plan.len;
                for (std::int64_t r = 0; r < plan.count; ++r) {
                  const std::int64_t oh = start + r;
                  if (oh < g.OH) {
                    copy_exact(dst + r * Wp, src + oh * g.OW, g.OW);
                    std::fill(dst + r * Wp + g.OW, dst + (r + 1) * Wp, T(0));
                  } else {
                    std::fill_n(dst + r * Wp, Wp, T(0));
                  }
                }
                std::fill(dst + plan.count * Wp, dst + plan.len, T(0));
              }
            } else {
              const std::int64_t cols = std::min(plan.count, P - start);
              im2col(xg, g, Cg, start, cols, scratch, bs, plan.len);
              for (std::int64_t k = 0; k < K; ++k) std::fill(bs + k * plan.len + cols, bs + (k + 1) * plan.len, T(0));
              for (std::int64_t f = 0; f < rows; ++f) {
                T* dst = as + f * plan.len;
                std::copy_n(dy + (n * g.F + grp * Fg + f0 + f) * P + start, cols, dst);
                std::fill(dst + cols, dst + plan.len, T(0));
              }
            }
          }
          T* c = sum + (grp * Fg + f0) * K;
          if (finite) {
            dot_product(DotProduct<T>{a, plan.len, b, b_rows.data(), c, K, rows, K, plan.len, pieces,
                                      rows * plan.len, plan.b_seg});
          } else {
            for (std::int64_t s = 0; s < pieces; ++s) {
              const std::int64_t n = (piece0 + s) / plan.per_image, start = (piece0 + s) % plan.per_image * plan.count;
              weight_grad_exact(dy, x, c, g, n, grp, start, std::min(g.OH, start + plan.count), f0, f1);
            }
          }
        }
      }
    }
  });
  check_buffers(failed, "conv2d_backward_weight");
  if (plan.slots > 1) {
    backend::cpu::parallel_for(g.F * K, plan.slots, [&](std::int64_t first, std::int64_t last) {
      for (std::int64_t s = 1; s < plan.slots; ++s) {
        const T* src = copies.data() + (s - 1) * g.F * K;
#pragma omp simd
        for (std::int64_t i = first; i < last; ++i) dw[i] += src[i];
      }
    });
  }
}

// ---- pooling ----

// 2x2 windows, stride 2, no padding (LeNet's): each input element is in at
// most one window, so dx is written once, Lanes windows (two rows of 2 Lanes
// elements) at a time, the last block of a row overlapping the one before;
// a row or column left over by an odd size is zero. Vectors of the CPU's
// width, as GCC compares wider ones one element at a time.
template <class V, std::size_t... I>
inline void even_odd_lanes(V& even, V& odd, const V& lo, const V& hi, std::index_sequence<I...>) {
  even = __builtin_shufflevector(lo, hi, (2 * I)...);
  odd = __builtin_shufflevector(lo, hi, (2 * I + 1)...);
}
// a[From], b[From], a[From + 1], b[From + 1], ...
template <std::size_t From, class V, std::size_t... I>
inline void interleave(V& out, const V& a, const V& b, std::index_sequence<I...>) {
  out = __builtin_shufflevector(a, b, (From + I / 2 + (I % 2) * sizeof...(I))...);
}

template <class T, bool Max, int Lanes>
inline void pool2x2_block(const T* x0, const T* x1, const T* dyr, T* d0, T* d1, std::int64_t ow) {
  typedef T V __attribute__((vector_size(Lanes * sizeof(T))));
  constexpr auto lanes = std::make_index_sequence<Lanes>{};
  V lo, hi, dv, a, b, c, d;
  std::memcpy(&lo, x0 + 2 * ow, sizeof(V));
  std::memcpy(&hi, x0 + 2 * ow + Lanes, sizeof(V));
  even_odd_lanes(a, b, lo, hi, lanes);
  std::memcpy(&lo, x1 + 2 * ow, sizeof(V));
  std::memcpy(&hi, x1 + 2 * ow + Lanes, sizeof(V));
  even_odd_lanes(c, d, lo, hi, lanes);
  std::memcpy(&dv, dyr + ow, sizeof(V));
  V oa, ob, oc, od;
  if constexpr (Max) {
    // The window's first maximum, or its first NaN.
    const V zero{};
    V best = a;
    const auto take_b = (b > best) | ((b != b) & (best == best));
    best = take_b ? b : best;
    const auto take_c = (c > best) | ((c != c) & (best == best));
    best = take_c ? c : best;
    const auto take_d = (d > best) | ((d != d) & (best == best));
    od = take_d ? dv : zero;
    oc = (take_c & ~take_d) ? dv : zero;
    ob = (take_b & ~take_c & ~take_d) ? dv : zero;
    oa = (take_b | take_c | take_d) ? zero : dv;
  } else {
    oa = ob = oc = od = dv / T(4);
  }
  interleave<0>(lo, oa, ob, lanes);
  interleave<Lanes / 2>(hi, oa, ob, lanes);
  std::memcpy(d0 + 2 * ow, &lo, sizeof(V));
  std::memcpy(d0 + 2 * ow + Lanes, &hi, sizeof(V));
  interleave<0>(lo, oc, od, lanes);
  interleave<Lanes / 2>(hi, oc, od, lanes);
  std::memcpy(d1 + 2 * ow, &lo, sizeof(V));
  std::memcpy(d1 + 2 * ow + Lanes, &hi, sizeof(V));
}

template <class T, bool Max>
inline void pool2x2_window(const T* x0, const T* x1, const T* dyr, T* d0, T* d1, std::int64_t ow) {
  const T v[4] = {x0[2 * ow], x0[2 * ow + 1], x1[2 * ow], x1[2 * ow + 1]};
  T out[4] = {0, 0, 0, 0};
  if constexpr (Max) {
    int at = 0;
    for (int i = 1; i < 4; ++i)
      if (v[i] > v[at] || (v[i] != v[i] && v[at] == v[at])) at = i;
    out[at] = dyr[ow];
  } else {
    out[0] = out[1] = out[2] = out[3] = dyr[ow] / T(4);
  }
  d0[2 * ow] = out[0];
  d0[2 * ow + 1] = out[1];
  d1[2 * ow] = out[2];
  d1[2 * ow + 1] = out[3];
}

// One output row's windows: in blocks of Lanes, or of fewer lanes when the
// row is shorter (LeNet's are 14 and 5 windows long).
template <class T, bool Max, int Lanes>
inline void pool2x2_row(const T* x0, const T* x1, const T* dyr, T* d0, T* d1, std::int64_t OW) {
  if constexpr (Lanes >= 2) {
    if (OW >= Lanes) {
      std::int64_t ow = 0;
      for (; ow + Lanes <= OW; ow += Lanes) pool2x2_block<T, Max, Lanes>(x0, x1, dyr, d0, d1, ow);
      if (ow < OW) pool2x2_block<T, Max, Lanes>(x0, x1, dyr, d0, d1, OW - Lanes);
      return;
    }
    pool2x2_row<T, Max, Lanes / 2>(x0, x1, dyr, d0, d1, OW);
  } else {
    for (std::int64_t ow = 0; ow < OW; ++ow) pool2x2_window<T, Max>(x0, x1, dyr, d0, d1, ow);
  }
}

template <class T, bool Max, int Lanes>
inline void pool2x2_planes(const T* x, const T* dy, T* dx, const Pool2dGeometry& g, std::int64_t first,
                           std::int64_t last) {
  for (std::int64_t plane = first; plane < last; ++plane) {
    const T* xp = x + plane * g.H * g.W;
    const T* dyp = dy + plane * g.OH * g.OW;
    T* dxp = dx + plane * g.H * g.W;
    if (g.H % 2) std::fill_n(dxp + (g.H - 1) * g.W, g.W, T(0));
    for (std::int64_t oh = 0; oh < g.OH; ++oh) {
      T* d0 = dxp + 2 * oh * g.W;
      if (g.W % 2) d0[g.W - 1] = d0[2 * g.W - 1] = T(0);
      pool2x2_row<T, Max, Lanes>(xp + 2 * oh * g.W, xp + (2 * oh + 1) * g.W, dyp + oh * g.OW, d0, d0 + g.W, g.OW);
    }
  }
}

// Any window: dx starts at zero and each window, in order, adds its dy to
// its first maximum. The window at (oh, ow) reads rows [hs, he) (clipped to
// the input) from column ow sw - pw.
template <class T>
inline void max_pool_window(const T* xp, T* dxp, const Pool2dGeometry& g, std::int64_t hs, std::int64_t he,
                            std::int64_t ow, T dy) {
  const std::int64_t w0 = ow * g.sw - g.pw;
  const std::int64_t ws = std::max<std::int64_t>(w0, 0), we = std::min(w0 + g.KW, g.W);
  std::int64_t at = hs * g.W + ws;
  T best = xp[at];
  for (std::int64_t h = hs; h < he; ++h)
    for (std::int64_t w = ws; w < we; ++w) {
      const T v = xp[h * g.W + w];
      if (v > best || (v != v && best == best)) {
        best = v;
        at = h * g.W + w;
      }
    }
  dxp[at] += dy;
}

// Lanes windows from column ow on, each wholly inside the row's columns:
// their maxima found together (a tap at a time, each tap's Lanes elements
// Stride apart: Stride 1 and 2 as vector loads, 0 for any stride, gathered),
// then each adds its dy in order, lanes [from, Lanes) only.
template <class T, int Lanes, int Stride>
inline void max_pool_block(const T* xp, const T* dyr, T* dxp, const Pool2dGeometry& g, std::int64_t hs,
                           std::int64_t he, std::int64_t ow, std::int64_t from) {
  typedef T V __attribute__((vector_size(Lanes * sizeof(T))));
  using Mask = decltype(V{} < V{});
  const std::int64_t left = ow * g.sw - g.pw;
  const T* first = xp + hs * g.W + left;
  // A stride-2 load reads one element past the last it uses: inside the plane, or gathered.
  const bool gather = Stride == 0 || (Stride == 2 && (he - 1) * g.W + left + g.KW - 1 + 2 * Lanes - 1 >= g.H * g.W);
  V best{}, v{};
  Mask at{};
  for (std::int64_t kh = 0; kh < he - hs; ++kh)
    for (std::int64_t kw = 0; kw < g.KW; ++kw) {
      const T* p = first + kh * g.W + kw;
      if (Stride == 1) {
        std::memcpy(&v, p, sizeof(V));
      } else if (!gather) {
        V lo, hi, odd;
        std::memcpy(&lo, p, sizeof(V));
        std::memcpy(&hi, p + Lanes, sizeof(V));
        even_odd_lanes(v, odd, lo, hi, std::make_index_sequence<Lanes>{});
      } else {
#pragma GCC unroll 16
        for (int l = 0; l < Lanes; ++l) v[l] = p[l * g.sw];
      }
      if (kh == 0 && kw == 0) {
        best = v;
        continue;
      }
      const Mask take = (v > best) | ((v != v) & (best == best));
      best = take ? v : best;
      at = take ? Mask{} + static_cast<std::remove_reference_t<decltype(at[0])>>(kh * g.W + kw) : at;
    }
  for (std::int64_t l = from; l < Lanes; ++l) dxp[hs * g.W + left + l * g.sw + at[l]] += dyr[ow + l];
}

// The windows of one output row: those the left and right padding cut
// alone, the others in blocks of Lanes (or of fewer, for short rows), the
// last block overlapping the one before and adding only its new lanes.
template <class T, int Lanes, int Stride>
inline void max_pool_row(const T* xp, const T* dyr, T* dxp, const Pool2dGeometry& g, std::int64_t hs,
                         std::int64_t he, std::int64_t lo, std::int64_t hi) {
  if constexpr (Lanes >= 2) {
    if (hi - lo >= Lanes) {
      std::int64_t ow = lo;
      for (; ow + Lanes <= hi; ow += Lanes) max_pool_block<T, Lanes, Stride>(xp, dyr, dxp, g, hs, he, ow, 0);
      if (ow < hi) max_pool_block<T, Lanes, Stride>(xp, dyr, dxp, g, hs, he, hi - Lanes, ow - (hi - Lanes));
      return;
    }
    max_pool_row<T, Lanes / 2, Stride>(xp, dyr, dxp, g, hs, he, lo, hi);
  } else {
    for (std::int64_t ow = lo; ow < hi; ++ow) max_pool_window(xp, dxp, g, hs, he, ow, dyr[ow]);
  }
}

template <class T, int Lanes>
inline void max_pool_planes(const T* x, const T* dy, T* dx, const Pool2dGeometry& g, std::int64_t first,
                            std::int64_t last) {
  // Windows [lo, hi) of a row lie wholly inside its columns.
  const std::int64_t lo = std::min(g.OW, first_inside(-g.pw, g.sw));
  const std::int64_t hi = std::max(lo, std::min(g.OW, end_inside(g.KW - 1 - g.pw, g.sw, g.W)));
  for (std::int64_t plane = first; plane < last; ++plane) {
    const T* xp = x + plane * g.H * g.W;
    const T* dyp = dy + plane * g.OH * g.OW;
    T* dxp = dx + plane * g.H * g.W;
    std::fill_n(dxp, g.H * g.W, T(0));
    for (std::int64_t oh = 0; oh < g.OH; ++oh) {
      const std::int64_t h0 = oh * g.sh - g.ph;
      const std::int64_t hs = std::max<std::int64_t>(h0, 0), he = std::min(h0 + g.KH, g.H);
      const T* dyr = dyp + oh * g.OW;
      for (std::int64_t ow = 0; ow < lo; ++ow) max_pool_window(xp, dxp, g, hs, he, ow, dyr[ow]);
      if (g.sw == 1) max_pool_row<T, Lanes, 1>(xp, dyr, dxp, g, hs, he, lo, hi);
      else if (g.sw == 2) max_pool_row<T, Lanes, 2>(xp, dyr, dxp, g, hs, he, lo, hi);
      else max_pool_row<T, Lanes, 0>(xp, dyr, dxp, g, hs, he, lo, hi);
      for (std::int64_t ow = hi; ow < g.OW; ++ow) max_pool_window(xp, dxp, g, hs, he, ow, dyr[ow]);
    }
  }
}

// The vectorised pooling gradients, planes [first, last) each: 2x2 max
// (Kind::max2x2), 2x2 average, any max window; compiled per instruction set.
enum class PoolKind { max2x2, avg2x2, max };

template <class T, PoolKind Kind, int Lanes>
inline void pool_planes(const T* x, const T* dy, T* dx, const Pool2dGeometry& g, std::int64_t first,
                        std::int64_t last) {
  if constexpr (Kind == PoolKind::max) max_pool_planes<T, Lanes>(x, dy, dx, g, first, last);
  else pool2x2_planes<T, Kind == PoolKind::max2x2, Lanes>(x, dy, dx, g, first, last);
}

template <class T>
using PoolPlanesFn = void (*)(const T*, const T*, T*, const Pool2dGeometry&, std::int64_t, std::int64_t);

#ifdef HYBRA_ISA_VARIANTS
template <class T, PoolKind Kind>
__attribute__((target("arch=x86-64-v4"), flatten)) void pool_avx512(const T* x, const T* dy, T* dx,
                                                                   const Pool2dGeometry& g, std::int64_t first,
                                                                   std::int64_t last) {
  pool_planes<T, Kind, 64 / sizeof(T)>(x, dy, dx, g, first, last);
}
template <class T, PoolKind Kind>
__attribute__((target("arch=x86-64-v3"), flatten)) void pool_avx2(const T* x, const T* dy, T* dx,
                                                                 const Pool2dGeometry& g, std::int64_t first,
                                                                 std::int64_t last) {
  pool_planes<T, Kind, 32 / sizeof(T)>(x, dy, dx, g, first, last);
}
#endif
template <class T, PoolKind Kind>
__attribute__((flatten)) void pool_generic(const T* x, const T* dy, T* dx, const Pool2dGeometry& g,
                                           std::int64_t first, std::int64_t last) {
  pool_planes<T, Kind, 16 / sizeof(T)>(x, dy, dx, g, first, last);
}

template <class T, PoolKind Kind>
std::vector<PoolPlanesFn<T>> pool_variants() {
#ifdef HYBRA_ISA_VARIANTS
  return runnable_variants<PoolPlanesFn<T>>(&pool_avx512<T, Kind>, &pool_avx2<T, Kind>, &pool_generic<T, Kind>);
#else
  return runnable_variants<PoolPlanesFn<T>>(nullptr, nullptr, &pool_generic<T, Kind>);
#endif
}

// Any window: per output row, dy / divisor spread along each window's
// columns into `row`, then row added to each of the window's rows.
template <class T>
void avg_pool_backward_plane(const T* dyp, T* dxp, T* row, const Pool2dGeometry& g, bool count_include_pad) {
  std::fill_n(dxp, g.H * g.W, T(0));
  for (std::int64_t oh = 0; oh < g.OH; ++oh) {
    const std::int64_t h0 = oh * g.sh - g.ph;
    const std::int64_t hs = std::max<std::int64_t>(h0, 0), he = std::min(h0 + g.KH, g.H);
    const std::int64_t height = pool_divisor_extent(h0, g.KH, g.H, g.ph, count_include_pad);
    std::fill_n(row, g.W, T(0));
    for (std::int64_t ow = 0; ow < g.OW; ++ow) {
      const std::int64_t w0 = ow * g.sw - g.pw;
      const std::int64_t ws = std::max<std::int64_t>(w0, 0), we = std::min(w0 + g.KW, g.W);
      const std::int64_t divisor = height * pool_divisor_extent(w0, g.KW, g.W, g.pw, count_include_pad);
      const T share = dyp[oh * g.OW + ow] / static_cast<T>(divisor);
      for (std::int64_t w = ws; w < we; ++w) row[w] += share;
    }
    for (std::int64_t h = hs; h < he; ++h) {
      T* d = dxp + h * g.W;
#pragma omp simd
      for (std::int64_t w = 0; w < g.W; ++w) d[w] += row[w];
    }
  }
}

// dx from dy through pooling windows: a max window's gradient goes to its
// first maximum (the element the forward picked), an average window's is
// spread over the elements it divided by. Planes are independent, one
// thread each.
template <class T, bool Max>
void pool2d_backward(const T* dy, const T* x, T* dx, const Pool2dGeometry& g, bool count_include_pad) {
  const std::int64_t planes = g.N * g.C;
  if (planes == 0 || g.H * g.W == 0) return;
  const std::int64_t cost = g.H * g.W + g.OH * g.OW * g.KH * g.KW;
  const bool tiles2x2 = g.KH == 2 && g.KW == 2 && g.sh == 2 && g.sw == 2 && g.ph == 0 && g.pw == 0 &&
                        2 * g.OH <= g.H && 2 * g.OW <= g.W;
  PoolPlanesFn<T> planes_fn = nullptr;
  if (tiles2x2) {
    static const PoolPlanesFn<T> fastest = pool_variants<T, Max ? PoolKind::max2x2 : PoolKind::avg2x2>().front();
    planes_fn = fastest;
  } else if constexpr (Max) {
    static const PoolPlanesFn<T> fastest = pool_variants<T, PoolKind::max>().front();
    planes_fn = fastest;
  }
  if (planes_fn) {
    backend::cpu::parallel_for(planes, cost, [&](std::int64_t first, std::int64_t last) {
      planes_fn(x, dy, dx, g, first, last);
    });
    return;
  }
  std::atomic<bool> failed{false};
  backend::cpu::parallel_for(planes, cost, [&](std::int64_t first, std::int64_t last) {
    ThreadBuffer<T> row(g.W, failed);
    if (!row.get()) return;
    for (std::int64_t plane = first; plane < last; ++plane)
      avg_pool_backward_plane(dy + plane * g.OH * g.OW, dx + plane * g.H * g.W, row.get(), g, count_include_pad);
  });
  check_buffers(failed, "pool2d_backward");
}

// conv2d's geometry, its errors naming the gradient op first, and the check
// that dy has the shape of conv2d's output.
inline Conv2dGeometry backward_geometry(std::string_view op, const Tensor& dy, const Shape& x, const Shape& w,
                                        Size2d stride, Size2d padding, Size2d dilation, std::int64_t groups) {
  Conv2dGeometry g;
  try {
    g = conv2d_geometry(x, w, stride, padding, dilation, groups);
  } catch (const ShapeError& e) {
    fail<ShapeError>(op, ": ", e.what());
  } catch (const ValueError& e) {
    fail<ValueError>(op, ": ", e.what());
  }
  if (dy.require(op.data()).shape() != Shape{g.N, g.F, g.OH, g.OW})
    fail<ShapeError>(op, ": gradient of shape ", to_string(dy.shape()), " does not match the output (", g.N, ", ",
                     g.F, ", ", g.OH, ", ", g.OW, ") of input ", to_string(x), " and weight ", to_string(w));
  return g;
}

// The gradients' launches on a GPU for operands laid out as `in` (a captured
// plan's); nullopt where the eager op must run. Both conv2d gradients take
// (dy, w or x) and the shape of what they return.
inline std::optional<jit::CudaLaunch> cuda_conv2d_backward_launch(jit::ConvPass pass, std::span<const Tensor> in,
                                                                  const Shape& out, Size2d stride, Size2d padding,
                                                                  Size2d dilation, std::int64_t groups,
                                                                  backend::cuda::Gpu& gpu) {
  const auto dtype = launch_dtype(in);
  if (!dtype) return std::nullopt;
  const bool data = pass == jit::ConvPass::backward_data;
  const Conv2dGeometry g =
      conv2d_geometry(data ? out : in[1].shape(), data ? in[1].shape() : out, stride, padding, dilation, groups);
  return jit::cuda_conv2d_launch(pass, g, false, *dtype, gpu);
}

// pool2d_backward's operands (dy, x).
inline std::optional<jit::CudaLaunch> cuda_pool2d_backward_launch(std::span<const Tensor> in, bool max, Size2d kernel,
                                                                  Size2d stride, Size2d padding,
                                                                  bool count_include_pad, PoolingConvention convention,
                                                                  backend::cuda::Gpu& gpu) {
  const auto dtype = launch_dtype(in);
  if (!dtype) return std::nullopt;
  const Pool2dGeometry g = pool2d_geometry("pool2d_backward", in[1].shape(), kernel, stride, padding, convention);
  return jit::cuda_pool2d_launch(max, true, g, count_include_pad, *dtype, gpu);
}

}  // namespace detail::nn

// The gradient of conv2d with respect to its input, of shape x_shape.
inline Tensor conv2d_backward_data(const Tensor& dy, const Tensor& weight, const Shape& x_shape, Size2d stride,
                                   Size2d padding, Size2d dilation, std::int64_t groups) {
  namespace nn = detail::nn;
  constexpr std::string_view op = "conv2d_backward_data";
  const nn::Conv2dGeometry g = nn::backward_geometry(op, dy, x_shape, weight.require(op.data()).shape(), stride,
                                                     padding, dilation, groups);
  const auto operands = nn::float_operands<2>(op, {dy, weight});
  const Tensor &d = operands[0], &w = operands[1];
  Tensor dx(x_shape, d.dtype(), d.device());
  if (d.device().kind == DeviceKind::cuda) {
    jit::push_cuda_launch(op, {d, w}, dx,
                          jit::cuda_conv2d_launch(jit::ConvPass::backward_data, g, false, d.dtype(),
                                                  backend::cuda::gpu(d.device().id)));
    return dx;
  }
  push_op(op, {d, w}, {dx}, [d, w, dx, g] {
    dispatch(dx.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_floating_point_v<T>)
        nn::conv2d_backward_data(static_cast<const T*>(d.raw_data()), static_cast<const T*>(w.raw_data()),
                                 static_cast<T*>(dx.raw_data()), g);
    });
  });
  return dx;
}

// The gradient of conv2d with respect to its weight, of shape weight_shape.
inline Tensor conv2d_backward_weight(const Tensor& dy, const Tensor& x, const Shape& weight_shape, Size2d stride,
                                     Size2d padding, Size2d dilation, std::int64_t groups) {
  namespace nn = detail::nn;
  constexpr std::string_view op = "conv2d_backward_weight";
  const nn::Conv2dGeometry g =
      nn::backward_geometry(op, dy, x.require(op.data()).shape(), weight_shape, stride, padding, dilation, groups);
  const auto operands = nn::float_operands<2>(op, {dy, x});
  const Tensor &d = operands[0], &xc = operands[1];
  Tensor dw(weight_shape, d.dtype(), d.device());
  if (d.device().kind == DeviceKind::cuda) {
    jit::push_cuda_launch(op, {d, xc}, dw,
                          jit::cuda_conv2d_launch(jit::ConvPass::backward_weight, g, false, d.dtype(),
                                                  backend::cuda::gpu(d.device().id)));
    return dw;
  }
  push_op(op, {d, xc}, {dw}, [d, xc, dw, g] {
    dispatch(dw.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_floating_point_v<T>)
        nn::conv2d_backward_weight(static_cast<const T*>(d.raw_data()), static_cast<const T*>(xc.raw_data()),
                                   static_cast<T*>(dw.raw_data()), g);
    });
  });
  return dw;
}

// The gradient of a pooling with respect to its input x (pool_type "max" or
// "avg"; global pools pass the whole plane as kernel with stride 1, padding 0).
inline Tensor pool2d_backward(const Tensor& dy, const Tensor& x, bool max, Size2d kernel, Size2d stride,
                              Size2d padding, bool count_include_pad,
                              PoolingConvention convention = PoolingConvention::valid) {
  namespace nn = detail::nn;
  constexpr std::string_view op = "pool2d_backward";
  const nn::Pool2dGeometry g =
      nn::pool2d_geometry(op, x.require(op.data()).shape(), kernel, stride, padding, convention);
  if (dy.require(op.data()).shape() != Shape{g.N, g.C, g.OH, g.OW})
    fail<ShapeError>(op, ": gradient of shape ", to_string(dy.shape()), " does not match the output (", g.N, ", ",
                     g.C, ", ", g.OH, ", ", g.OW, ") of input ", to_string(x.shape()), " and kernel ", kernel);
  const auto operands = nn::float_operands<2>(op, {dy, x});
  const Tensor &d = operands[0], &xc = operands[1];
  Tensor dx(xc.shape(), d.dtype(), d.device());
  if (d.device().kind == DeviceKind::cuda) {
    jit::push_cuda_launch(op, {d, xc}, dx,
                          jit::cuda_pool2d_launch(max, true, g, count_include_pad, d.dtype(), backend::cuda::gpu(d.device().id)));
    return dx;
  }
  push_op(op, {d, xc}, {dx}, [d, xc, dx, g, max, count_include_pad] {
    dispatch(dx.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_floating_point_v<T>) {
        auto* out = static_cast<T*>(dx.raw_data());
        const auto* dyp = static_cast<const T*>(d.raw_data());
        const auto* xp = static_cast<const T*>(xc.raw_data());
        if (max) nn::pool2d_backward<T, true>(dyp, xp, out, g, count_include_pad);
        else nn::pool2d_backward<T, false>(dyp, xp, out, g, count_include_pad);
      }
    });
  });
  return dx;
}

namespace op {

// conv2d's gradients: (dy, weight) and (dy, data), with the forward conv2d's
// attributes and the shape of what they return.
struct conv2d_backward_data {
  static constexpr std::string_view name = "conv2d_backward_data";
  static constexpr int arity = 2;
  static constexpr bool gradient_only = true;
  static Tensor eval(std::span<const Tensor> in, const graph::Attrs& a) {
    const auto w = hybra::detail::nn::ConvWindow::read(a, name);
    return hybra::conv2d_backward_data(in[0], in[1], graph::shape_attr(a, "shape", name), w.stride, w.pad, w.dilate,
                                       w.groups);
  }
  static std::int64_t multiply_adds(std::span<const Tensor> in, const Tensor&) {
    return in[0].size() * hybra::detail::nn::per_filter(in[1]);
  }
  static std::optional<jit::CudaLaunch> cuda_launch(std::span<const Tensor> in, const Tensor& out, const graph::Attrs& a,
                                                    backend::cuda::Gpu& gpu) {
    const auto w = hybra::detail::nn::ConvWindow::read(a, name);
    return hybra::detail::nn::cuda_conv2d_backward_launch(jit::ConvPass::backward_data, in, out.shape(), w.stride, w.pad,
                                                   w.dilate, w.groups, gpu);
  }
};
struct conv2d_backward_weight {
  static constexpr std::string_view name = "conv2d_backward_weight";
  static constexpr int arity = 2;
  static constexpr bool gradient_only = true;
  static Tensor eval(std::span<const Tensor> in, const graph::Attrs& a) {
    const auto w = hybra::detail::nn::ConvWindow::read(a, name);
    return hybra::conv2d_backward_weight(in[0], in[1], graph::shape_attr(a, "shape", name), w.stride, w.pad, w.dilate,
                                         w.groups);
  }
  static std::int64_t multiply_adds(std::span<const Tensor> in, const Tensor& out) {
    return in[0].size() * hybra::detail::nn::per_filter(out);
  }
  static std::optional<jit::CudaLaunch> cuda_launch(std::span<const Tensor> in, const Tensor& out, const graph::Attrs& a,
                                                    backend::cuda::Gpu& gpu) {
    const auto w = hybra::detail::nn::ConvWindow::read(a, name);
    return hybra::detail::nn::cuda_conv2d_backward_launch(jit::ConvPass::backward_weight, in, out.shape(), w.stride, w.pad,
                                                   w.dilate, w.groups, gpu);
  }
};

// pool2d's gradient: (dy, data), with the forward pool2d's attributes.
struct pool2d_backward {
  static constexpr std::string_view name = "pool2d_backward";
  static constexpr int arity = 2;
  static constexpr bool gradient_only = true;
  // A global pool's window is the input's whole plane.
  static hybra::detail::nn::PoolWindow window(std::span<const Tensor> in, const graph::Attrs& a) {
    auto p = hybra::detail::nn::PoolWindow::read(a, name);
    if (p.global) {
      const Shape& s = in[1].shape();
      if (s.size() != 4) fail<ShapeError>(name, ": input of shape ", hybra::to_string(s), " is not 4-d");
      p.kernel = Size2d(s[2], s[3]);
    }
    return p;
  }
  static Tensor eval(std::span<const Tensor> in, const graph::Attrs& a) {
    const auto p = window(in, a);
    return hybra::pool2d_backward(in[0], in[1], p.max, p.kernel, p.stride, p.pad, p.count_include_pad, p.convention);
  }
  static std::optional<jit::CudaLaunch> cuda_launch(std::span<const Tensor> in, const Tensor&, const graph::Attrs& a,
                                                    backend::cuda::Gpu& gpu) {
    const auto p = window(in, a);
    return hybra::detail::nn::cuda_pool2d_backward_launch(in, p.max, p.kernel, p.stride, p.pad, p.count_include_pad,
                                                   p.convention, gpu);
  }
};

}  // namespace op

}  // namespace hybra
