#pragma once
// The gradients of conv2d (autograd/gradients.hpp calls them): ops of their
// own, since neither is a composition of other ops. Each is one engine op on
// contiguous float32/float64 NCHW tensors.
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
// along pixels, so its kernel (backend/cpu/dot_product.hpp) keeps a vector of partial
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
// Where oneDNN is built in and measured faster (conv_onednn.hpp), it
// computes float32 gradients instead; their times per layer, beside the
// forward's, are in docs/benchmarks.md (bench_train).
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

#include "half.hpp"
#include "../backend/cpu/dot_product.hpp"
#include "conv.hpp"

namespace hybra {

namespace detail::nn {

inline std::int64_t round_up16(std::int64_t n) { return (n + 15) / 16 * 16; }

// A working set of about this many bytes per piece of work stays in L2.
inline constexpr std::int64_t backward_chunk_bytes = std::int64_t{1} << 20;

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
        backend::cpu::product(
            backend::cpu::Product<T>{wt.data() + grp * K * Fg, Fg, d, b_rows.data(), nullptr, col, ld, K, Fg, cols});
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
#ifdef HYBRA_ONEDNN_CALLS
  if constexpr (std::is_same_v<T, float>)
    if (onednn_serves(ConvPass::backward_data, g)) return onednn_conv2d_backward_data(dy, w, dx, g);
#endif
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
#ifdef HYBRA_ONEDNN_CALLS
  if constexpr (std::is_same_v<T, float>)
    if (onednn_serves(ConvPass::backward_weight, g)) return onednn_conv2d_backward_weight(dy, x, dw, g);
#endif
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
            backend::cpu::dot_product(backend::cpu::DotProduct<T>{a, plan.len, b, b_rows.data(), c, K, rows, K,
                                                                  plan.len, pieces, rows * plan.len, plan.b_seg});
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
inline std::optional<backend::cuda::CudaLaunch> cuda_conv2d_backward_launch(
    detail::nn::ConvPass pass, std::span<const Tensor> in, const Shape& out, Size2d stride, Size2d padding,
    Size2d dilation, std::int64_t groups, backend::cuda::Gpu& gpu) {
  const auto dtype = launch_dtype(in);
  if (!dtype) return std::nullopt;
  const bool data = pass == detail::nn::ConvPass::backward_data;
  const Conv2dGeometry g =
      conv2d_geometry(data ? out : in[1].shape(), data ? in[1].shape() : out, stride, padding, dilation, groups);
  return detail::nn::cuda_conv2d_launch(pass, g, false, *dtype, gpu);
}

}  // namespace detail::nn

// The gradient of conv2d with respect to its input, of shape x_shape.
inline Tensor conv2d_backward_data(const Tensor& dy, const Tensor& weight, const Shape& x_shape, Size2d stride,
                                   Size2d padding, Size2d dilation, std::int64_t groups) {
  namespace nn = detail::nn;
  constexpr std::string_view op = "conv2d_backward_data";
  if (auto r = detail::compute_in_float32(
          {dy, weight}, [&](std::span<const Tensor> f) { return conv2d_backward_data(f[0], f[1], x_shape, stride, padding, dilation, groups); }))
    return *r;
  const nn::Conv2dGeometry g = nn::backward_geometry(op, dy, x_shape, weight.require(op.data()).shape(), stride,
                                                     padding, dilation, groups);
  const auto operands = nn::float_operands<2>(op, {dy, weight});
  const Tensor &d = operands[0], &w = operands[1];
  Tensor dx(x_shape, d.dtype(), d.device());
  if (d.device().kind == DeviceKind::cuda) {
    backend::cuda::push_cuda_launch(op, {d, w}, dx,
                                    detail::nn::cuda_conv2d_launch(detail::nn::ConvPass::backward_data, g, false,
                                                                   d.dtype(), backend::cuda::gpu(d.device().id)));
    return dx;
  }
  push_kernel(op, {d, w}, {dx}, [d, w, dx, g] {
    dispatch(dx.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_floating_point_v<T>)
        nn::conv2d_backward_data(static_cast<const T*>(d.raw_data()), static_cast<const T*>(w.raw_data()),
                                 static_cast<T*>(dx.raw_data()), g);
    });
  }, d.size() * nn::per_filter(w));
  return dx;
}

