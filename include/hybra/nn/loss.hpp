#pragma once
// Losses, as Gluon's: each returns one value per sample (the mean over every
// axis but the batch axis 0), and works on tensors (recorded by autograd) and
// on symbols (inside a captured graph) alike.
#include <cstdint>

#include "../graph/symbol.hpp"

namespace hybra::nn {

namespace detail {

// A constant next to a value of the forward: a tensor on the value's device,
// or a constant node of the graph.
template <class F>
F constant_like(const F& like, const Tensor& value) {
  if constexpr (std::is_same_v<F, Tensor>) return value.to(like.device());
  else return sym::constant(value);
}

// The mean over every axis but axis 0, giving shape (N,).
template <class F>
F per_sample_mean(const F& v) {
  if (v.ndim() <= 1) return v;
  std::vector<std::int64_t> axes;
  for (std::int64_t d = 1; d < v.ndim(); ++d) axes.push_back(d);
  return mean(v, axes);
}

}  // namespace detail

// -log softmax(pred)[label] along `axis` (Gluon's SoftmaxCrossEntropyLoss
// with sparse_label): label holds class indices (any dtype) with pred's
// shape minus `axis`. With from_logits, pred already holds log-probabilities.
struct SoftmaxCrossEntropyLoss {
  std::int64_t axis = -1;
  bool from_logits = false;

  template <class F>
  F operator()(const F& pred, const F& label) const {
    const Shape& p = pred.shape();
    const auto a = static_cast<std::size_t>(normalize_axis(axis, p.size(), "SoftmaxCrossEntropyLoss"));
    Shape kept = p;
    kept[a] = 1;
    Shape no_axis = p;
    no_axis.erase(no_axis.begin() + static_cast<std::ptrdiff_t>(a));
    if (label.shape() != no_axis && label.shape() != kept)
      fail<ShapeError>("SoftmaxCrossEntropyLoss: label of shape ", to_string(label.shape()),
                       " does not match prediction of shape ", to_string(p), " (expected ", to_string(no_axis),
                       ": one class index per sample)");
    Shape classes_shape(p.size(), 1);
    classes_shape[a] = p[a];
    const F classes = detail::constant_like(pred, reshape(arange(0, static_cast<double>(p[a]), 1, label.dtype()), classes_shape));
    const F one_hot = F(reshape(label, kept) == classes).astype(pred.dtype());
    const F log_p = from_logits ? pred : log_softmax(pred, axis);
    return detail::per_sample_mean(F(-sum(F(log_p * one_hot), axis)));
  }
};

// (pred - label)^2 / 2, Gluon's L2Loss.
struct L2Loss {
  template <class F>
  F operator()(const F& pred, const F& label) const {
    if (pred.shape() != label.shape())
      fail<ShapeError>("L2Loss: prediction of shape ", to_string(pred.shape()), " and label of shape ",
                       to_string(label.shape()), " differ");
    const F diff = pred - label;
    return detail::per_sample_mean(F(diff * diff * 0.5));
  }
};

}  // namespace hybra::nn
