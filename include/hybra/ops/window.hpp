#pragma once
// 2-d windows over NCHW tensors, which conv2d, pooling, batch_norm and their
// gradients share: a window's sizes and how a pooling counts its windows,
// the geometry of a convolution or a pooling with its checks, the
// attributes that name them, and the working memory and operands of the
// ops' CPU kernels.
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

// Smallest ow >= 0 with ow * stride + offset >= 0, and the count of ow with
// ow * stride + offset < extent.
inline std::int64_t first_inside(std::int64_t offset, std::int64_t stride) {
  return offset >= 0 ? 0 : (-offset + stride - 1) / stride;
}
inline std::int64_t end_inside(std::int64_t offset, std::int64_t stride, std::int64_t extent) {
  return extent - 1 - offset < 0 ? 0 : (extent - 1 - offset) / stride + 1;
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

// How many output rows (wide) or pixels (im2col) one work item takes: as
// many as keep its working set near 256 KiB (half of L2, a quarter on the
// development machine), but no more than leave each thread an item.
inline std::int64_t band_size(std::int64_t total, std::int64_t images, std::int64_t bytes_each) {
  const std::int64_t threads = backend::cpu::available_threads();
  std::int64_t band = std::max<std::int64_t>(1, (std::int64_t{256} << 10) / std::max<std::int64_t>(1, bytes_each));
  if (images < threads) band = std::min(band, (total * images + threads - 1) / threads);
  return std::clamp<std::int64_t>(band, 1, total);
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
// dtype for all (ops/conv_cuda.hpp); none where the eager op would convert.
inline std::optional<DType> launch_dtype(std::span<const Tensor> in) {
  const DType dtype = in[0].dtype();
  for (const Tensor& t : in)
    if (t.dtype() != dtype) return std::nullopt;
  if (!is_floating(dtype)) return std::nullopt;
  return dtype;
}

}  // namespace detail::nn

// A (height, width) node attribute as MXNet writes it: "(2, 3)".
inline std::string size2d_text(Size2d s) { return op::attr_text(std::vector<std::int64_t>{s.h, s.w}); }

namespace detail::nn {
// A (height, width) attribute: "(2, 3)", or one number for both.
inline Size2d size2d_attr(const op::Attrs& a, std::string_view key, std::string_view op) {
  auto v = op::parse_tuple(op::find_attr(a, key, op), op);
  if (v.size() == 1) return Size2d(v[0]);
  if (v.size() != 2)
    fail<ValueError>(op, ": attribute ", key, " '", op::find_attr(a, key, op), "' is not a (height, width) pair");
  return Size2d(v[0], v[1]);
}

// A GEMM-like op's multiply-adds: one per weight of one filter (weights first
// by filter) for each element of `per`.
inline std::int64_t per_filter(const Tensor& w) {
  return w.ndim() ? w.size() / std::max<std::int64_t>(1, w.shape()[0]) : std::int64_t{0};
}
// Convolution and Pooling as MXNet writes them: hybra's attrs, NCHW.
template <class W>
auto write_nchw(const W& w, std::string op) {
  op::Attrs a = w.mx_attrs(w.node.attrs);
  a.emplace_back("layout", "NCHW");
  return w.keep_all(std::move(op), std::move(a));
}

}  // namespace detail::nn

}  // namespace hybra
