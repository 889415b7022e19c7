#pragma once
// The ops of convolutional networks, on NCHW tensors of float32 or float64:
// conv2d (MXNet's Convolution), max and average pooling and their global
// forms (MXNet's Pooling) and batch_norm (MXNet's
// BatchNorm in its inference form).
//
// conv2d multiplies the filters (F x K, K = channels per group x kernel
// area) by a K x P matrix of the input's windows (P = output pixels), per
// image or band of output rows of one. With stride 1 that matrix is the
// zero-padded input rows themselves, read from an offset per kernel tap
// (conv2d_wide); other strides copy the windows out first (im2col). The
// product is hybra's own kernel below, not OpenBLAS's GEMM: F is small in
// the layers it serves (6 and 16 in LeNet-5), where a GEMM packs its
// operands for little reuse, and OpenBLAS 0.3.21 takes the development
// machine for a Prescott (SSE3 kernels, backend/cpu/gemv.hpp): this file's
// product beat im2col with OpenBLAS's sgemm on LeNet's layers and on a
// ResNet 3x3 layer (docs/benchmarks.md, "Figures behind constants of the code").
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <ostream>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "../backend/cpu/threads.hpp"
#include "../jit/cuda_conv.hpp"
#include "../jit/cuda_launch.hpp"
#include "conv_geometry.hpp"
#include "nn.hpp"

