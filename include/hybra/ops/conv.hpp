#pragma once
// conv2d (MXNet's Convolution) on NCHW tensors of float32 or float64. Pooling
// is pool.hpp, batch_norm batch_norm.hpp, the gradients conv_backward.hpp.
//
// conv2d multiplies the filters (F x K, K = channels per group x kernel
// area) by a K x P matrix of the input's windows (P = output pixels), per
// image or band of output rows of one. With stride 1 that matrix is the
// zero-padded input rows themselves, read from an offset per kernel tap
// (conv2d_wide); other strides copy the windows out first (im2col). The
// product is hybra's own kernel (backend/cpu/product.hpp), not OpenBLAS's
// GEMM: F is small in the layers it serves (6 and 16 in LeNet-5), where a
// GEMM packs its operands for little reuse, and OpenBLAS 0.3.21 takes the
// development machine for a Prescott (SSE3 kernels, backend/cpu/gemv.hpp):
// that product beat im2col with OpenBLAS's sgemm on LeNet's layers and on a
// ResNet 3x3 layer (docs/benchmarks.md, "Figures behind constants of the code").
// Where oneDNN is built in and measured faster (conv_onednn.hpp: the wider
// layers of ResNets), it computes float32 convolutions instead.
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

#include "half.hpp"
#include "../backend/cpu/product.hpp"
#include "../backend/cuda/launch.hpp"
#include "conv_cuda.hpp"
#include "conv_onednn.hpp"
#include "window.hpp"

namespace hybra {

namespace detail::nn {

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
        backend::cpu::product(backend::cpu::Product<T>{w + grp * Fg * K, K, input, b_rows.data(),
                                                       b ? b + grp * Fg : nullptr, wide, ld, Fg, K, count * Wp});
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
        backend::cpu::product(backend::cpu::Product<T>{w + grp * Fg * K, K, col, b_rows.data(),
                                                       b ? b + grp * Fg : nullptr, out + (n * g.F + grp * Fg) * P + p0,
                                                       P, Fg, K, cols});
      }
    }
  });
  check_buffers(failed, "conv2d");
}

// Whether conv2d computes this convolution of T on oneDNN, which also takes
// NHWC operands (ConvLayouts). None does in builds without oneDNN.
template <class T>
bool conv2d_on_onednn([[maybe_unused]] const Conv2dGeometry& g) {
#ifdef HYBRA_ONEDNN_CALLS
  if constexpr (std::is_same_v<T, float>) return g.C * g.KH * g.KW > 0 && onednn_serves(ConvPass::forward, g);
#endif
  return false;
}

// out (N, F, OH, OW) = conv(x (N, C, H, W), w (F, C / groups, KH, KW)) + b
// (F, or null); all contiguous. The convolution's kernel, shared by the
// eager op and captured graphs so that both give the same bits. Work is
// split over images, and an image over bands of output rows or pixels when
// the images are fewer than the threads or an image's working set would
// not stay in L2. `weights`: w's storage where a layout derived from w may
// be kept with it (a tensor the caller holds, not a scratch buffer that
// other values reuse), or null. x and out may be NHWC (`layouts`) where
// conv2d_on_onednn<T>(g).
template <class T>
void conv2d(const T* x, const T* w, const T* b, T* out, const Conv2dGeometry& g,
            [[maybe_unused]] Storage* weights = nullptr, ConvLayouts layouts = {}) {
  const std::int64_t P = g.OH * g.OW, K = g.C / g.groups * g.KH * g.KW;
  if (g.N == 0 || g.F == 0 || P == 0) return;
#ifdef HYBRA_ONEDNN_CALLS
  if constexpr (std::is_same_v<T, float>)
    if (conv2d_on_onednn<T>(g)) return onednn_conv2d(x, w, b, out, g, weights, layouts);
#endif
  if (layouts.input != Channels::first || layouts.output != Channels::first)
    fail<Error>("conv2d: NHWC operands for a convolution of ", g.C, " channels into ", g.F, " filters of ", g.KH, 'x',
                g.KW, " that oneDNN does not compute; only its kernels read them");
  if (K == 0) {
    for (std::int64_t i = 0; i < g.N * g.F; ++i) std::fill_n(out + i * P, P, b ? b[i % g.F] : T(0));
    return;
  }
  if (g.sh == 1 && g.sw == 1) conv2d_wide(x, w, b, out, g);
  else conv2d_im2col(x, w, b, out, g);
}

// The ops' launches on a GPU for operands laid out as `in` (a captured
// plan's, graph::OpDef::cuda_launch); nullopt where the eager op must run.
// conv2d's operands are (x, w) or (x, w, bias).
inline std::optional<backend::cuda::CudaLaunch> cuda_conv2d_launch(std::span<const Tensor> in, Size2d stride,
                                                                   Size2d padding, Size2d dilation, std::int64_t groups,
                                                                   backend::cuda::Gpu& gpu) {
  const auto dtype = launch_dtype(in);
  if (!dtype) return std::nullopt;
  const Conv2dGeometry g = conv2d_geometry(in[0].shape(), in[1].shape(), stride, padding, dilation, groups);
  return detail::nn::cuda_conv2d_launch(detail::nn::ConvPass::forward, g, in.size() == 3, *dtype, gpu);
}

