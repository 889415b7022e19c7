#pragma once
// conv2d's three passes on oneDNN (backend/cpu/onednn.hpp), for the float32
// convolutions where it measured faster than hybra's own kernels
// (onednn_serves; the tables are docs/benchmarks.md's "conv2d: hybra's
// kernels and oneDNN's" and "oneDNN's weights kept with their storage").
// Operands stay NCHW / OIHW in hybra's tensors: each call reorders them to
// the layouts oneDNN's kernels read, and its result back, except the forward
// pass's weights where the caller names their storage: their blocked copy is
// kept with it while they stay unchanged (core/derived_forms.hpp), so an
// inference reorders each weight once.
//
// The forward pass reads and writes NHWC, its kernels' fastest layout with
// the blocked ones (docs/benchmarks.md, "Channels last between oneDNN's
// convolutions"; wide layers on a few pixels, and spatial kernels where
// oneDNN has no AVX-512, run on the blocked layout: wide_and_small,
// blocked_below_avx512): a captured plan hands it NHWC operands (ConvLayouts) and
// keeps them so between convolutions, an eager call reorders NCHW to NHWC
// and back. Both run the same primitive, so they give the same bits; with
// oneDNN free to pick the layout its AVX2 kernels summed in another order
// for NHWC operands than for blocked ones.
//
// The gradients do not depend on the thread count, bit for bit (the contract
// of conv_backward.hpp; its tests hold this file to it). oneDNN's forward
// and data-gradient kernels compute each output on one thread, in an order
// fixed by the shapes. Its weight gradient splits the work by the thread
// count, so here it is cut into parts fixed by the shapes (images or
// filters: WeightGradientParts), each part computed on one thread.
//
// The cached primitives take their scratchpad from the caller
// (backend/cpu/onednn.hpp says why); the reorders made for one call run on
// the thread that made them and keep oneDNN's.
//
// oneDNN skips the padding rather than multiplying its zeros, so where an
// inf meets only padding, its gradient stays inf where hybra's im2col gives
// NaN (0 x inf); finite operands give the same sums up to rounding.
#include "../backend/cpu/onednn.hpp"
#ifdef HYBRA_ONEDNN_CALLS
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "../core/storage.hpp"
#include "conv_geometry.hpp"