namespace hybra {

// The (height, width) of a 2-d window's size, stride, padding or dilation;
// one integer stands for both, as in Gluon (`2` is (2, 2)).
struct Size2d {
  std::int64_t h = 0, w = 0;
  Size2d(std::int64_t both) : h(both), w(both) {}  // NOLINT(google-explicit-constructor)
  Size2d(std::int64_t height, std::int64_t width) : h(height), w(width) {}
  friend bool operator==(const Size2d&, const Size2d&) = default;
};

inline std::ostream& operator<<(std::ostream& os, Size2d s) { return os << '(' << s.h << ", " << s.w << ')'; }

// How a pooling counts its windows along an axis (MXNet's
// pooling_convention): `valid`, those that fit in the padded input (floor);
// `full`, also a last one that runs past its end (ceil: Gluon's and PyTorch's
// ceil_mode), its overhang holding no input and not counted by an average.
enum class PoolingConvention { valid, full };

inline std::string_view name(PoolingConvention c) { return c == PoolingConvention::full ? "full" : "valid"; }
inline PoolingConvention parse_pooling_convention(std::string_view text, std::string_view op) {
  if (text == "valid") return PoolingConvention::valid;
  if (text == "full") return PoolingConvention::full;
  fail<ValueError>(op, ": pooling_convention '", text, "' is not valid or full");
}

namespace detail::nn {

inline void require_4d(std::string_view op, const Shape& x) {
  if (x.size() != 4)
    fail<ShapeError>(op, ": input of shape ", to_string(x), " is not 4-d (batch, channels, height, width)");
}

inline void require_window(std::string_view op, Size2d stride, Size2d padding, Size2d dilation = 1) {
  if (stride.h < 1 || stride.w < 1) fail<ValueError>(op, ": stride ", stride, " must be positive");
  if (padding.h < 0 || padding.w < 0) fail<ValueError>(op, ": padding ", padding, " must not be negative");
  if (dilation.h < 1 || dilation.w < 1) fail<ValueError>(op, ": dilation ", dilation, " must be positive");
}

// Output extent of a window of `span` input elements moved by `stride` over
// `extent` elements padded on both sides (MXNet's "valid" convention, as
// floor). The caller has checked that the window fits.
inline std::int64_t window_count(std::int64_t extent, std::int64_t pad, std::int64_t span, std::int64_t stride) {
  return (extent + 2 * pad - span) / stride + 1;
}

inline Conv2dGeometry conv2d_geometry(const Shape& x, const Shape& w, Size2d stride, Size2d padding, Size2d dilation,
                                      std::int64_t groups) {
  require_4d("conv2d", x);
  if (w.size() != 4)
    fail<ShapeError>("conv2d: weight of shape ", to_string(w),
                     " is not 4-d (filters, channels / groups, kernel height, kernel width)");
  require_window("conv2d", stride, padding, dilation);
  if (groups < 1) fail<ValueError>("conv2d: groups must be positive, not ", groups);
  Conv2dGeometry g{x[0], x[1],     x[2],     x[3],      w[0],      w[2],       w[3],       0,
                   0,    stride.h, stride.w, padding.h, padding.w, dilation.h, dilation.w, groups};
  if (g.C % groups != 0)
    fail<ShapeError>("conv2d: input of shape ", to_string(x), " has ", g.C, " channels, which ", groups,
                     " groups do not divide");
  if (g.F % groups != 0)
    fail<ShapeError>("conv2d: weight of shape ", to_string(w), " has ", g.F, " filters, which ", groups,
                     " groups do not divide");
  if (w[1] != g.C / groups)
    fail<ShapeError>("conv2d: input of shape ", to_string(x), " (", g.C, " channels in ", groups,
                     groups == 1 ? " group" : " groups", ") does not match weight of shape ", to_string(w),
                     " (expected (", g.F, ", ", g.C / groups, ", ", g.KH, ", ", g.KW, "))");
  if (g.KH < 1 || g.KW < 1) fail<ShapeError>("conv2d: weight of shape ", to_string(w), " has an empty kernel");
  const std::int64_t span_h = g.dh * (g.KH - 1) + 1, span_w = g.dw * (g.KW - 1) + 1;
  if (span_h > g.H + 2 * g.ph || span_w > g.W + 2 * g.pw)
    fail<ShapeError>("conv2d: kernel ", Size2d(g.KH, g.KW), " with dilation ", dilation, " spans ",
                     Size2d(span_h, span_w), ", more than the padded input ", Size2d(g.H + 2 * g.ph, g.W + 2 * g.pw),
                     " (input of shape ", to_string(x), ", padding ", padding, ")");
  g.OH = window_count(g.H, g.ph, span_h, g.sh);
  g.OW = window_count(g.W, g.pw, span_w, g.sw);
  return g;
}

// Every window must hold at least one input element (padding < kernel), so
// that a max is defined and an average without the padding divides by > 0.
inline void require_pool_window(std::string_view op, Size2d kernel, Size2d stride, Size2d padding) {
  if (kernel.h < 1 || kernel.w < 1) fail<ValueError>(op, ": kernel ", kernel, " must be positive");
  require_window(op, stride, padding);
  if (padding.h >= kernel.h || padding.w >= kernel.w)
    fail<ValueError>(op, ": padding ", padding, " must be smaller than the kernel ", kernel);
}

inline Pool2dGeometry pool2d_geometry(std::string_view op, const Shape& x, Size2d kernel, Size2d stride,
                                      Size2d padding, PoolingConvention convention = PoolingConvention::valid) {
  require_4d(op, x);
  require_pool_window(op, kernel, stride, padding);
  Pool2dGeometry g{x[0], x[1], x[2], x[3], kernel.h, kernel.w, 0, 0, stride.h, stride.w, padding.h, padding.w};
  if (g.KH > g.H + 2 * g.ph || g.KW > g.W + 2 * g.pw)
    fail<ShapeError>(op, ": kernel ", kernel, " is larger than the padded input ",
                     Size2d(g.H + 2 * g.ph, g.W + 2 * g.pw), " (input of shape ", to_string(x), ", padding ", padding,
                     ")");
  g.OH = window_count(g.H, g.ph, g.KH, g.sh);
  g.OW = window_count(g.W, g.pw, g.KW, g.sw);
  if (convention == PoolingConvention::full) {
    g.OH += (g.H + 2 * g.ph - g.KH) % g.sh != 0;
    g.OW += (g.W + 2 * g.pw - g.KW) % g.sw != 0;
    // MXNet would give such a window the identity (-inf for a max).
    if ((g.OH - 1) * g.sh - g.ph >= g.H || (g.OW - 1) * g.sw - g.pw >= g.W)
      fail<ShapeError>(op, ": with pooling_convention full, the last window of kernel ", kernel, " and stride ",
                       stride, " holds no input (input of shape ", to_string(x), ", padding ", padding, ")");
  }
  return g;
}

// ---- The product: C (M x n) = A (M x K) B (K x n) + bias, for small M. ----
//
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

// The kernels of this file and conv_backward.hpp come in three builds of
// one template: AVX-512 and AVX2 (GCC's target attribute, on x86-64 only;
// `flatten` inlines the tiles, so each is compiled for its target) and
// generic. runnable_variants lists the builds this CPU can run, fastest
// first; the kernel calls the first, and the tests run every one.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define HYBRA_ISA_VARIANTS 1
#endif

template <class Fn>
std::vector<Fn> runnable_variants([[maybe_unused]] Fn avx512, [[maybe_unused]] Fn avx2, Fn generic) {
  std::vector<Fn> variants;
#ifdef HYBRA_ISA_VARIANTS
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq"))
    variants.push_back(avx512);
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) variants.push_back(avx2);
#endif
  variants.push_back(generic);
  return variants;
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

// ---- The convolution ----

// Copies n elements from src to dst, in blocks of 16 (one AVX-512 register
// of floats) or 8 where it can, the last block overlapping the one before:
// nothing outside the n elements is read or written.
template <class T>
inline void copy_exact(T* dst, const T* src, std::int64_t n) {
  if (n >= 16) {
    for (std::int64_t i = 0; i + 16 < n; i += 16) std::memcpy(dst + i, src + i, 16 * sizeof(T));
    std::memcpy(dst + n - 16, src + n - 16, 16 * sizeof(T));
  } else if (n >= 8) {
    std::memcpy(dst, src, 8 * sizeof(T));
    std::memcpy(dst + n - 8, src + n - 8, 8 * sizeof(T));
  } else {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = src[i];
  }
}

// Working memory that a kernel's threads allocate inside its parallel
// loop, zeroed and 64-byte aligned. An exception must not leave an OpenMP
// region (the process would end), so when the memory runs out the buffer is
// null and sets `failed`, and the kernel throws after the loop (check_buffers).
template <class T>
class ThreadBuffer {
 public:
  ThreadBuffer(std::int64_t size, std::atomic<bool>& failed) {
    const std::size_t bytes = std::max<std::size_t>(64, (static_cast<std::size_t>(size) * sizeof(T) + 63) / 64 * 64);
    memory_.reset(static_cast<T*>(std::aligned_alloc(64, bytes)));
    if (memory_) std::memset(memory_.get(), 0, bytes);
    else failed.store(true, std::memory_order_relaxed);
  }
  T* get() const { return memory_.get(); }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> memory_;
};

inline void check_buffers(const std::atomic<bool>& failed, std::string_view op) {
  if (failed.load(std::memory_order_relaxed)) fail<OutOfMemory>(op, ": out of memory for its working buffers");
}

// Padded input rows [r0, r0 + count) of each of the Cg channels of xg (one
// group of one image), zero-padded to Wp = W + 2 pw, channel c at band +
// c * stride.
template <class T>
void copy_band(const T* xg, const Conv2dGeometry& g, std::int64_t Cg, std::int64_t r0, std::int64_t count, T* band,
               std::int64_t stride) {
  const std::int64_t Wp = g.W + 2 * g.pw;
  for (std::int64_t c = 0; c < Cg; ++c) {
    for (std::int64_t r = 0; r < count; ++r) {
      T* dst = band + c * stride + r * Wp;
      const std::int64_t ih = r0 + r - g.ph;
      if (ih < 0 || ih >= g.H) {
        std::fill_n(dst, Wp, T(0));
        continue;
      }
      std::fill_n(dst, g.pw, T(0));
      copy_exact(dst + g.pw, xg + (c * g.H + ih) * g.W, g.W);
      std::fill_n(dst + g.pw + g.W, g.pw, T(0));
    }
  }
}

// How many output rows (wide) or pixels (im2col) one work item takes: as
// many as keep its working set near 256 KiB (half of L2, a quarter on the
// development machine), but no more than leave each thread an item.
inline std::int64_t band_size(std::int64_t total, std::int64_t images, std::int64_t bytes_each) {
  const std::int64_t threads = backend::cpu::available_threads();
  std::int64_t band = std::max<std::int64_t>(1, (std::int64_t{256} << 10) / std::max<std::int64_t>(1, bytes_each));
  if (images < threads) band = std::min(band, (total * images + threads - 1) / threads);
  return std::clamp<std::int64_t>(band, 1, total);
}

// Stride 1: the padded input rows are B itself. Number the pixels across
// whole padded rows, q = oh Wp + ow ("wide" pixels: those with ow >= OW are
// no output), and tap k = (c, kh, kw) reads band element c rows Wp + (oh +
// kh dh) Wp + ow + kw dw = q + (c rows Wp + kh dh Wp + kw dw): B's row k is
// the band itself, from that offset on. The product computes wide pixels
// (Wp / OW times the work: 8/7 for LeNet's first layer, 7/5 for its second)
// into a buffer, whose output rows are then copied out; no im2col matrix is
// built, which cost as much as the product in those layers.
template <class T>
void conv2d_wide(const T* x, const T* w, const T* b, T* out, const Conv2dGeometry& g) {
  const std::int64_t Wp = g.W + 2 * g.pw, P = g.OH * g.OW, Cg = g.C / g.groups, Fg = g.F / g.groups;
  const std::int64_t K = Cg * g.KH * g.KW;
  const std::int64_t band = band_size(g.OH, g.N, (Cg + Fg) * Wp * static_cast<std::int64_t>(sizeof(T)));
  const std::int64_t bands = (g.OH + band - 1) / band, rows = band + g.dh * (g.KH - 1);
  const std::int64_t ld = (band * Wp + 15) / 16 * 16;
  // The last tap's row runs (KW - 1) dw past the band, and the product reads up to a vector past that.
  const std::int64_t input_size = (Cg * rows * Wp + g.dw * (g.KW - 1) + 16 + 15) / 16 * 16;
  std::vector<std::int64_t> b_rows(static_cast<std::size_t>(K));
  for (std::int64_t c = 0; c < Cg; ++c)
    for (std::int64_t kh = 0; kh < g.KH; ++kh)
      for (std::int64_t kw = 0; kw < g.KW; ++kw)
        b_rows[static_cast<std::size_t>((c * g.KH + kh) * g.KW + kw)] = (c * rows + kh * g.dh) * Wp + kw * g.dw;
  std::atomic<bool> failed{false};
  backend::cpu::parallel_for(g.N * bands, Fg * K * band * Wp * g.groups, [&](std::int64_t first, std::int64_t last) {
    ThreadBuffer<T> buffer(input_size + Fg * ld, failed);
    if (!buffer.get()) return;
    T* input = buffer.get();
    T* wide = input + input_size;
    for (std::int64_t item = first; item < last; ++item) {
      const std::int64_t n = item / bands, oh0 = item % bands * band, count = std::min(band, g.OH - oh0);
      for (std::int64_t grp = 0; grp < g.groups; ++grp) {
        copy_band(x + (n * g.C + grp * Cg) * g.H * g.W, g, Cg, oh0, count + g.dh * (g.KH - 1), input, rows * Wp);
        product(Product<T>{w + grp * Fg * K, K, input, b_rows.data(), b ? b + grp * Fg : nullptr, wide, ld, Fg, K,
                           count * Wp});
        for (std::int64_t f = 0; f < Fg; ++f)
          for (std::int64_t r = 0; r < count; ++r)
            copy_exact(out + (n * g.F + grp * Fg + f) * P + (oh0 + r) * g.OW, wide + f * ld + r * Wp, g.OW);
      }
    }
  });
  check_buffers(failed, "conv2d");
}

// Any stride: im2col. For output pixels [p0, p0 + cols) of one group of one
// image, the padded input rows they read go to `band` (Cg channels of
// `rows` rows each), then each window row to `col`: row k = (c, kh, kw),
// column = pixel - p0, row stride ld. With the padding in place every
// window row is one plain (strided) copy.
template <class T>
void im2col(const T* xg, const Conv2dGeometry& g, std::int64_t Cg, std::int64_t p0, std::int64_t cols, T* band, T* col,
            std::int64_t ld) {
  const std::int64_t Wp = g.W + 2 * g.pw;
  const std::int64_t oh0 = p0 / g.OW, oh1 = (p0 + cols - 1) / g.OW;
  const std::int64_t rows = (oh1 - oh0) * g.sh + g.dh * (g.KH - 1) + 1;
  copy_band(xg, g, Cg, oh0 * g.sh, rows, band, rows * Wp);
  // The pixels as output rows: a partial first row from ow0, whole rows, a partial last row.
  const std::int64_t ow0 = p0 % g.OW, head = std::min(cols, (g.OW - ow0) % g.OW);
  const std::int64_t whole = (cols - head) / g.OW, tail = cols - head - whole * g.OW;
  auto copy_row = [&](T* dst, const T* src, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = src[i * g.sw];
  };
  for (std::int64_t c = 0; c < Cg; ++c) {
    for (std::int64_t kh = 0; kh < g.KH; ++kh) {
      for (std::int64_t kw = 0; kw < g.KW; ++kw) {
        T* dst = col + ((c * g.KH + kh) * g.KW + kw) * ld;
        // The input that pixel 0 of the first output row reads.
        const T* s = band + (c * rows + kh * g.dh) * Wp + kw * g.dw;
        if (head > 0) {
          copy_row(dst, s + ow0 * g.sw, head);
          dst += head;
          s += g.sh * Wp;
        }
        for (std::int64_t r = 0; r < whole; ++r, dst += g.OW, s += g.sh * Wp) copy_row(dst, s, g.OW);
        if (tail > 0) copy_row(dst, s, tail);
      }
    }
  }
}

template <class T>
void conv2d_im2col(const T* x, const T* w, const T* b, T* out, const Conv2dGeometry& g) {
  const std::int64_t P = g.OH * g.OW, Cg = g.C / g.groups, Fg = g.F / g.groups, K = Cg * g.KH * g.KW;
  const std::int64_t band = band_size(P, g.N, K * static_cast<std::int64_t>(sizeof(T)));
  // Rows of a multiple of 16: the product's last vector stays in its row.
  const std::int64_t bands = (P + band - 1) / band, ld = (band + 15) / 16 * 16;
  const std::int64_t band_rows = ((band + g.OW - 1) / g.OW + 1) * g.sh + g.dh * (g.KH - 1) + 1;
  const std::int64_t input_size = (Cg * band_rows * (g.W + 2 * g.pw) + 15) / 16 * 16;
  std::vector<std::int64_t> b_rows(static_cast<std::size_t>(K));
  for (std::int64_t k = 0; k < K; ++k) b_rows[static_cast<std::size_t>(k)] = k * ld;
  std::atomic<bool> failed{false};
  backend::cpu::parallel_for(g.N * bands, Fg * K * band * g.groups, [&](std::int64_t first, std::int64_t last) {
    ThreadBuffer<T> buffer(input_size + K * ld, failed);
    if (!buffer.get()) return;
    T* input = buffer.get();
    T* col = input + input_size;
    for (std::int64_t item = first; item < last; ++item) {
      const std::int64_t n = item / bands, p0 = item % bands * band, cols = std::min(band, P - p0);
      for (std::int64_t grp = 0; grp < g.groups; ++grp) {
        im2col(x + (n * g.C + grp * Cg) * g.H * g.W, g, Cg, p0, cols, input, col, ld);
        product(Product<T>{w + grp * Fg * K, K, col, b_rows.data(), b ? b + grp * Fg : nullptr,
                           out + (n * g.F + grp * Fg) * P + p0, P, Fg, K, cols});
      }
    }
  });
  check_buffers(failed, "conv2d");
}

// out (N, F, OH, OW) = conv(x (N, C, H, W), w (F, C / groups, KH, KW)) + b
// (F, or null); all contiguous. The convolution's kernel, shared by the
// eager op and captured graphs so that both give the same bits. Work is
// split over images, and an image over bands of output rows or pixels when
// the images are fewer than the threads or an image's working set would
// not stay in L2.
template <class T>
void conv2d(const T* x, const T* w, const T* b, T* out, const Conv2dGeometry& g) {
  const std::int64_t P = g.OH * g.OW, K = g.C / g.groups * g.KH * g.KW;
  if (g.N == 0 || g.F == 0 || P == 0) return;
  if (K == 0) {
    for (std::int64_t i = 0; i < g.N * g.F; ++i) std::fill_n(out + i * P, P, b ? b[i % g.F] : T(0));
    return;
  }
  if (g.sh == 1 && g.sw == 1) conv2d_wide(x, w, b, out, g);
  else conv2d_im2col(x, w, b, out, g);
}

// ---- pooling ----

// v replaces acc when it is larger or NaN; a NaN acc stays, so NaN wins (as
// hybra's max).
template <class T>
inline T max_nan(T acc, T v) {
  return (v > acc || v != v) ? v : acc;
}

template <class T, bool Max>
inline T pool_op(T acc, T v) {
  if constexpr (Max) return max_nan(acc, v);
  else return acc + v;
}

// Eight elements at a time, as GCC vectors (one AVX register of floats).
// Rows of small images are short (14 elements in LeNet): a loop over one
// ends in a scalar remainder as long as itself, so pooling works in whole
// blocks of 8 instead (the last block of a row overlapping the one before,
// see for_blocks) and loads the strided columns of a stride-2 window as the
// even elements of 16.
template <class T>
struct PoolBlock {
  static constexpr std::int64_t lanes = 8;
  typedef T V __attribute__((vector_size(lanes * sizeof(T))));

