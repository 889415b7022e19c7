#pragma once
// batch_norm_training: BatchNorm's training form, x normalized by its own
// batch statistics along one axis (NCHW's channels):
//   y = (x - mean) * gamma / sqrt(var + eps) + beta,
// where mean and var, of shape (C,), are x's mean and biased variance over
// every other axis. The caller computes them (nn::BatchNorm also keeps them as
// its running statistics) and must give exactly those: the gradient is the
// closed form, which already carries their dependence on x,
//   dx = gamma / sqrt(var + eps) * (dy - sum(dy) / n - (x - mean) * sum(dy * (x - mean)) / (n (var + eps))),
// so mean and var get none of their own. Composed from mean, subtract and
// multiply, the gradient came from the rules of those ops, and a training
// step wrote two more activation-sized values per BatchNorm and read three
// more (docs/benchmarks.md, "BatchNorm's gradient in closed form").
//
// Eager, the op is the elementwise expression below; in a graph, the same
// nodes (decompose), so that its multiply-add joins the ReLU after it and the
// bits are the eager op's.
#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "batch_norm.hpp"
#include "layout.hpp"

namespace hybra {

namespace detail::nn {
// batch_norm_training's operands, checked (batch_norm.hpp's channel_axis).
inline ChannelAxis training_axis(const Shape& x, std::span<const Shape* const> params, double eps, std::int64_t axis,
                                 std::string_view what) {
  static constexpr const char* names[] = {"gamma", "beta", "mean", "var"};
  return channel_axis(x, params, names, eps, axis, what);
}
}  // namespace detail::nn

// BatchNorm's training form (above): mean and var must be x's batch
// statistics along `axis`, or the gradient is not x's.
template <tensor_like X>
Tensor batch_norm_training(X&& x, const Tensor& gamma, const Tensor& beta, const Tensor& mean, const Tensor& var,
                           double eps = 1e-5, std::int64_t axis = 1) {
  const Tensor data = eval(x);
  for (const Tensor* t : {&data, &gamma, &beta, &mean, &var}) t->require("batch_norm_training");
  const Shape* params[] = {&gamma.shape(), &beta.shape(), &mean.shape(), &var.shape()};
  const auto n = detail::nn::training_axis(data.shape(), params, eps, axis, "batch_norm_training");
  autograd::op_record rec("batch_norm_training", {data, gamma, beta, mean, var});
  const Tensor scale = reshape(gamma / sqrt(var + eps), n.channel);
  Tensor y = eval((data - reshape(mean, n.channel)) * scale + reshape(beta, n.channel));
  return rec.output(std::move(y), [&] { return batch_norm_attrs(eps, axis); });
}

namespace op {

// (x, gamma, beta, mean, var).
struct batch_norm_training {
  static constexpr std::string_view name = "batch_norm_training";
  static constexpr int arity = 5;
  static Tensor eval(std::span<const Tensor> in, const op::Attrs& a) {
    return hybra::batch_norm_training(in[0], in[1], in[2], in[3], in[4], op::double_attr(a, "eps", name),
                                      op::int_attr(a, "axis", name));
  }
  template <class C>
  static auto decompose(const C& c) {
    const Shape* params[] = {&c.shape(1), &c.shape(2), &c.shape(3), &c.shape(4)};
    const double eps = c.double_attr("eps");
    const auto n = hybra::detail::nn::training_axis(c.shape(0), params, eps, c.int_attr("axis"), name);
    auto scale = c.reshape(c.sym(c.in[1] / c.sqrt(c.in[4] + eps)), n.channel);
    return c.sym((c.in[0] - c.reshape(c.in[3], n.channel)) * scale + c.reshape(c.in[2], n.channel));
  }
  template <class G>
  static auto gradient(const G& g) {
    const Shape* params[] = {&g.shape(1), &g.shape(2), &g.shape(3), &g.shape(4)};
    const auto n =
        hybra::detail::nn::training_axis(g.shape(0), params, g.double_attr("eps"), g.int_attr("axis"), "gradient");
    const double count = static_cast<double>(n.count);
    auto rstd = g.sym(1 / g.sqrt(g.in[4] + g.double_attr("eps")));
    auto centred = g.sym(g.in[0] - g.reshape(g.in[3], n.channel));
    auto dy_sum = g.sum(g.dy, n.others, false);
    auto dy_centred_sum = g.sum(g.sym(g.dy * centred), n.others, false);
    auto r = g.grads();
    r.resize(5);
    if (g.wanted[0]) {
      auto scale = g.reshape(g.sym(g.in[1] * rstd), n.channel);
      auto shift = g.reshape(g.sym(dy_sum / count), n.channel);
      auto slope = g.reshape(g.sym(dy_centred_sum * rstd * rstd / count), n.channel);
      r[0] = g.sym((g.dy - shift - centred * slope) * scale);
    }
    if (g.wanted[1]) r[1] = g.sym(dy_centred_sum * rstd);
    if (g.wanted[2]) r[2] = dy_sum;
    return r;
  }
  // MXNet's BatchNorm computes its batch statistics itself and reads only
  // running ones: a graph captured while training has no spelling there.
  static constexpr std::array<std::string_view, 0> mxnet{};
  template <class W>
  static auto write(const W& w) -> decltype(w.keep_all("BatchNorm")) {
    fail<ValueError>("export_model: BatchNorm's training form (a graph captured while training) has no MXNet "
                     "spelling; call the block in predict mode (outside autograd::record), then export");
  }
};

}  // namespace op

}  // namespace hybra