namespace hybra::detail::nn {

// Output sizes that leave input rows or columns unread: a negative end
// padding to oneDNN, which its forward kernels take (checked against a plain
// loop on AVX-512 and AVX2: ResNet's strided 1x1 layers on even sizes); its
// gradient kernels are not given them, unchecked there.
inline bool leaves_input_unread(const Conv2dGeometry& g) {
  return (g.OH - 1) * g.sh + g.KH < g.H + g.ph || (g.OW - 1) * g.sw + g.KW < g.W + g.pw;
}

// Where oneDNN wins (docs/benchmarks.md): ungrouped, undilated convolutions
// into at least 64 filters. The forward pass needs at least 27
// multiply-adds per output value (VGG's first layer: 3 channels, 3 x 3, whose
// NHWC result a plan keeps for the pooling and the convolution after it,
// while an eager call, reordering it back to NCHW, loses time); into 32
// filters it needs 1024 (DenseNet's 3x3 layers over 128 channels). The
// gradients need a spatial kernel over at least 64 channels, and the data
// gradient, whose sums run over the filters, 128 filters. The rule reads the
// geometry alone, so that an eager op and a captured graph pick the same
// kernel for the same convolution. Where the two disagree, the plan's speed
// decides: an eager call of a 1x1 layer over 64 to 96 channels, or of a
// strided one (ResNet's downsampling, which reads a quarter of an input that
// an eager call reorders whole) over up to 512, loses to hybra's kernel,
// while a plan that keeps NHWC around it gains more (docs/benchmarks.md,
// "Channels last between oneDNN's convolutions" and "Concatenations and loops
// keep NHWC"): every 1x1 layer from 64 channels into 64 filters is oneDNN's.
inline bool onednn_serves(ConvPass pass, const Conv2dGeometry& g) {
  if (!backend::cpu::onednn::enabled()) return false;
  if (g.groups != 1 || g.dh != 1 || g.dw != 1 || g.N * g.OH * g.OW == 0) return false;
  if (pass != ConvPass::forward && leaves_input_unread(g)) return false;
  if (backend::cpu::onednn::use() == backend::cpu::onednn::Use::always) return true;
  const std::int64_t multiply_adds = g.C * g.KH * g.KW;
  if (pass == ConvPass::forward && g.F >= 32 && multiply_adds >= 1024) return true;
  if (pass == ConvPass::forward && g.KH * g.KW == 1 && g.C >= 64 && g.F >= 64) return true;
  if (g.F < 64) return false;
  switch (pass) {
    case ConvPass::forward: return multiply_adds >= 27;
    case ConvPass::backward_data: return g.KH * g.KW > 1 && g.C >= 64 && g.F >= 128;
    case ConvPass::backward_weight: return g.KH * g.KW > 1 && g.C >= 64;
  }
  return false;
}

namespace onednn_conv {

namespace cpu = backend::cpu::onednn;
using tag = dnnl::memory::format_tag;

inline dnnl::memory::dims dims(std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) { return {a, b, c, d}; }
inline dnnl::memory::desc plain(const dnnl::memory::dims& d, tag t) {
  return {d, dnnl::memory::data_type::f32, t};
}
inline dnnl::memory::desc any(const dnnl::memory::dims& d) { return plain(d, tag::any); }

// The convolution's descriptors for `images` images of g.
struct Descs {
  dnnl::memory::dims x, w, y;
  dnnl::memory::dims stride, pad_begin, pad_end;
  Descs(const Conv2dGeometry& g, std::int64_t images)
      : x(dims(images, g.C, g.H, g.W)),
        w(dims(g.F, g.C, g.KH, g.KW)),
        y(dims(images, g.F, g.OH, g.OW)),
        stride{g.sh, g.sw},
        pad_begin{g.ph, g.pw},
        // oneDNN wants the padding that makes the output size exact.
        pad_end{(g.OH - 1) * g.sh + g.KH - g.H - g.ph, (g.OW - 1) * g.sw + g.KW - g.W - g.pw} {}
  // Activations in `activations` (tag::any: oneDNN's choice), weights in oneDNN's.
  dnnl::convolution_forward::primitive_desc forward(dnnl::prop_kind kind, bool bias, tag activations) const {
    const auto b = bias ? plain({y[1]}, tag::x) : dnnl::memory::desc();
    return {{kind, dnnl::algorithm::convolution_direct, plain(x, activations), any(w), b, plain(y, activations), stride,
             pad_begin, pad_end},
            cpu::scratchpad_from_caller(), cpu::engine()};
  }
};

// A cached primitive: the pass, the geometry, the images it takes and the thread count it was made for.
using Key = std::array<std::int64_t, 19>;
inline Key key(ConvPass pass, const Conv2dGeometry& g, std::int64_t images, int threads, bool bias) {
  return {static_cast<std::int64_t>(pass), g.C, g.H, g.W, g.F, g.KH, g.KW, g.OH, g.OW, g.sh, g.sw, g.ph, g.pw,
          g.dh, g.dw, g.groups, images, threads, bias};
}

// A primitive with the layouts it reads and writes, and its scratchpad's.
struct Primitive {
  dnnl::primitive run;
  dnnl::memory::desc in0, in1, out, scratchpad;
};

inline cpu::Cache<Key, Primitive>& primitives() {
  static cpu::Cache<Key, Primitive> cache;
  return cache;
}

// Runs `p` on (in0, in1[, bias]) into out, each given in a plain layout,
// reordered where p reads or writes another.
inline void execute(const Primitive& p, int in0_arg, const dnnl::memory& in0, int in1_arg, const dnnl::memory& in1,
                    int out_arg, dnnl::memory out, const dnnl::memory* bias = nullptr) {
  dnnl::memory result = p.out == out.get_desc() ? out : cpu::thread_buffer(2, p.out);
  std::unordered_map<int, dnnl::memory> args{
      {in0_arg, cpu::in_layout(p.in0, in0, 0)}, {in1_arg, cpu::in_layout(p.in1, in1, 1)}, {out_arg, result}};
  if (bias) args.emplace(DNNL_ARG_BIAS, *bias);
  if (p.scratchpad.get_size() > 0) args.emplace(DNNL_ARG_SCRATCHPAD, cpu::thread_buffer(3, p.scratchpad));
  p.run.execute(cpu::stream(), args);
  if (result != out) dnnl::reorder(result, out).execute(cpu::stream(), result, out);
  cpu::stream().wait();
}

inline dnnl::memory wrap(const dnnl::memory::dims& d, tag t, const float* data) {
  return {plain(d, t), cpu::engine(), const_cast<float*>(data)};
}

inline tag activations(Channels c) { return c == Channels::last ? tag::nhwc : tag::nchw; }

// Whether the forward pass runs on oneDNN's blocked layout rather than NHWC,
// its operands reordered around the kernel: wide layers on at most 4 x 4
// pixels (D2L's ResNet-18 on Fashion-MNIST's last stage), where NHWC's kernel
// runs 1.6x slower (docs/benchmarks.md, "Wide layers on few pixels"), on
// oneDNN's kernel for training, which it picks for them; and, on CPUs where
// oneDNN has no AVX-512, spatial kernels over at least 16 channels, whose
// AVX2 kernel runs up to a quarter slower on NHWC than on the blocked layout
// ("Blocked convolutions below AVX-512"). The reorders cost as much as the
// input and output move, the kernel's gain grows with its multiply-adds: 1x1
// layers, and fewer than 64 filters on fewer than 28 x 28 pixels (DenseNet's
// later 3x3 layers), stay NHWC.
inline bool wide_and_small(const Conv2dGeometry& g) { return g.C >= 512 && g.OH * g.OW <= 16; }
inline bool blocked_below_avx512(const Conv2dGeometry& g) {
  return !cpu::avx512() && g.KH * g.KW > 1 && g.C >= 16 && (g.F >= 64 || g.OH * g.OW >= 28 * 28);
}

}  // namespace onednn_conv

// out (N, F, OH, OW) = conv(x, w) + b (or no bias), x and out laid out as
// `layouts` says. `weights`: the storage of w, where its blocked copy may be
// kept with it, or null.
inline void onednn_conv2d(const float* x, const float* w, const float* b, float* out, const Conv2dGeometry& g,
                          Storage* weights, ConvLayouts layouts) {
  namespace o = onednn_conv;
  const int threads = backend::cpu::available_threads();
  backend::cpu::onednn::ThreadCount scope(threads);
  backend::cpu::onednn::guarded("conv2d", [&] {
    const o::Descs d(g, g.N);
    const auto& p = o::primitives().get(o::key(ConvPass::forward, g, g.N, threads, b != nullptr), [&] {
      const auto pd = o::wide_and_small(g)         ? d.forward(dnnl::prop_kind::forward_training, b != nullptr, o::tag::any)
                      : o::blocked_below_avx512(g) ? d.forward(dnnl::prop_kind::forward_inference, b != nullptr, o::tag::any)
                                                   : d.forward(dnnl::prop_kind::forward_inference, b != nullptr, o::tag::nhwc);
      return o::Primitive{dnnl::convolution_forward(pd), pd.src_desc(), pd.weights_desc(), pd.dst_desc(),
                          pd.scratchpad_desc()};
    });
    const dnnl::memory bias = b ? o::wrap({g.F}, o::tag::x, b) : dnnl::memory();
    const auto w_in_layout = o::cpu::kept_weights(p.in1, o::wrap(d.w, o::tag::oihw, w), w, weights);
    o::execute(p, DNNL_ARG_SRC, o::wrap(d.x, o::activations(layouts.input), x), DNNL_ARG_WEIGHTS,
               w_in_layout.memory, DNNL_ARG_DST, o::wrap(d.y, o::activations(layouts.output), out),
               b ? &bias : nullptr);
  });
}

// dx (N, C, H, W) from dy (N, F, OH, OW) and w.
inline void onednn_conv2d_backward_data(const float* dy, const float* w, float* dx, const Conv2dGeometry& g) {
  namespace o = onednn_conv;
  const int threads = backend::cpu::available_threads();
  backend::cpu::onednn::ThreadCount scope(threads);
  backend::cpu::onednn::guarded("conv2d_backward_data", [&] {
    const o::Descs d(g, g.N);
    const auto& p = o::primitives().get(o::key(ConvPass::backward_data, g, g.N, threads, false), [&] {
      const auto hint = d.forward(dnnl::prop_kind::forward_training, false, o::tag::any);
      const dnnl::convolution_backward_data::primitive_desc pd(
          {dnnl::algorithm::convolution_direct, o::any(d.x), o::any(d.w), o::any(d.y), d.stride, d.pad_begin,
           d.pad_end},
          o::cpu::scratchpad_from_caller(), o::cpu::engine(), hint);
      return o::Primitive{dnnl::convolution_backward_data(pd), pd.diff_dst_desc(), pd.weights_desc(),
                          pd.diff_src_desc(), pd.scratchpad_desc()};
    });
    o::execute(p, DNNL_ARG_DIFF_DST, o::wrap(d.y, o::tag::nchw, dy), DNNL_ARG_WEIGHTS, o::wrap(d.w, o::tag::oihw, w),
               DNNL_ARG_DIFF_SRC, o::wrap(d.x, o::tag::nchw, dx));
  });
}

// How a weight gradient is cut into parts, each computed on one thread, a
// cut fixed by the shapes: by images, each part's sum into a copy of dw
// (part 0's into dw itself) and the copies added in part order; or by
// filters, in blocks of 16 (oneDNN's), each part writing its own rows of dw
// and reading the whole input. The image cut writes and adds a copy of the
// weights per part, the filter cut reads the input once per part, so the
// filters are cut where the weights are large against the images' pixels
// (ResNet's last stages: docs/benchmarks.md).
struct WeightGradientParts {
  static constexpr std::int64_t filter_block = 16;
  bool by_filters;
  std::int64_t parts = 0, base = 0, extra = 0;  // in images, or in blocks of filters
  explicit WeightGradientParts(const Conv2dGeometry& g)
      : by_filters(g.F % filter_block == 0 && g.F >= 4 * filter_block &&
                   4 * g.F * g.KH * g.KW >= g.N * g.H * g.W) {
    const std::int64_t units = by_filters ? g.F / filter_block : g.N;
    parts = std::min<std::int64_t>(units, 4);
    base = units / parts;
    extra = units % parts;
  }
  // Part s's first unit and its count: the first units % parts parts take one more.
  std::int64_t first(std::int64_t s) const { return s * base + std::min(s, extra); }
  std::int64_t count(std::int64_t s) const { return base + (s < extra ? 1 : 0); }
};

// dw (F, C, KH, KW) from dy and x, in the parts of WeightGradientParts.
inline void onednn_conv2d_backward_weight(const float* dy, const float* x, float* dw, const Conv2dGeometry& g) {
  namespace o = onednn_conv;
  const WeightGradientParts cut(g);
  const std::int64_t weights = g.F * g.C * g.KH * g.KW;
  std::vector<float> partial;
  if (!cut.by_filters)
    backend::cpu::onednn::guarded("conv2d_backward_weight", [&] {
      partial.resize(static_cast<std::size_t>((cut.parts - 1) * weights));
    });
  backend::cpu::onednn::for_each_part("conv2d_backward_weight", cut.parts, weights * g.OH * g.OW * g.N / cut.parts, [&](std::int64_t s) {
    Conv2dGeometry part = g;
    std::int64_t n0 = 0, f0 = 0;
    if (cut.by_filters) {
      f0 = cut.first(s) * cut.filter_block;
      part.F = cut.count(s) * cut.filter_block;
    } else {
      n0 = cut.first(s);
      part.N = cut.count(s);
    }
    const o::Descs d(part, part.N);
    const auto& p = o::primitives().get(o::key(ConvPass::backward_weight, part, part.N, 1, false), [&] {
      const auto hint = d.forward(dnnl::prop_kind::forward_training, false, o::tag::any);
      const dnnl::convolution_backward_weights::primitive_desc pd(
          {dnnl::algorithm::convolution_direct, o::any(d.x), o::any(d.w), o::any(d.y), d.stride, d.pad_begin,
           d.pad_end},
          o::cpu::scratchpad_from_caller(), o::cpu::engine(), hint);
      return o::Primitive{dnnl::convolution_backward_weights(pd), pd.diff_dst_desc(), pd.src_desc(),
                          pd.diff_weights_desc(), pd.scratchpad_desc()};
    });
    // The part's filters of dy: a strided view when it is not all of them.
    const dnnl::memory::desc dy_part(d.y, dnnl::memory::data_type::f32,
                                     {g.F * g.OH * g.OW, g.OH * g.OW, g.OW, 1});
    const dnnl::memory dy_memory(dy_part, o::cpu::engine(), const_cast<float*>(dy + (n0 * g.F + f0) * g.OH * g.OW));
    float* out = cut.by_filters ? dw + f0 * g.C * g.KH * g.KW : s == 0 ? dw : partial.data() + (s - 1) * weights;
    o::execute(p, DNNL_ARG_DIFF_DST, dy_memory, DNNL_ARG_SRC, o::wrap(d.x, o::tag::nchw, x + n0 * g.C * g.H * g.W),
               DNNL_ARG_DIFF_WEIGHTS, o::wrap(d.w, o::tag::oihw, out));
  });
  if (cut.by_filters) return;
  backend::cpu::parallel_for(weights, cut.parts, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t s = 1; s < cut.parts; ++s) {
      const float* add = partial.data() + (s - 1) * weights;
      for (std::int64_t i = first; i < last; ++i) dw[i] += add[i];
    }
  });
}

}  // namespace hybra::detail::nn

#endif