  static void load(V& v, const T* p) { std::memcpy(&v, p, sizeof v); }
  static void store(T* p, const V& v) { std::memcpy(p, &v, sizeof v); }
  // p[0], p[stride], ..., p[7 stride].
  template <int Stride>
  static void load_strided(V& v, const T* p, std::int64_t stride) {
    if constexpr (Stride == 1) {
      load(v, p);
    } else if constexpr (Stride == 2) {
      V a, b;
      load(a, p);
      load(b, p + lanes);
      v = __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14);
    } else {
      V gathered{};  // set lane by lane: a start from v would read it uninitialised
      for (std::int64_t l = 0; l < lanes; ++l) gathered[l] = p[l * stride];
      v = gathered;
    }
  }
  template <bool Max>
  static void combine(V& acc, const V& v) {
    if constexpr (Max) acc = ((v > acc) | (v != v)) ? v : acc;
    else acc += v;
  }
};

// Calls block(i) for blocks [i, i + 8) covering [0, n): the last one ends
// at n and may overlap the one before, so block must write out-of-place
// (computing an element twice is then harmless). Rows of fewer than 8
// elements go one element at a time, to element(i).
template <class Block, class Element>
inline void for_blocks(std::int64_t n, Block&& block, Element&& element) {
  constexpr std::int64_t lanes = 8;
  if (n < lanes) {
    for (std::int64_t i = 0; i < n; ++i) element(i);
    return;
  }
  std::int64_t i = 0;
  for (; i + lanes <= n; i += lanes) block(i);
  if (i < n) block(n - lanes);
}

// dst[q] = the reduction over kw < KW of src[q * stride + kw], q < n, with
// Stride the stride when it is 1 or 2 (0: only known at run time). A
// stride-2 block reads one element past the last it uses.
template <class T, bool Max, int Stride>
inline void pool_columns(const T* src, T* dst, std::int64_t n, std::int64_t stride, std::int64_t KW) {
  using B = PoolBlock<T>;
  const std::int64_t s = Stride ? Stride : stride;
  for_blocks(
      n,
      [&](std::int64_t q) {
        typename B::V acc, v;
        B::template load_strided<Stride>(acc, src + q * s, s);
        for (std::int64_t kw = 1; kw < KW; ++kw) {
          B::template load_strided<Stride>(v, src + q * s + kw, s);
          B::template combine<Max>(acc, v);
        }
        B::store(dst + q, acc);
      },
      [&](std::int64_t q) {
        T acc = src[q * s];
        for (std::int64_t kw = 1; kw < KW; ++kw) acc = pool_op<T, Max>(acc, src[q * s + kw]);
        dst[q] = acc;
      });
}

// Max (Max = true) or average pooling of every (image, channel) plane, in
// two passes, since both reductions separate: down the window's rows into
// a buffer of padded rows (Wp = W + 2 pw wide, the padding holding the
// reduction's identity, with room past the end for pool_columns' reads),
// then along its columns, with no bounds to check. When the windows tile
// the padded rows exactly (Wp == OW sw, as 2x2 windows with stride 2 on an
// even width) the second pass runs over the whole plane at once.
template <class T, bool Max>
void pool2d(const T* x, T* out, const Pool2dGeometry& g, bool count_include_pad) {
  const std::int64_t planes = g.N * g.C, P = g.OH * g.OW;
  // A `full` pooling's last window may run past the right padding.
  const std::int64_t Wp = std::max(g.W + 2 * g.pw, (g.OW - 1) * g.sw + g.KW);
  if (planes == 0 || P == 0) return;
  const T identity = Max ? -std::numeric_limits<T>::infinity() : T(0);
  const bool flat = Wp == g.OW * g.sw;
  // What an average divides by: each output column's part, each output row's part.
  std::vector<T> widths(static_cast<std::size_t>(g.OW)), heights(static_cast<std::size_t>(g.OH));
  for (std::int64_t ow = 0; ow < g.OW; ++ow)
    widths[static_cast<std::size_t>(ow)] =
        static_cast<T>(pool_divisor_extent(ow * g.sw - g.pw, g.KW, g.W, g.pw, count_include_pad));
  for (std::int64_t oh = 0; oh < g.OH; ++oh)
    heights[static_cast<std::size_t>(oh)] =
        static_cast<T>(pool_divisor_extent(oh * g.sh - g.ph, g.KH, g.H, g.ph, count_include_pad));
  std::atomic<bool> failed{false};
  backend::cpu::parallel_for(planes, P * g.KH * g.KW, [&](std::int64_t first, std::int64_t last) {
    ThreadBuffer<T> rows(g.OH * Wp + g.KW, failed);
    if (!rows.get()) return;
    std::fill_n(rows.get(), g.OH * Wp + g.KW, identity);
    for (std::int64_t plane = first; plane < last; ++plane) {
      const T* xp = x + plane * g.H * g.W;
      T* op = out + plane * P;
      for (std::int64_t oh = 0; oh < g.OH; ++oh) {
        T* dst = rows.get() + oh * Wp + g.pw;
        const std::int64_t top = oh * g.sh - g.ph;
        const T* src = xp + std::max<std::int64_t>(0, top) * g.W;
        const std::int64_t height = std::min(g.H, top + g.KH) - std::max<std::int64_t>(0, top);
        for_blocks(
            g.W,
            [&](std::int64_t w) {
              using B = PoolBlock<T>;
              typename B::V acc, v;
              B::load(acc, src + w);
              for (std::int64_t r = 1; r < height; ++r) {
                B::load(v, src + r * g.W + w);
                B::template combine<Max>(acc, v);
              }
              B::store(dst + w, acc);
            },
            [&](std::int64_t w) {
              T acc = src[w];
              for (std::int64_t r = 1; r < height; ++r) acc = pool_op<T, Max>(acc, src[r * g.W + w]);
              dst[w] = acc;
            });
      }
      for (std::int64_t oh = 0; oh < (flat ? 1 : g.OH); ++oh) {
        const T* src = rows.get() + oh * Wp;
        T* dst = op + oh * g.OW;
        const std::int64_t n = flat ? P : g.OW;
        if (g.sw == 1) pool_columns<T, Max, 1>(src, dst, n, 1, g.KW);
        else if (g.sw == 2) pool_columns<T, Max, 2>(src, dst, n, 2, g.KW);
        else pool_columns<T, Max, 0>(src, dst, n, g.sw, g.KW);
      }
      if constexpr (!Max) {
        for (std::int64_t oh = 0; oh < g.OH; ++oh) {
          const T height = heights[static_cast<std::size_t>(oh)];
          T* dst = op + oh * g.OW;
#pragma omp simd
          for (std::int64_t ow = 0; ow < g.OW; ++ow) dst[ow] /= height * widths[static_cast<std::size_t>(ow)];
        }
      }
    }
  });
  check_buffers(failed, Max ? "max_pool2d" : "avg_pool2d");
}

// Max or average of each whole (image, channel) plane of `size` elements.
template <class T, bool Max>
void global_pool2d(const T* x, T* out, std::int64_t planes, std::int64_t size) {
  backend::cpu::parallel_for(planes, size, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t plane = first; plane < last; ++plane) {
      const T* p = x + plane * size;
      if constexpr (Max) {
        T m = -std::numeric_limits<T>::infinity();
        int nan = 0;
#pragma omp simd reduction(max : m) reduction(| : nan)
        for (std::int64_t i = 0; i < size; ++i) {
          m = std::max(m, p[i]);
          nan |= p[i] != p[i];
        }
        out[plane] = nan ? std::numeric_limits<T>::quiet_NaN() : m;
      } else {
        T s = 0;
#pragma omp simd reduction(+ : s)
        for (std::int64_t i = 0; i < size; ++i) s += p[i];
        out[plane] = s / static_cast<T>(size);
      }
    }
  });
}

