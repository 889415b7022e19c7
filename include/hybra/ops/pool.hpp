#pragma once
// Max and average pooling and their global forms (MXNet's Pooling), on NCHW
// tensors of float32 or float64. Their gradient is pool_backward.hpp.
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

#include "elementwise.hpp"
#include "half.hpp"
#include "../backend/cpu/isa.hpp"
#include "../backend/cuda/launch.hpp"
#include "conv_cuda.hpp"
#include "window.hpp"

namespace hybra {

namespace detail::nn {

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

// What a pooling reduces of an input value: the value, or (Relu) its ReLU,
// which a captured plan moves from the epilogue of the product before the
// pooling into the pooling's reads (jit/plan.hpp): the same values reduced
// in the same order, without a pass over the product's result to write them.
template <bool Relu, class T>
inline T pool_input(T v) {
  if constexpr (Relu) return op::relu::apply(v);
  else return v;
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
  // load, then pool_input<Relu> of each lane (op::relu's select on v < 0, so NaN and -0 pass).
  template <bool Relu>
  static void load_input(V& v, const T* p) {
    load(v, p);
    if constexpr (Relu) v = v < V{} ? V{} : v;
  }
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

template <class T, bool Max>
constexpr T pool_identity() {
  return Max ? -std::numeric_limits<T>::infinity() : T(0);
}

// What an average divides each output by: its column's part and its row's
// part of the window, multiplied in T.
template <class T>
struct PoolDivisors {
  std::vector<T> widths, heights;
  PoolDivisors(const Pool2dGeometry& g, bool count_include_pad)
      : widths(static_cast<std::size_t>(g.OW)), heights(static_cast<std::size_t>(g.OH)) {
    for (std::int64_t ow = 0; ow < g.OW; ++ow)
      widths[static_cast<std::size_t>(ow)] =
          static_cast<T>(pool_divisor_extent(ow * g.sw - g.pw, g.KW, g.W, g.pw, count_include_pad));
    for (std::int64_t oh = 0; oh < g.OH; ++oh)
      heights[static_cast<std::size_t>(oh)] =
          static_cast<T>(pool_divisor_extent(oh * g.sh - g.ph, g.KH, g.H, g.ph, count_include_pad));
  }
  T operator()(std::int64_t oh, std::int64_t ow) const {
    return heights[static_cast<std::size_t>(oh)] * widths[static_cast<std::size_t>(ow)];
  }
};

// Max (Max = true) or average pooling of every (image, channel) plane, in
// two passes, since both reductions separate: down the window's rows into
// a buffer of padded rows (Wp = W + 2 pw wide, the padding holding the
// reduction's identity, with room past the end for pool_columns' reads),
// then along its columns, with no bounds to check. When the windows tile
// the padded rows exactly (Wp == OW sw, as 2x2 windows with stride 2 on an
// even width) the second pass runs over the whole plane at once. Relu:
// each input value is read as pool_input<true> of it.
template <class T, bool Max, bool Relu = false>
void pool2d(const T* x, T* out, const Pool2dGeometry& g, bool count_include_pad) {
  const std::int64_t planes = g.N * g.C, P = g.OH * g.OW;
  // A `full` pooling's last window may run past the right padding.
  const std::int64_t Wp = std::max(g.W + 2 * g.pw, (g.OW - 1) * g.sw + g.KW);
  if (planes == 0 || P == 0) return;
  const T identity = pool_identity<T, Max>();
  const bool flat = Wp == g.OW * g.sw;
  const PoolDivisors<T> divisors(g, count_include_pad);
  const auto& widths = divisors.widths;
  const auto& heights = divisors.heights;
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
              B::template load_input<Relu>(acc, src + w);
              for (std::int64_t r = 1; r < height; ++r) {
                B::template load_input<Relu>(v, src + r * g.W + w);
                B::template combine<Max>(acc, v);
              }
              B::store(dst + w, acc);
            },
            [&](std::int64_t w) {
              T acc = pool_input<Relu>(src[w]);
              for (std::int64_t r = 1; r < height; ++r) acc = pool_op<T, Max>(acc, pool_input<Relu>(src[r * g.W + w]));
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

// pool2d_nhwc for windows that do not overlap: each window's columns reduced
// down its rows straight from x, in pool2d's order, the column after the
// first through a buffer of C values.
template <class T, bool Max, bool Relu>
void pool2d_nhwc_in_place(const T* x, T* out, const Pool2dGeometry& g, const PoolDivisors<T>& divisors) {
  const std::int64_t C = g.C, row_size = g.W * C;
  const T identity = pool_identity<T, Max>();
  std::atomic<bool> failed{false};
  backend::cpu::parallel_for(g.N * g.OH, g.OW * C * g.KH * g.KW, [&](std::int64_t first, std::int64_t last) {
    ThreadBuffer<T> buffer(C, failed);
    if (!buffer.get()) return;
    T* column_sum = buffer.get();
    for (std::int64_t row = first; row < last; ++row) {
      const std::int64_t n = row / g.OH, oh = row % g.OH, top = oh * g.sh - g.ph;
      const std::int64_t r0 = std::max<std::int64_t>(0, top), height = std::min(g.H, top + g.KH) - r0;
      const T* top_row = x + (n * g.H + r0) * row_size;
      T* dst_row = out + row * g.OW * C;
      for (std::int64_t ow = 0; ow < g.OW; ++ow) {
        T* dst = dst_row + ow * C;
        for (std::int64_t kw = 0; kw < g.KW; ++kw) {
          const std::int64_t w = ow * g.sw - g.pw + kw;
          T* sum = kw == 0 ? dst : column_sum;
          if (w < 0 || w >= g.W) {
            std::fill_n(sum, C, identity);
          } else {
            const T* column = top_row + w * C;
#pragma omp simd
            for (std::int64_t c = 0; c < C; ++c) sum[c] = pool_input<Relu>(column[c]);
            for (std::int64_t r = 1; r < height; ++r) {
              const T* src = column + r * row_size;
#pragma omp simd
              for (std::int64_t c = 0; c < C; ++c) sum[c] = pool_op<T, Max>(sum[c], pool_input<Relu>(src[c]));
            }
          }
          if (kw == 0) continue;
#pragma omp simd
          for (std::int64_t c = 0; c < C; ++c) dst[c] = pool_op<T, Max>(dst[c], sum[c]);
        }
        if constexpr (!Max) {
          const T divisor = divisors(oh, ow);
#pragma omp simd
          for (std::int64_t c = 0; c < C; ++c) dst[c] /= divisor;
        }
      }
    }
  });
  check_buffers(failed, Max ? "max_pool2d" : "avg_pool2d");
}

// pool2d on NHWC operands: x (N, H, W, C) into out (N, OH, OW, C), for the
// values a captured plan keeps NHWC between oneDNN's convolutions
// (jit/channels_last.hpp). Each output is reduced as pool2d reduces it: down
// the window's rows that hold input, then along its columns in order, a
// column in the padding being the identity, and an average divided by
// PoolDivisors; so both give the same bits. The channels are the vector.
// Windows that overlap (ResNet's 3x3 at stride 2) share columns, which a
// buffer of the rows' reductions down the window computes once; windows
// that do not (VGG's and DenseNet's 2x2 at stride 2) are reduced from the
// input where it lies, as the buffer would only add a pass over every row
// (docs/benchmarks.md, "Poolings without overlap read in place"). Relu: as
// pool2d's.
template <class T, bool Max, bool Relu = false>
void pool2d_nhwc(const T* x, T* out, const Pool2dGeometry& g, bool count_include_pad) {
  const std::int64_t rows = g.N * g.OH, C = g.C, row_size = g.W * C;
  if (rows == 0 || g.OW == 0 || C == 0) return;
  const T identity = pool_identity<T, Max>();
  const PoolDivisors<T> divisors(g, count_include_pad);
  if (g.KH <= g.sh && g.KW <= g.sw) {
    pool2d_nhwc_in_place<T, Max, Relu>(x, out, g, divisors);
    return;
  }
  std::atomic<bool> failed{false};
  backend::cpu::parallel_for(rows, g.OW * C * g.KH * g.KW, [&](std::int64_t first, std::int64_t last) {
    ThreadBuffer<T> columns(row_size, failed);  // each input column's reduction down the window's rows
    if (!columns.get()) return;
    T* sums = columns.get();
    for (std::int64_t row = first; row < last; ++row) {
      const std::int64_t n = row / g.OH, oh = row % g.OH, top = oh * g.sh - g.ph;
      const std::int64_t r0 = std::max<std::int64_t>(0, top), r1 = std::min(g.H, top + g.KH);
      const T* top_row = x + (n * g.H + r0) * row_size;
#pragma omp simd
      for (std::int64_t i = 0; i < row_size; ++i) sums[i] = pool_input<Relu>(top_row[i]);
      for (std::int64_t r = r0 + 1; r < r1; ++r) {
        const T* src = x + (n * g.H + r) * row_size;
#pragma omp simd
        for (std::int64_t i = 0; i < row_size; ++i) sums[i] = pool_op<T, Max>(sums[i], pool_input<Relu>(src[i]));
      }
      T* dst_row = out + row * g.OW * C;
      for (std::int64_t ow = 0; ow < g.OW; ++ow) {
        T* dst = dst_row + ow * C;
        for (std::int64_t kw = 0; kw < g.KW; ++kw) {
          const std::int64_t w = ow * g.sw - g.pw + kw;
          const T* column = w >= 0 && w < g.W ? sums + w * C : nullptr;
          if (kw == 0) {
            if (column) std::copy_n(column, C, dst);
            else std::fill_n(dst, C, identity);
            continue;
          }
#pragma omp simd
          for (std::int64_t c = 0; c < C; ++c) dst[c] = pool_op<T, Max>(dst[c], column ? column[c] : identity);
        }
        if constexpr (!Max) {
          const T divisor = divisors(oh, ow);
#pragma omp simd
          for (std::int64_t c = 0; c < C; ++c) dst[c] /= divisor;
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

// A pooling of x (global: over each whole plane).
inline std::optional<backend::cuda::CudaLaunch> cuda_pool2d_launch(const Tensor& x, bool max, bool global,
                                                                   Size2d kernel, Size2d stride, Size2d padding,
                                                                   bool count_include_pad, PoolingConvention convention,
                                                                   backend::cuda::Gpu& gpu) {
  const auto dtype = launch_dtype(std::span(&x, 1));
  if (!dtype) return std::nullopt;
  const std::string_view op = max ? "max_pool2d" : "avg_pool2d";
  const Pool2dGeometry g = global ? pool2d_geometry(op, x.shape(), Size2d(x.shape()[2], x.shape()[3]), 1, 0)
                                  : pool2d_geometry(op, x.shape(), kernel, stride, padding, convention);
  return hybra::detail::nn::cuda_pool2d_launch(max, false, g, count_include_pad, *dtype, gpu);
}

template <bool Max>
Tensor pool2d_op(std::string_view op, Tensor x, Size2d kernel, Size2d stride, Size2d padding, bool count_include_pad,
                 PoolingConvention convention) {
  x.require(op.data());
  if (auto r = compute_in_float32(
          {x}, [&](std::span<const Tensor> f) { return pool2d_op<Max>(op, f[0], kernel, stride, padding, count_include_pad, convention); }))
    return *r;
  const Pool2dGeometry g = pool2d_geometry(op, x.shape(), kernel, stride, padding, convention);
  x = float_operands<1>(op, {x})[0];
  Tensor out({g.N, g.C, g.OH, g.OW}, x.dtype(), x.device());
  if (x.device().kind == DeviceKind::cuda) {
    backend::cuda::push_cuda_launch(op, {x}, out,
                                    hybra::detail::nn::cuda_pool2d_launch(Max, false, g, count_include_pad, x.dtype(),
                                                                          backend::cuda::gpu(x.device().id)));
    return out;
  }
  push_kernel(op, {x}, {out}, [x, out, g, count_include_pad] {
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
  if (auto r = compute_in_float32({x}, [&](std::span<const Tensor> f) { return global_pool2d_op<Max>(op, f[0]); })) return *r;
  require_4d(op, x.shape());
  if (x.shape()[2] * x.shape()[3] == 0)
    fail<ShapeError>(op, ": input of shape ", to_string(x.shape()), " has empty (height, width) planes");
  x = float_operands<1>(op, {x})[0];
  Tensor out({x.shape()[0], x.shape()[1], 1, 1}, x.dtype(), x.device());
  if (x.device().kind == DeviceKind::cuda) {
    backend::cuda::push_cuda_launch(op, {x}, out,
                          *cuda_pool2d_launch(x, Max, true, 1, 1, 0, true, PoolingConvention::valid,
                                              backend::cuda::gpu(x.device().id)));
    return out;
  }
  push_kernel(op, {x}, {out}, [x, out] {
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

}  // namespace detail::nn

// pool2d's node attributes, as MXNet's Pooling names them (read back by PoolWindow).
inline op::Attrs pool2d_attrs(std::string type, bool global, Size2d kernel, Size2d stride, Size2d padding,
                              bool count_include_pad, PoolingConvention convention) {
  return {{"kernel", size2d_text(kernel)},
          {"stride", size2d_text(stride)},
          {"pad", size2d_text(padding)},
          {"pool_type", std::move(type)},
          {"global_pool", op::attr_text(global)},
          {"count_include_pad", op::attr_text(count_include_pad)},
          {"pooling_convention", std::string(name(convention))}};
}

namespace detail::nn {
// A pool2d node's attributes (pool2d_attrs), which its gradient reads too.
// A global pool's window is its input's whole plane: kernel, stride and pad
// are not read.
struct PoolWindow {
  bool max, global;
  Size2d kernel, stride, pad;
  bool count_include_pad;
  PoolingConvention convention;
  static PoolWindow read(const op::Attrs& a, std::string_view op) {
    const std::string& type = op::find_attr(a, "pool_type", op);
    if (type != "max" && type != "avg") fail<ValueError>(op, ": pool_type '", type, "' is not max or avg");
    if (op::bool_attr(a, "global_pool", op)) return {type == "max", true, 1, 1, 0, true, PoolingConvention::valid};
    return {type == "max", false, size2d_attr(a, "kernel", op), size2d_attr(a, "stride", op), size2d_attr(a, "pad", op),
            op::bool_attr(a, "count_include_pad", op),
            parse_pooling_convention(op::find_attr(a, "pooling_convention", op), op)};
  }
};

}  // namespace detail::nn

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

namespace op {

struct pool2d {
  static constexpr std::string_view name = "pool2d";
  static Tensor eval(std::span<const Tensor> in, const op::Attrs& a) {
    const auto p = hybra::detail::nn::PoolWindow::read(a, name);
    if (p.global) return p.max ? hybra::global_max_pool2d(in[0]) : hybra::global_avg_pool2d(in[0]);
    if (p.max) return hybra::max_pool2d(in[0], p.kernel, p.stride, p.pad, p.convention);
    return hybra::avg_pool2d(in[0], p.kernel, p.stride, p.pad, p.count_include_pad, p.convention);
  }
  static std::optional<backend::cuda::CudaLaunch> cuda_launch(std::span<const Tensor> in, const Tensor&,
                                                              const op::Attrs& a, backend::cuda::Gpu& gpu) {
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
                             {"global_pool", op::attr_text(global)},
                             {"count_include_pad", op::attr_text(r.flag("count_include_pad", true))},
                             {"pooling_convention", global ? "valid" : convention}});
  }
};

}  // namespace op

}  // namespace hybra
