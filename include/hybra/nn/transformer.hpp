#pragma once
// The blocks of a transformer encoder, as PyTorch's nn.MultiheadAttention
// (self-attention) and nn.TransformerEncoderLayer, written with hybra's own
// layers and ops: Dense on the last axis, batched matmul, softmax and
// LayerNorm. They run eagerly or hybridized, train, and export as the ops
// they are made of.
//
//   nn::TransformerEncoderLayer layer({.units = 64, .heads = 4, .hidden = 256});
//   Tensor y = layer(x);   // x: (batch, tokens, units) -> the same shape
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "layers.hpp"

namespace hybra::nn {

// Self-attention with `heads` heads over a (batch, tokens, units) input:
// each head attends with queries, keys and values of units / heads features,
// softmax(q k^T / sqrt(units / heads)) v, and the heads' outputs, side by
// side, go through one more projection.
class MultiHeadAttention : public HybridBlock<MultiHeadAttention> {
 public:
  struct Options {
    std::int64_t units = 0;
    std::int64_t heads = 1;
    bool use_bias = true;
  };

  explicit MultiHeadAttention(Options options)
      : HybridBlock("multiheadattention"),
        units_(options.units),
        heads_(options.heads),
        query_(register_child(projection(options))),
        key_(register_child(projection(options))),
        value_(register_child(projection(options))),
        output_(register_child(projection(options))) {
    if (heads_ < 1 || units_ % heads_ != 0)
      fail<ValueError>("MultiHeadAttention: heads ", heads_, " must be positive and divide units (", units_, ")");
  }

  template <class F>
  F hybrid_forward(const F& x) {
    return attend<F>(x, nullptr);
  }
  // mask: (batch, tokens, tokens) or, the same for every query, (batch, 1,
  // tokens); nonzero where a query may attend to a key.
  template <class F>
  F hybrid_forward(const F& x, const F& mask) {
    return attend(x, &mask);
  }

  std::string settings() const override { return hybra::detail::concat(units_, " units, ", heads_, " heads"); }

 private:
  template <class F>
  F attend(const F& x, const F* mask) {
    if (x.ndim() != 3 || x.shape()[2] != units_)
      fail<ShapeError>("block '", name(), "': input ", to_string(x.shape()), " is not (batch, tokens, ", units_, ")");
    const std::int64_t batch = x.shape()[0], tokens = x.shape()[1], width = units_ / heads_;
    // (batch, tokens, units) -> (batch * heads, tokens, width), one matrix per head.
    auto split = [&](const F& y) {
      const F per_head = transpose(reshape(y, {batch, tokens, heads_, width}), {0, 2, 1, 3});
      return reshape(per_head, {batch * heads_, tokens, width});
    };
    const F q = split((*query_)(x)), k = split((*key_)(x)), v = split((*value_)(x));
    const F scores = F(matmul(q, transpose(k, {0, 2, 1})) * (1 / std::sqrt(static_cast<double>(width))));
    const F weights = [&]() -> F {
      if (!mask) return softmax(scores, -1);
      const Shape& m = mask->shape();
      if (m.size() != 3 || m[0] != batch || (m[1] != tokens && m[1] != 1) || m[2] != tokens)
        fail<ShapeError>("block '", name(), "': mask ", to_string(m), " for input ", to_string(x.shape()), " is not (",
                         batch, ", ", tokens, " or 1, ", tokens, ")");
      const F per_head = reshape(scores, {batch, heads_, tokens, tokens});
      return reshape(masked_softmax(per_head, reshape(*mask, {batch, 1, m[1], tokens})), scores.shape());
    }();
    const F heads = matmul(weights, v);
    const F joined = reshape(transpose(reshape(heads, {batch, heads_, tokens, width}), {0, 2, 1, 3}), x.shape());
    return (*output_)(joined);
  }

  static Dense projection(const Options& o) {
    return Dense({.units = o.units, .use_bias = o.use_bias, .flatten = false, .in_units = o.units});
  }

  std::int64_t units_, heads_;
  std::shared_ptr<Dense> query_, key_, value_, output_;
};
HYBRA_SEPARABLE_CLASS(HybridBlock<MultiHeadAttention>);

// One encoder layer: self-attention, then a two-layer feed-forward network
// (units -> hidden -> units, `activation` between), each with dropout, a
// residual connection and LayerNorm: after the residual sum (PyTorch's
// default, the original transformer's) or, with norm_first, on each
// sublayer's input.
class TransformerEncoderLayer : public HybridBlock<TransformerEncoderLayer> {
 public:
  struct Options {
    std::int64_t units = 0;
    std::int64_t heads = 1;
    std::int64_t hidden = 0;
    double dropout = 0.1;
    std::string activation = "relu";
    bool norm_first = false;
    double epsilon = 1e-5;
  };

  explicit TransformerEncoderLayer(Options o)
      : HybridBlock("transformerencoderlayer"),
        norm_first_(o.norm_first),
        attention_(register_child(MultiHeadAttention({.units = o.units, .heads = o.heads}))),
        attention_dropout_(register_child(Dropout(o.dropout))),
        norm1_(register_child(LayerNorm({.epsilon = o.epsilon, .in_channels = o.units}))),
        hidden_(register_child(
            Dense({.units = o.hidden, .activation = o.activation, .flatten = false, .in_units = o.units}))),
        hidden_dropout_(register_child(Dropout(o.dropout))),
        output_(register_child(Dense({.units = o.units, .flatten = false, .in_units = o.hidden}))),
        output_dropout_(register_child(Dropout(o.dropout))),
        norm2_(register_child(LayerNorm({.epsilon = o.epsilon, .in_channels = o.units}))) {}

  template <class F>
  F hybrid_forward(const F& x) {
    return encode(x, [&](const F& y) { return (*attention_)(y); });
  }
  // mask: as MultiHeadAttention's.
  template <class F>
  F hybrid_forward(const F& x, const F& mask) {
    return encode(x, [&](const F& y) { return (*attention_)(y, mask); });
  }

  std::string settings() const override { return norm_first_ ? "norm first" : ""; }

 private:
  template <class F, class Attention>
  F encode(const F& x, Attention attention) {
    auto attend = [&](const F& y) { return (*attention_dropout_)(attention(y)); };
    auto feed_forward = [&](const F& y) { return (*output_dropout_)((*output_)((*hidden_dropout_)((*hidden_)(y)))); };
    if (norm_first_) {
      const F y = F(x + attend((*norm1_)(x)));
      return F(y + feed_forward((*norm2_)(y)));
    }
    const F y = (*norm1_)(F(x + attend(x)));
    return (*norm2_)(F(y + feed_forward(y)));
  }

  bool norm_first_;
  std::shared_ptr<MultiHeadAttention> attention_;
  std::shared_ptr<Dropout> attention_dropout_;
  std::shared_ptr<LayerNorm> norm1_;
  std::shared_ptr<Dense> hidden_;
  std::shared_ptr<Dropout> hidden_dropout_;
  std::shared_ptr<Dense> output_;
  std::shared_ptr<Dropout> output_dropout_;
  std::shared_ptr<LayerNorm> norm2_;
};
HYBRA_SEPARABLE_CLASS(HybridBlock<TransformerEncoderLayer>);

}  // namespace hybra::nn