// y = x * scale[c] + shift[c] over x seen as (outer, C, inner), where scale =
// gamma / sqrt(var + eps) and shift = beta - mean * scale.
template <class T>
void batch_norm(const T* x, const T* gamma, const T* beta, const T* mean, const T* var, T* out, std::int64_t outer,
                std::int64_t C, std::int64_t inner, double eps) {
  std::unique_ptr<T[]> scale(new T[static_cast<std::size_t>(2 * C)]);
  T* shift = scale.get() + C;
  for (std::int64_t c = 0; c < C; ++c) {
    scale[c] = gamma[c] / std::sqrt(var[c] + static_cast<T>(eps));
    shift[c] = beta[c] - mean[c] * scale[c];
  }
  backend::cpu::parallel_for(outer * C, inner, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t i = first; i < last; ++i) {
      const T s = scale[i % C], t = shift[i % C];
      const T* src = x + i * inner;
      T* dst = out + i * inner;
#pragma omp simd
      for (std::int64_t j = 0; j < inner; ++j) dst[j] = src[j] * s + t;
    }
  });
}

// The operands of an op, as contiguous tensors of their promoted dtype,
// which must be floating. Empty tensors (no bias) stay empty.
template <std::size_t N>
std::array<Tensor, N> float_operands(std::string_view op, std::array<Tensor, N> in) {
  DType dtype = in[0].dtype();
  for (const auto& t : in) {
    if (!t.defined()) continue;
    require_same_device(op, in[0], t);
    dtype = promote_types(dtype, t.dtype());
  }
  if (!is_floating(dtype)) fail<DTypeError>(op, ": dtype ", name(dtype), " is not supported (float32 or float64)");
  for (auto& t : in)
    if (t.defined()) t = detail::linalg::to_dtype(t, dtype).contiguous();
  return in;
}

