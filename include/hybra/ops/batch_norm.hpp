#pragma once
// batch_norm (MXNet's BatchNorm in its inference form) on tensors of float32
// or float64, along one axis (NCHW's channels).
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
#include "../backend/cuda/launch.hpp"
#include "conv_cuda.hpp"
#include "window.hpp"

namespace hybra {

namespace detail::nn {

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

// batch_norm's operands (x, gamma, beta, running_mean, running_var), x seen
// as (outer, C, inner) around `axis`.
inline std::optional<backend::cuda::CudaLaunch> cuda_batch_norm_launch(std::span<const Tensor> in, double eps,
                                                                       std::int64_t axis, backend::cuda::Gpu& gpu) {
  const auto dtype = launch_dtype(in);
  if (!dtype) return std::nullopt;
  const Shape& shape = in[0].shape();
  const int a = hybra::detail::checked_axis(axis, shape, "batch_norm");
  std::int64_t outer = 1, inner = 1;
  for (int d = 0; d < a; ++d) outer *= shape[static_cast<std::size_t>(d)];
  for (int d = a + 1; d < static_cast<int>(shape.size()); ++d) inner *= shape[static_cast<std::size_t>(d)];
  return detail::nn::cuda_batch_norm_launch(outer, shape[static_cast<std::size_t>(a)], inner, eps, *dtype, gpu);
}

// A normalisation's operands checked against x (per-channel ones of shape
// (C,), C the size of `axis`, named by `names`), and where the channels lie.
struct ChannelAxis {
  int axis;
  Shape channel;                     // (1, ..., C, ..., 1)
  std::vector<std::int64_t> others;  // every axis but `axis`
  std::int64_t count = 1;            // elements per channel
};
inline ChannelAxis channel_axis(const Shape& x, std::span<const Shape* const> params,
                                std::span<const char* const> names, double eps, std::int64_t axis,
                                std::string_view what) {
  if (x.empty()) fail<ShapeError>(what, ": input of shape () has no channel axis");
  if (!(eps > 0)) fail<ValueError>(what, ": eps ", eps, " must be positive");
  ChannelAxis c{hybra::detail::checked_axis(axis, x, std::string(what)), Shape(x.size(), 1), {}, 1};
  const std::int64_t C = x[static_cast<std::size_t>(c.axis)];
  for (std::size_t k = 0; k < params.size(); ++k)
    if (*params[k] != Shape{C})
      fail<ShapeError>(what, ": ", names[k], " of shape ", to_string(*params[k]), " does not match input of shape ",
                       to_string(x), " (expected (", C, ",), the size of axis ", axis, ")");
  c.channel[static_cast<std::size_t>(c.axis)] = C;
  for (std::size_t d = 0; d < x.size(); ++d) {
    if (static_cast<int>(d) == c.axis) continue;
    c.others.push_back(static_cast<std::int64_t>(d));
    c.count *= x[d];
  }
  return c;
}

inline Tensor batch_norm_op(Tensor x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                            const Tensor& running_var, double eps, std::int64_t axis) {
  x.require("batch_norm");
  for (const Tensor* t : {&gamma, &beta, &running_mean, &running_var}) t->require("batch_norm");
  if (auto r = compute_in_float32(
          {x, gamma, beta, running_mean, running_var},
          [&](std::span<const Tensor> f) { return batch_norm_op(f[0], f[1], f[2], f[3], f[4], eps, axis); }, x.dtype()))
    return *r;
  const Shape* shapes[] = {&gamma.shape(), &beta.shape(), &running_mean.shape(), &running_var.shape()};
  const char* names[] = {"gamma", "beta", "running_mean", "running_var"};
  const int a = channel_axis(x.shape(), shapes, names, eps, axis, "batch_norm").axis;
  const std::int64_t C = x.shape()[static_cast<std::size_t>(a)];
  const auto operands = float_operands<5>("batch_norm", {x, gamma, beta, running_mean, running_var});
  const Tensor &xc = operands[0], &g = operands[1], &b = operands[2], &m = operands[3], &v = operands[4];
  Tensor out(xc.shape(), xc.dtype(), xc.device());
  std::int64_t outer = 1, inner = 1;
  for (int d = 0; d < a; ++d) outer *= xc.shape()[static_cast<std::size_t>(d)];
  for (int d = a + 1; d < xc.ndim(); ++d) inner *= xc.shape()[static_cast<std::size_t>(d)];
  if (xc.device().kind == DeviceKind::cuda) {
    backend::cuda::push_cuda_launch(
        "batch_norm", {xc, g, b, m, v}, out,
        detail::nn::cuda_batch_norm_launch(outer, C, inner, eps, xc.dtype(), backend::cuda::gpu(xc.device().id)));
    return out;
  }
  push_kernel("batch_norm", {xc, g, b, m, v}, {out}, [xc, g, b, m, v, out, outer, C, inner, eps] {
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

// batch_norm's node attributes, as MXNet's BatchNorm names them.
inline op::Attrs batch_norm_attrs(double eps, std::int64_t axis) {
  return {{"eps", op::attr_text(eps)}, {"axis", op::attr_text(axis)}};
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

// (x, gamma, beta, running_mean, running_var).
struct batch_norm {
  static constexpr std::string_view name = "batch_norm";
  static constexpr int arity = 5;
  static Tensor eval(std::span<const Tensor> in, const op::Attrs& a) {
    return hybra::batch_norm(in[0], in[1], in[2], in[3], in[4], op::double_attr(a, "eps", name),
                             op::int_attr(a, "axis", name));
  }
  static std::optional<backend::cuda::CudaLaunch> cuda_launch(std::span<const Tensor> in, const Tensor&,
                                                              const op::Attrs& a, backend::cuda::Gpu& gpu) {
    return hybra::detail::nn::cuda_batch_norm_launch(in, op::double_attr(a, "eps", name), op::int_attr(a, "axis", name),
                                                     gpu);
  }
  // In a graph: the kernel's own arithmetic (detail::nn::batch_norm) as
  // elementwise nodes, so that the multiply and add join the producer's
  // epilogue and the ReLU after them. Operands of mixed or 16-bit dtypes
  // keep the op, whose kernel converts them first.
  template <class C>
  static auto decompose(const C& c) {
    using S = typename C::symbol;
    const DType dtype = c.in[0].dtype();
    if (dtype != DType::float32 && dtype != DType::float64) return S();
    for (const auto& p : c.in)
      if (p.dtype() != dtype) return S();
    const Shape& x = c.shape(0);
    const auto axis = static_cast<std::size_t>(normalize_axis(c.int_attr("axis"), x.size(), name));
    Shape channel(x.size(), 1);
    channel[axis] = x[axis];
    auto scale = c.sym(c.in[1] / c.sqrt(c.in[4] + c.double_attr("eps")));
    auto shift = c.sym(c.in[2] - c.in[3] * scale);
    return c.sym(c.in[0] * c.reshape(scale, channel) + c.reshape(shift, channel));
  }
  // The inference form: the running statistics are constants of the forward
  // (auxiliary states), so only x, gamma and beta get gradients.
  template <class G>
  static auto gradient(const G& g) {
    const Shape& x = g.shape(0);
    const auto axis = static_cast<std::size_t>(normalize_axis(g.int_attr("axis"), x.size(), "gradient"));
    const double eps = g.double_attr("eps");
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
    return r.make("batch_norm",
                  {{"eps", op::attr_text(r.real("eps", 1e-3))}, {"axis", op::attr_text(r.integer("axis", 1))}},
                  std::move(in));
  }
};

}  // namespace op

}  // namespace hybra