// The gradient of conv2d with respect to its weight, of shape weight_shape.
inline Tensor conv2d_backward_weight(const Tensor& dy, const Tensor& x, const Shape& weight_shape, Size2d stride,
                                     Size2d padding, Size2d dilation, std::int64_t groups) {
  namespace nn = detail::nn;
  constexpr std::string_view op = "conv2d_backward_weight";
  if (auto r = detail::compute_in_float32(
          {dy, x}, [&](std::span<const Tensor> f) { return conv2d_backward_weight(f[0], f[1], weight_shape, stride, padding, dilation, groups); }))
    return *r;
  const nn::Conv2dGeometry g =
      nn::backward_geometry(op, dy, x.require(op.data()).shape(), weight_shape, stride, padding, dilation, groups);
  const auto operands = nn::float_operands<2>(op, {dy, x});
  const Tensor &d = operands[0], &xc = operands[1];
  Tensor dw(weight_shape, d.dtype(), d.device());
  if (d.device().kind == DeviceKind::cuda) {
    backend::cuda::push_cuda_launch(op, {d, xc}, dw,
                                    detail::nn::cuda_conv2d_launch(detail::nn::ConvPass::backward_weight, g, false,
                                                                   d.dtype(), backend::cuda::gpu(d.device().id)));
    return dw;
  }
  push_kernel(op, {d, xc}, {dw}, [d, xc, dw, g] {
    dispatch(dw.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_floating_point_v<T>)
        nn::conv2d_backward_weight(static_cast<const T*>(d.raw_data()), static_cast<const T*>(xc.raw_data()),
                                   static_cast<T*>(dw.raw_data()), g);
    });
  }, d.size() * nn::per_filter(dw));
  return dw;
}

namespace op {

// conv2d's gradients: (dy, weight) and (dy, data), with the forward conv2d's
// attributes and the shape of what they return.
struct conv2d_backward_data {
  static constexpr std::string_view name = "conv2d_backward_data";
  static constexpr int arity = 2;
  static constexpr bool gradient_only = true;
  static Tensor eval(std::span<const Tensor> in, const op::Attrs& a) {
    const auto w = hybra::detail::nn::ConvWindow::read(a, name);
    return hybra::conv2d_backward_data(in[0], in[1], op::shape_attr(a, "shape", name), w.stride, w.pad, w.dilate,
                                       w.groups);
  }
  static std::int64_t multiply_adds(std::span<const Tensor> in, const Tensor&) {
    return in[0].size() * hybra::detail::nn::per_filter(in[1]);
  }
  static std::optional<backend::cuda::CudaLaunch> cuda_launch(std::span<const Tensor> in, const Tensor& out,
                                                              const op::Attrs& a, backend::cuda::Gpu& gpu) {
    const auto w = hybra::detail::nn::ConvWindow::read(a, name);
    return hybra::detail::nn::cuda_conv2d_backward_launch(hybra::detail::nn::ConvPass::backward_data, in, out.shape(),
                                                          w.stride, w.pad, w.dilate, w.groups, gpu);
  }
};
struct conv2d_backward_weight {
  static constexpr std::string_view name = "conv2d_backward_weight";
  static constexpr int arity = 2;
  static constexpr bool gradient_only = true;
  static Tensor eval(std::span<const Tensor> in, const op::Attrs& a) {
    const auto w = hybra::detail::nn::ConvWindow::read(a, name);
    return hybra::conv2d_backward_weight(in[0], in[1], op::shape_attr(a, "shape", name), w.stride, w.pad, w.dilate,
                                         w.groups);
  }
  static std::int64_t multiply_adds(std::span<const Tensor> in, const Tensor& out) {
    return in[0].size() * hybra::detail::nn::per_filter(out);
  }
  static std::optional<backend::cuda::CudaLaunch> cuda_launch(std::span<const Tensor> in, const Tensor& out,
                                                              const op::Attrs& a, backend::cuda::Gpu& gpu) {
    const auto w = hybra::detail::nn::ConvWindow::read(a, name);
    return hybra::detail::nn::cuda_conv2d_backward_launch(hybra::detail::nn::ConvPass::backward_weight, in, out.shape(),
                                                          w.stride, w.pad, w.dilate, w.groups, gpu);
  }
};


}  // namespace op

}  // namespace hybra