template <class T>
const T* data_or_null(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.raw_data()) : nullptr;
}

// The dtype of operands a GPU's launches take as they are: one floating
// dtype for all (jit/cuda_conv.hpp); none where the eager op would convert.
inline std::optional<DType> launch_dtype(std::span<const Tensor> in) {
  const DType dtype = in[0].dtype();
  for (const Tensor& t : in)
    if (t.dtype() != dtype) return std::nullopt;
  if (!is_floating(dtype)) return std::nullopt;
  return dtype;
}

// The ops' launches on a GPU for operands laid out as `in` (a captured
// plan's, graph::OpDef::cuda_launch); nullopt where the eager op must run.
// conv2d's operands are (x, w) or (x, w, bias).
inline std::optional<jit::CudaLaunch> cuda_conv2d_launch(std::span<const Tensor> in, Size2d stride, Size2d padding,
                                                         Size2d dilation, std::int64_t groups,
                                                         backend::cuda::Gpu& gpu) {
  const auto dtype = launch_dtype(in);
  if (!dtype) return std::nullopt;
  const Conv2dGeometry g = conv2d_geometry(in[0].shape(), in[1].shape(), stride, padding, dilation, groups);
  return jit::cuda_conv2d_launch(jit::ConvPass::forward, g, in.size() == 3, *dtype, gpu);
}

// A pooling of x (global: over each whole plane).
inline std::optional<jit::CudaLaunch> cuda_pool2d_launch(const Tensor& x, bool max, bool global, Size2d kernel,
                                                         Size2d stride, Size2d padding, bool count_include_pad,
                                                         PoolingConvention convention, backend::cuda::Gpu& gpu) {
  const auto dtype = launch_dtype(std::span(&x, 1));
  if (!dtype) return std::nullopt;
  const std::string_view op = max ? "max_pool2d" : "avg_pool2d";
  const Pool2dGeometry g = global ? pool2d_geometry(op, x.shape(), Size2d(x.shape()[2], x.shape()[3]), 1, 0)
                                  : pool2d_geometry(op, x.shape(), kernel, stride, padding, convention);
  return jit::cuda_pool2d_launch(max, false, g, count_include_pad, *dtype, gpu);
}

// batch_norm's operands (x, gamma, beta, running_mean, running_var), x seen
// as (outer, C, inner) around `axis`.
inline std::optional<jit::CudaLaunch> cuda_batch_norm_launch(std::span<const Tensor> in, double eps, std::int64_t axis,
                                                             backend::cuda::Gpu& gpu) {
  const auto dtype = launch_dtype(in);
  if (!dtype) return std::nullopt;
  const Shape& shape = in[0].shape();
  const int a = hybra::detail::checked_axis(axis, shape, "batch_norm");
  std::int64_t outer = 1, inner = 1;
  for (int d = 0; d < a; ++d) outer *= shape[static_cast<std::size_t>(d)];
  for (int d = a + 1; d < static_cast<int>(shape.size()); ++d) inner *= shape[static_cast<std::size_t>(d)];
  return jit::cuda_batch_norm_launch(outer, shape[static_cast<std::size_t>(a)], inner, eps, *dtype, gpu);
}

inline Tensor conv2d_op(Tensor x, const Tensor& weight, const Tensor& bias, Size2d stride, Size2d padding,
                        Size2d dilation, std::int64_t groups) {
  x.require("conv2d");
  weight.require("conv2d");
  const Conv2dGeometry g = conv2d_geometry(x.shape(), weight.shape(), stride, padding, dilation, groups);
  if (bias.defined() && (bias.ndim() != 1 || bias.shape()[0] != g.F))
    fail<ShapeError>("conv2d: bias of shape ", to_string(bias.shape()), " does not match weight of shape ",
                     to_string(weight.shape()), " (expected (", g.F, ",))");
  const auto operands = float_operands<3>("conv2d", {x, weight, bias});
  const Tensor &xc = operands[0], &w = operands[1], &b = operands[2];
  Tensor out({g.N, g.F, g.OH, g.OW}, xc.dtype(), xc.device());
  if (xc.device().kind == DeviceKind::cuda) {
    jit::push_cuda_launch("conv2d", b.defined() ? std::vector<Tensor>{xc, w, b} : std::vector<Tensor>{xc, w}, out,
                          jit::cuda_conv2d_launch(jit::ConvPass::forward, g, b.defined(), xc.dtype(),
                                                  backend::cuda::gpu(xc.device().id)));
    return out;
  }
  push_op("conv2d", {xc, w, b.defined() ? b : w}, {out}, [xc, w, b, out, g] {
    dispatch(out.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_floating_point_v<T>)
        conv2d(static_cast<const T*>(xc.raw_data()), static_cast<const T*>(w.raw_data()), data_or_null<T>(b),
               static_cast<T*>(out.raw_data()), g);
    });
  });
  return out;
}