inline Tensor conv2d_op(Tensor x, const Tensor& weight, const Tensor& bias, Size2d stride, Size2d padding,
                        Size2d dilation, std::int64_t groups) {
  x.require("conv2d");
  weight.require("conv2d");
  if (auto r = compute_in_float32({x, weight, bias}, [&](std::span<const Tensor> f) { return conv2d_op(f[0], f[1], f[2], stride, padding, dilation, groups); }))
    return *r;
  const Conv2dGeometry g = conv2d_geometry(x.shape(), weight.shape(), stride, padding, dilation, groups);
  if (bias.defined() && (bias.ndim() != 1 || bias.shape()[0] != g.F))
    fail<ShapeError>("conv2d: bias of shape ", to_string(bias.shape()), " does not match weight of shape ",
                     to_string(weight.shape()), " (expected (", g.F, ",))");
  const auto operands = float_operands<3>("conv2d", {x, weight, bias});
  const Tensor &xc = operands[0], &w = operands[1], &b = operands[2];
  Tensor out({g.N, g.F, g.OH, g.OW}, xc.dtype(), xc.device());
  if (xc.device().kind == DeviceKind::cuda) {
    backend::cuda::push_cuda_launch("conv2d", b.defined() ? std::vector<Tensor>{xc, w, b} : std::vector<Tensor>{xc, w},
                                    out,
                                    detail::nn::cuda_conv2d_launch(detail::nn::ConvPass::forward, g, b.defined(),
                                                                   xc.dtype(), backend::cuda::gpu(xc.device().id)));
    return out;
  }
  push_kernel("conv2d", {xc, w, b.defined() ? b : w}, {out}, [xc, w, b, out, g] {
    dispatch(out.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_floating_point_v<T>)
        conv2d(static_cast<const T*>(xc.raw_data()), static_cast<const T*>(w.raw_data()), data_or_null<T>(b),
               static_cast<T*>(out.raw_data()), g, w.storage().get());
    });
  }, out.size() * per_filter(w));
  return out;
}

}  // namespace detail::nn

// conv2d's node attributes, as MXNet's Convolution names them (read back by ConvWindow).
inline op::Attrs conv2d_attrs(const Shape& weight, Size2d stride, Size2d padding, Size2d dilation, std::int64_t groups,
                              bool has_bias) {
  if (weight.size() != 4)
    fail<ShapeError>("conv2d: weight of shape ", to_string(weight),
                     " is not 4-d (filters, channels / groups, kernel height, kernel width)");
  return {{"kernel", size2d_text(Size2d(weight[2], weight[3]))},
          {"stride", size2d_text(stride)},
          {"pad", size2d_text(padding)},
          {"dilate", size2d_text(dilation)},
          {"num_group", op::attr_text(groups)},
          {"num_filter", op::attr_text(weight[0])},
          {"no_bias", op::attr_text(!has_bias)}};
}

namespace detail::nn {
// A conv2d node's window (conv2d_attrs), which its gradients and the plan read too.
struct ConvWindow {
  Size2d stride, pad, dilate;
  std::int64_t groups;
  static ConvWindow read(const op::Attrs& a, std::string_view op) {
    return {size2d_attr(a, "stride", op), size2d_attr(a, "pad", op), size2d_attr(a, "dilate", op),
            op::int_attr(a, "num_group", op)};
  }
};

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

namespace op {

// (data, weight) with no_bias, or (data, weight, bias). kernel, num_filter
// and no_bias restate the weight's and bias's shapes (MXNet's Convolution
// needs them).
struct conv2d {
  static constexpr std::string_view name = "conv2d";
  static constexpr int arity = -1;
  static constexpr bool product = true;
  static Tensor eval(std::span<const Tensor> in, const op::Attrs& a) {
    const bool no_bias = op::bool_attr(a, "no_bias", name);
    if (in.size() != (no_bias ? 2u : 3u))
      fail<ValueError>("conv2d: takes ", no_bias ? "(data, weight) with no_bias" : "(data, weight, bias)", ", not ",
                       in.size(), " inputs");
    const Size2d kernel = hybra::detail::nn::size2d_attr(a, "kernel", name);
    const std::int64_t filters = op::int_attr(a, "num_filter", name);
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
  static std::optional<backend::cuda::CudaLaunch> cuda_launch(std::span<const Tensor> in, const Tensor&,
                                                              const op::Attrs& a, backend::cuda::Gpu& gpu) {
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
                             {"num_group", op::attr_text(r.integer("num_group", 1))},
                             {"num_filter", op::attr_text(r.integer("num_filter", 0))},
                             {"no_bias", op::attr_text(no_bias)}});
  }
};

}  // namespace op

}  // namespace hybra