template <bool Max>
Tensor pool2d_op(std::string_view op, Tensor x, Size2d kernel, Size2d stride, Size2d padding, bool count_include_pad,
                 PoolingConvention convention) {
  x.require(op.data());
  const Pool2dGeometry g = pool2d_geometry(op, x.shape(), kernel, stride, padding, convention);
  x = float_operands<1>(op, {x})[0];
  Tensor out({g.N, g.C, g.OH, g.OW}, x.dtype(), x.device());
  if (x.device().kind == DeviceKind::cuda) {
    jit::push_cuda_launch(op, {x}, out,
                          jit::cuda_pool2d_launch(Max, false, g, count_include_pad, x.dtype(),
                                                  backend::cuda::gpu(x.device().id)));
    return out;
  }
  push_op(op, {x}, {out}, [x, out, g, count_include_pad] {
    dispatch(out.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_floating_point_v<T>)
        pool2d<T, Max>(static_cast<const T*>(x.raw_data()), static_cast<T*>(out.raw_data()), g, count_include_pad);
    });
  });
  return out;
}

template <bool Max>
Tensor global_pool2d_op(std::string_view op, Tensor x) {
  x.require(op.data());
  require_4d(op, x.shape());
  if (x.shape()[2] * x.shape()[3] == 0)
    fail<ShapeError>(op, ": input of shape ", to_string(x.shape()), " has empty (height, width) planes");
  x = float_operands<1>(op, {x})[0];
  Tensor out({x.shape()[0], x.shape()[1], 1, 1}, x.dtype(), x.device());
  if (x.device().kind == DeviceKind::cuda) {
    jit::push_cuda_launch(op, {x}, out,
                          *cuda_pool2d_launch(x, Max, true, 1, 1, 0, true, PoolingConvention::valid,
                                              backend::cuda::gpu(x.device().id)));
    return out;
  }
  push_op(op, {x}, {out}, [x, out] {
    dispatch(out.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      const Shape& s = x.shape();
      if constexpr (std::is_floating_point_v<T>)
        global_pool2d<T, Max>(static_cast<const T*>(x.raw_data()), static_cast<T*>(out.raw_data()), s[0] * s[1],
                              s[2] * s[3]);
    });
  });
  return out;
}

inline Tensor batch_norm_op(Tensor x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                            const Tensor& running_var, double eps, std::int64_t axis) {
  x.require("batch_norm");
  for (const Tensor* t : {&gamma, &beta, &running_mean, &running_var}) t->require("batch_norm");
  if (x.ndim() < 1) fail<ShapeError>("batch_norm: input of shape () has no channel axis");
  if (!(eps > 0)) fail<ValueError>("batch_norm: eps ", eps, " must be positive");
  const int a = hybra::detail::checked_axis(axis, x.shape(), "batch_norm");
  const std::int64_t C = x.shape()[static_cast<std::size_t>(a)];
  const char* names[] = {"gamma", "beta", "running_mean", "running_var"};
  const Tensor* params[] = {&gamma, &beta, &running_mean, &running_var};
  for (int k = 0; k < 4; ++k)
    if (params[k]->shape() != Shape{C})
      fail<ShapeError>("batch_norm: ", names[k], " of shape ", to_string(params[k]->shape()),
                       " does not match input of shape ", to_string(x.shape()), " (expected (", C,
                       ",), the size of axis ", axis, ")");
  const auto operands = float_operands<5>("batch_norm", {x, gamma, beta, running_mean, running_var});
  const Tensor &xc = operands[0], &g = operands[1], &b = operands[2], &m = operands[3], &v = operands[4];
  Tensor out(xc.shape(), xc.dtype(), xc.device());
  std::int64_t outer = 1, inner = 1;
  for (int d = 0; d < a; ++d) outer *= xc.shape()[static_cast<std::size_t>(d)];
  for (int d = a + 1; d < xc.ndim(); ++d) inner *= xc.shape()[static_cast<std::size_t>(d)];
  if (xc.device().kind == DeviceKind::cuda) {
    jit::push_cuda_launch("batch_norm", {xc, g, b, m, v}, out,
                          jit::cuda_batch_norm_launch(outer, C, inner, eps, xc.dtype(), backend::cuda::gpu(xc.device().id)));
    return out;
  }
  push_op("batch_norm", {xc, g, b, m, v}, {out}, [xc, g, b, m, v, out, outer, C, inner, eps] {
    dispatch(out.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_floating_point_v<T>)
        batch_norm(static_cast<const T*>(xc.raw_data()), static_cast<const T*>(g.raw_data()),
                   static_cast<const T*>(b.raw_data()), static_cast<const T*>(m.raw_data()),
                   static_cast<const T*>(v.raw_data()), static_cast<T*>(out.raw_data()), outer, C, inner, eps);
    });
  });
  return out;
}

}  // namespace detail::nn

// The ops' node attributes, as MXNet's Convolution, Pooling and BatchNorm
// name them (read back by ConvWindow and PoolWindow below).
inline std::string size2d_text(Size2d s) { return graph::attr_text(std::vector<std::int64_t>{s.h, s.w}); }
inline graph::Attrs conv2d_attrs(const Shape& weight, Size2d stride, Size2d padding, Size2d dilation,
                                 std::int64_t groups, bool has_bias) {
  if (weight.size() != 4)
    fail<ShapeError>("conv2d: weight of shape ", to_string(weight),
                     " is not 4-d (filters, channels / groups, kernel height, kernel width)");
  return {{"kernel", size2d_text(Size2d(weight[2], weight[3]))},
          {"stride", size2d_text(stride)},
          {"pad", size2d_text(padding)},
          {"dilate", size2d_text(dilation)},
          {"num_group", graph::attr_text(groups)},
          {"num_filter", graph::attr_text(weight[0])},
          {"no_bias", graph::attr_text(!has_bias)}};
}
inline graph::Attrs pool2d_attrs(std::string type, bool global, Size2d kernel, Size2d stride, Size2d padding,
                                 bool count_include_pad, PoolingConvention convention) {
  return {{"kernel", size2d_text(kernel)},
          {"stride", size2d_text(stride)},
          {"pad", size2d_text(padding)},
          {"pool_type", std::move(type)},
          {"global_pool", graph::attr_text(global)},
          {"count_include_pad", graph::attr_text(count_include_pad)},
          {"pooling_convention", std::string(name(convention))}};
}
inline graph::Attrs batch_norm_attrs(double eps, std::int64_t axis) {
  return {{"eps", graph::attr_text(eps)}, {"axis", graph::attr_text(axis)}};
}

namespace detail::nn {
// A (height, width) attribute: "(2, 3)", or one number for both.
inline Size2d size2d_attr(const graph::Attrs& a, std::string_view key, std::string_view op) {
  auto v = graph::parse_tuple(graph::find_attr(a, key, op), op);
  if (v.size() == 1) return Size2d(v[0]);
  if (v.size() != 2)
    fail<ValueError>(op, ": attribute ", key, " '", graph::find_attr(a, key, op), "' is not a (height, width) pair");
  return Size2d(v[0], v[1]);
}
// A conv2d node's window (conv2d_attrs), which its gradients and the plan read too.
struct ConvWindow {
  Size2d stride, pad, dilate;
  std::int64_t groups;
  static ConvWindow read(const graph::Attrs& a, std::string_view op) {
    return {size2d_attr(a, "stride", op), size2d_attr(a, "pad", op), size2d_attr(a, "dilate", op),
            graph::int_attr(a, "num_group", op)};
  }
};
// A pool2d node's attributes (pool2d_attrs), which its gradient reads too.
// A global pool's window is its input's whole plane: kernel, stride and pad
// are not read.
struct PoolWindow {
  bool max, global;
  Size2d kernel, stride, pad;
  bool count_include_pad;
  PoolingConvention convention;
  static PoolWindow read(const graph::Attrs& a, std::string_view op) {
    const std::string& type = graph::find_attr(a, "pool_type", op);
    if (type != "max" && type != "avg") fail<ValueError>(op, ": pool_type '", type, "' is not max or avg");
    if (graph::bool_attr(a, "global_pool", op)) return {type == "max", true, 1, 1, 0, true, PoolingConvention::valid};
    return {type == "max", false, size2d_attr(a, "kernel", op), size2d_attr(a, "stride", op), size2d_attr(a, "pad", op),
            graph::bool_attr(a, "count_include_pad", op),
            parse_pooling_convention(graph::find_attr(a, "pooling_convention", op), op)};
  }
};
// A GEMM-like op's multiply-adds: one per weight of one filter (weights first
// by filter) for each element of `per`.
inline std::int64_t per_filter(const Tensor& w) {
  return w.ndim() ? w.size() / std::max<std::int64_t>(1, w.shape()[0]) : std::int64_t{0};
}
// Convolution and Pooling as MXNet writes them: hybra's attrs, NCHW.
template <class W>
auto write_nchw(const W& w, std::string op) {
  graph::Attrs a = w.mx_attrs(w.node.attrs);
  a.emplace_back("layout", "NCHW");
  return w.keep_all(std::move(op), std::move(a));
}
}  // namespace detail::nn

// MXNet's Convolution, NCHW: x (N, C, H, W), weight (F, C / groups, KH, KW),
// bias (F,) or an empty Tensor for none; out (N, F, OH, OW) with OH =
// floor((H + 2 padding - dilation (KH - 1) - 1) / stride) + 1 (and OW alike).
// groups splits the channels and filters into that many independent
// convolutions (groups == C == F: depthwise). One engine op.
template <tensor_like X>
Tensor conv2d(X&& x, const Tensor& weight, const Tensor& bias = {}, Size2d stride = 1, Size2d padding = 0,
              Size2d dilation = 1, std::int64_t groups = 1) {
  Tensor data = eval(x);
  autograd::op_record rec("conv2d", bias.defined() ? std::vector<Tensor>{data, weight, bias}
                                                   : std::vector<Tensor>{data, weight});
  return rec.output(detail::nn::conv2d_op(data, weight, bias, stride, padding, dilation, groups), [&] {
    return conv2d_attrs(weight.shape(), stride, padding, dilation, groups, bias.defined());
  });
}

// MXNet's Pooling, NCHW: OH = floor((H + 2 padding - kernel) / stride) + 1
// (and OW alike), or ceil for PoolingConvention::full. Max pooling ignores the
// padding; average pooling divides by the window up to the end of the padded
// input (count_include_pad) or by the input elements it holds. The padding
// must be smaller than the kernel, and every window must hold input.
template <tensor_like X>
Tensor max_pool2d(X&& x, Size2d kernel, Size2d stride, Size2d padding = 0,
                  PoolingConvention convention = PoolingConvention::valid) {
  Tensor data = eval(x);
  autograd::op_record rec("pool2d", {data});
  return rec.output(detail::nn::pool2d_op<true>("max_pool2d", data, kernel, stride, padding, true, convention),
                    [&] { return pool2d_attrs("max", false, kernel, stride, padding, true, convention); });
}
template <tensor_like X>
Tensor avg_pool2d(X&& x, Size2d kernel, Size2d stride, Size2d padding = 0, bool count_include_pad = true,
                  PoolingConvention convention = PoolingConvention::valid) {
  Tensor data = eval(x);
  autograd::op_record rec("pool2d", {data});
  return rec.output(
      detail::nn::pool2d_op<false>("avg_pool2d", data, kernel, stride, padding, count_include_pad, convention),
      [&] { return pool2d_attrs("avg", false, kernel, stride, padding, count_include_pad, convention); });
}
// Over each whole (H, W) plane: (N, C, H, W) -> (N, C, 1, 1).
template <tensor_like X>
Tensor global_avg_pool2d(X&& x) {
  Tensor data = eval(x);
  autograd::op_record rec("pool2d", {data});
  return rec.output(detail::nn::global_pool2d_op<false>("global_avg_pool2d", data),
                    [] { return pool2d_attrs("avg", true, 1, 1, 0, true, PoolingConvention::valid); });
}
template <tensor_like X>
Tensor global_max_pool2d(X&& x) {
  Tensor data = eval(x);
  autograd::op_record rec("pool2d", {data});
  return rec.output(detail::nn::global_pool2d_op<true>("global_max_pool2d", data),
                    [] { return pool2d_attrs("max", true, 1, 1, 0, true, PoolingConvention::valid); });
}

// MXNet's BatchNorm in its inference form, along `axis` (1: NCHW's channels):
// y = (x - running_mean) / sqrt(running_var + eps) * gamma + beta, each
// parameter of shape (C,). It uses the running statistics in training mode
// too: batch statistics (and updating the running ones) come with autograd.
template <tensor_like X>
Tensor batch_norm(X&& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean, const Tensor& running_var,
                  double eps = 1e-5, std::int64_t axis = 1) {
  Tensor data = eval(x);
  autograd::op_record rec("batch_norm", {data, gamma, beta, running_mean, running_var});
  return rec.output(detail::nn::batch_norm_op(data, gamma, beta, running_mean, running_var, eps, axis),
                    [&] { return batch_norm_attrs(eps, axis); });
}

namespace op {

// (data, weight) with no_bias, or (data, weight, bias). kernel, num_filter
// and no_bias restate the weight's and bias's shapes (MXNet's Convolution
// needs them).
struct conv2d {
  static constexpr std::string_view name = "conv2d";
  static constexpr int arity = -1;
  static constexpr bool product = true;
  static Tensor eval(std::span<const Tensor> in, const graph::Attrs& a) {
    const bool no_bias = graph::bool_attr(a, "no_bias", name);
    if (in.size() != (no_bias ? 2u : 3u))
      fail<ValueError>("conv2d: takes ", no_bias ? "(data, weight) with no_bias" : "(data, weight, bias)", ", not ",
                       in.size(), " inputs");
    const Size2d kernel = hybra::detail::nn::size2d_attr(a, "kernel", name);
    const std::int64_t filters = graph::int_attr(a, "num_filter", name);
    const Shape& w = in[1].shape();
    if (w.size() != 4 || w[0] != filters || w[2] != kernel.h || w[3] != kernel.w)
      fail<ShapeError>("conv2d: weight of shape ", hybra::to_string(w), " does not match num_filter=", filters,
                       " kernel=", kernel);
    const auto window = hybra::detail::nn::ConvWindow::read(a, name);
    return hybra::conv2d(in[0], in[1], no_bias ? Tensor{} : in[2], window.stride, window.pad, window.dilate,
                         window.groups);
  }
  static std::int64_t multiply_adds(std::span<const Tensor> in, const Tensor& out) {
    return out.size() * hybra::detail::nn::per_filter(in[1]);
  }
  static std::optional<jit::CudaLaunch> cuda_launch(std::span<const Tensor> in, const Tensor&, const graph::Attrs& a,
                                                    backend::cuda::Gpu& gpu) {
    const auto window = hybra::detail::nn::ConvWindow::read(a, name);
    return hybra::detail::nn::cuda_conv2d_launch(in, window.stride, window.pad, window.dilate, window.groups, gpu);
  }
  template <class G>
  static auto gradient(const G& g) {
    auto r = g.grads();
    r.resize(g.in.size());
    if (g.wanted[0]) r[0] = g.make("conv2d_backward_data", g.with_shape(g.attrs, g.shape(0)), {g.dy, g.in[1]});
    if (g.wanted[1]) r[1] = g.make("conv2d_backward_weight", g.with_shape(g.attrs, g.shape(1)), {g.dy, g.in[0]});
    if (g.in.size() == 3 && g.wanted[2]) r[2] = g.sum(g.dy, std::vector<std::int64_t>{0, 2, 3}, false);
    return r;
  }
  static constexpr std::array<std::string_view, 1> mxnet{"Convolution"};
  template <class W> static auto write(const W& w) { return hybra::detail::nn::write_nchw(w, "Convolution"); }
  template <class R>
  static auto read(const R& r) {
    const bool no_bias = r.flag("no_bias", false);
    r.arity(no_bias ? 2 : 3, no_bias ? 2 : 3);
    r.layout_nchw();
    if (!r.tuple("kernel")) r.reject("attr 'kernel' is missing");
    return r.make("conv2d", {{"kernel", r.window("kernel", 1)},
                             {"stride", r.window("stride", 1)},
                             {"pad", r.window("pad", 0)},
                             {"dilate", r.window("dilate", 1)},
                             {"num_group", graph::attr_text(r.integer("num_group", 1))},
                             {"num_filter", graph::attr_text(r.integer("num_filter", 0))},
                             {"no_bias", graph::attr_text(no_bias)}});
  }
};

struct pool2d {
  static constexpr std::string_view name = "pool2d";
  static Tensor eval(std::span<const Tensor> in, const graph::Attrs& a) {
    const auto p = hybra::detail::nn::PoolWindow::read(a, name);
    if (p.global) return p.max ? hybra::global_max_pool2d(in[0]) : hybra::global_avg_pool2d(in[0]);
    if (p.max) return hybra::max_pool2d(in[0], p.kernel, p.stride, p.pad, p.convention);
    return hybra::avg_pool2d(in[0], p.kernel, p.stride, p.pad, p.count_include_pad, p.convention);
  }
  static std::optional<jit::CudaLaunch> cuda_launch(std::span<const Tensor> in, const Tensor&, const graph::Attrs& a,
                                                    backend::cuda::Gpu& gpu) {
    const auto p = hybra::detail::nn::PoolWindow::read(a, name);
    return hybra::detail::nn::cuda_pool2d_launch(in[0], p.max, p.global, p.kernel, p.stride, p.pad, p.count_include_pad,
                                          p.convention, gpu);
  }
  template <class G> static auto gradient(const G& g) {
    return g.grads(g.make("pool2d_backward", g.attrs, {g.dy, g.in[0]}));
  }
  static constexpr std::array<std::string_view, 1> mxnet{"Pooling"};
  template <class W> static auto write(const W& w) { return hybra::detail::nn::write_nchw(w, "Pooling"); }
  template <class R>
  static auto read(const R& r) {
    r.arity(1, 1);
    r.layout_nchw();
    const bool global = r.flag("global_pool", false);
    const std::string type = r.attr("pool_type").value_or("max");
    if (type != "max" && type != "avg") r.reject("pool_type '" + type + "' is not supported (max or avg)");
    const std::string convention = r.attr("pooling_convention").value_or("valid");
    if (convention != "valid" && convention != "full")
      r.reject("pooling_convention '" + convention + "' is not supported (valid or full)");
    if (!global && !r.tuple("kernel")) r.reject("attr 'kernel' is missing");
    return r.make("pool2d", {{"kernel", r.window("kernel", 1)},
                             {"stride", r.window("stride", 1)},
                             {"pad", r.window("pad", 0)},
                             {"pool_type", type},
                             {"global_pool", graph::attr_text(global)},
                             {"count_include_pad", graph::attr_text(r.flag("count_include_pad", true))},
                             {"pooling_convention", global ? "valid" : convention}});
  }
};

// (x, gamma, beta, running_mean, running_var).
struct batch_norm {
  static constexpr std::string_view name = "batch_norm";
  static constexpr int arity = 5;
  static Tensor eval(std::span<const Tensor> in, const graph::Attrs& a) {
    return hybra::batch_norm(in[0], in[1], in[2], in[3], in[4], graph::double_attr(a, "eps", name),
                             graph::int_attr(a, "axis", name));
  }
  static std::optional<jit::CudaLaunch> cuda_launch(std::span<const Tensor> in, const Tensor&, const graph::Attrs& a,
                                                    backend::cuda::Gpu& gpu) {
    return hybra::detail::nn::cuda_batch_norm_launch(in, graph::double_attr(a, "eps", name), graph::int_attr(a, "axis", name),
                                              gpu);
  }
  // The inference form: the running statistics are constants of the forward
  // (auxiliary states), so only x, gamma and beta get gradients.
  template <class G>
  static auto gradient(const G& g) {
    const Shape& x = g.shape(0);
    const auto axis = static_cast<std::size_t>(normalize_axis(g.int_attr("axis"), x.size(), "gradient"));
    const double eps = graph::double_attr(g.attrs, "eps", "gradient");
    Shape channel(x.size(), 1);
    channel[axis] = x[axis];
    std::vector<std::int64_t> others;
    for (std::size_t d = 0; d < x.size(); ++d)
      if (d != axis) others.push_back(static_cast<std::int64_t>(d));
    auto rstd = g.reshape(g.sym(1 / g.sqrt(g.in[4] + eps)), channel);
    auto r = g.grads();
    r.resize(5);
    if (g.wanted[0]) r[0] = g.sym(g.dy * g.reshape(g.in[1], channel) * rstd);
    if (g.wanted[1]) r[1] = g.sum(g.sym(g.dy * (g.in[0] - g.reshape(g.in[3], channel)) * rstd), others, false);
    if (g.wanted[2]) r[2] = g.sum(g.dy, others, false);
    return r;
  }
  static constexpr std::array<std::string_view, 1> mxnet{"BatchNorm"};
  template <class W>
  static auto write(const W& w) {
    auto out = w.keep_all("BatchNorm", {{"eps", w.attr("eps")},
                                        {"axis", w.attr("axis")},
                                        {"momentum", "0.9"},
                                        {"fix_gamma", "False"},
                                        {"use_global_stats", "False"}});
    out.outputs = 3;  // MXNet's BatchNorm also outputs the batch mean and variance
    out.aux = {3, 4};
    return out;
  }
  template <class R>
  static auto read(const R& r) {
    r.arity(5, 5);
    if (r.flag("output_mean_var", false)) r.reject("output_mean_var=True is not supported");
    // Training with the running statistics instead of the batch's.
    if (r.flag("use_global_stats", false)) r.reject("use_global_stats=True is not supported");
    // How a training step would update the running statistics: not part of the graph.
    r.attr("momentum");
    auto in = r.operands();
    if (r.flag("fix_gamma", true)) {
      if (!in[1].has_shape()) r.reject("fix_gamma=True needs the shape of gamma (give the parameter file)");
      in[1] = r.constant(ones(in[1].shape(), in[1].dtype()));
    }
    return r.make("batch_norm", {{"eps", graph::attr_text(r.real("eps", 1e-3))}, {"axis", graph::attr_text(r.integer("axis", 1))}},
                  std::move(in));
  }
};

}  // namespace op

}  // namespace hybra
