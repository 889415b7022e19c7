#pragma once
// Containers and basic layers, as Gluon's nn.
#include <cmath>
#include <string>
#include <utility>

#include "../ops/nn.hpp"
#include "block.hpp"

namespace hybra::nn {

namespace detail {
template <class B>
void check_hybrid() {
  static_assert(std::is_base_of_v<HybridBase, std::remove_cvref_t<typename B::element_type>>,
                "hybra: a HybridSequential or HybridConcurrent holds HybridBlocks only (its graph is captured "
                "whole); put a plain nn::Block in an nn::Sequential, where it runs eagerly");
}
template <class B>
auto shared(B&& b) {
  if constexpr (requires { typename std::remove_cvref_t<B>::element_type; }) {
    return std::shared_ptr<typename std::remove_cvref_t<B>::element_type>(b);
  } else {
    static_assert(!std::is_lvalue_reference_v<B>,
                  "hybra: blocks are not copied; add a block by value (std::move) or as a std::shared_ptr");
    return std::make_shared<std::remove_cvref_t<B>>(static_cast<B&&>(b));
  }
}
}  // namespace detail

// Children run one after another, eagerly; hybridize() hybridizes the
// HybridBlocks among them.
class Sequential : public Block {
 public:
  Sequential() : Block("sequential") {}
  template <class... B>
  Sequential& add(B&&... blocks) {
    (register_child(detail::shared(static_cast<B&&>(blocks))), ...);
    return *this;
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = x;
    for (const auto& c : children()) y = (*c)(y);
    return y;
  }
};

// The add() of the hybrid containers: children by value or shared_ptr, HybridBlocks only.
template <class Derived>
class HybridContainer : public HybridBlock<Derived> {
 public:
  using HybridBlock<Derived>::HybridBlock;
  template <class... B>
  Derived& add(B&&... blocks) {
    (add_one(detail::shared(static_cast<B&&>(blocks))), ...);
    return static_cast<Derived&>(*this);
  }

 private:
  template <class P>
  void add_one(P child) {
    detail::check_hybrid<P>();
    this->register_child(std::move(child));
  }
};

// Children run one after another; hybridized, the whole chain is one graph.
class HybridSequential : public HybridContainer<HybridSequential> {
 public:
  HybridSequential() : HybridContainer("hybridsequential") {}
  template <class F>
  F hybrid_forward(const F& x) {
    F y = x;
    for (const auto& c : children()) y = (*c)(y);
    return y;
  }
};
HYBRA_SEPARABLE_CLASS(HybridBlock<HybridSequential>);

// Every child sees the same input; their outputs are concatenated along `axis`.
class HybridConcurrent : public HybridContainer<HybridConcurrent> {
 public:
  explicit HybridConcurrent(std::int64_t axis = -1) : HybridContainer("hybridconcurrent"), axis_(axis) {}
  template <class F>
  F hybrid_forward(const F& x) {
    if (children().empty()) fail<ValueError>("block '", name(), "' has no children to run");
    std::vector<F> outs;
    for (const auto& c : children()) outs.push_back((*c)(x));
    return concat(outs, axis_);
  }
  std::string settings() const override { return hybra::detail::concat("axis ", axis_); }

 private:
  std::int64_t axis_;
};
HYBRA_SEPARABLE_CLASS(HybridBlock<HybridConcurrent>);

// A fully connected layer: y = activation(x weight^T + bias), with x
// flattened to (batch, in_units), or, without `flatten`, applied to x's last
// axis alone (a (batch, tokens, in_units) input gives (batch, tokens, units)).
// in_units = 0 (the default) takes it from the first input. weight is
// (units, in_units), bias (units,), zeros at first. Its options by name, in
// Gluon's order and with Gluon's names:
//   nn::Dense({.units = 64, .activation = "gelu", .flatten = false})
class Dense : public HybridBlock<Dense> {
 public:
  struct Options {
    std::int64_t units = 0;
    std::string activation = "";
    bool use_bias = true;
    bool flatten = true;
    DType dtype = DType::float32;
    std::optional<Initializer> weight_initializer = std::nullopt;
    std::int64_t in_units = 0;
  };

  explicit Dense(Options options)
      : HybridBlock("dense"),
        units_(options.units),
        flatten_(options.flatten),
        activation_(std::move(options.activation)),
        weight_(register_parameter("weight", {options.units, options.in_units}, options.dtype,
                                   std::move(options.weight_initializer))) {
    if (options.use_bias) bias_ = register_parameter("bias", {units_}, options.dtype, init::Zero());
    if (units_ <= 0) fail<ValueError>("Dense: units must be positive, not ", units_);
    if (options.in_units < 0)
      fail<ValueError>("Dense: in_units must be positive (or 0: inferred), not ", options.in_units);
    if (!activation_.empty()) hybra::check_activation(activation_);
  }
  explicit Dense(std::int64_t units, std::string activation = "", std::int64_t in_units = 0, bool use_bias = true,
                 DType dtype = DType::float32, std::optional<Initializer> weight_initializer = std::nullopt)
      : Dense(Options{.units = units,
                      .activation = std::move(activation),
                      .use_bias = use_bias,
                      .dtype = dtype,
                      .weight_initializer = std::move(weight_initializer),
                      .in_units = in_units}) {}

  template <class F>
  F hybrid_forward(const F& x) {
    if (x.ndim() == 0) fail<ShapeError>("block '", name(), "': input of shape () has no batch axis");
    if (flatten_) return apply(x, x.shape()[0] == 0 ? 0 : x.size() / x.shape()[0]);
    const std::int64_t in = x.shape().back();
    Shape rows_by_in{1, in}, out = x.shape();
    for (std::size_t d = 0; d + 1 < out.size(); ++d) rows_by_in[0] *= out[d];
    out.back() = units_;
    return reshape(apply(reshape(x, rows_by_in), in), out);
  }

  Parameter weight() const { return weight_; }
  std::optional<Parameter> bias() const { return bias_; }
  std::string settings() const override {
    return hybra::detail::concat(detail::size_or_unknown(weight_.shape()[1]), " -> ", units_,
                                 activation_.empty() ? "" : ", " + activation_, bias_ ? "" : ", no bias",
                                 flatten_ ? "" : ", last axis");
  }

 private:
  // y = activation(x weight^T + bias) of a 2-d (or, flattened, any) x whose rows have `in` elements.
  template <class F>
  F apply(const F& x, std::int64_t in) {
    weight_.complete_shape({units_, in});
    F y = bias_ ? fully_connected(x, weight_.as<F>(), bias_->as<F>()) : fully_connected(x, weight_.as<F>());
    if (activation_.empty()) return y;
    return activation(y, activation_);
  }

  std::int64_t units_;
  bool flatten_;
  std::string activation_;
  Parameter weight_;
  std::optional<Parameter> bias_;
};
HYBRA_SEPARABLE_CLASS(HybridBlock<Dense>);

// Gluon's LayerNorm: layer_norm over `axis` of each sample, with learned
// gamma (ones at first) and beta (zeros); without `scale` or `center` they
// stay fixed (grad_req "null"), as in Gluon. in_channels = 0 (the default)
// takes the size of `axis` from the first input. Options by name:
//   nn::LayerNorm({.epsilon = 1e-6})
class LayerNorm : public HybridBlock<LayerNorm> {
 public:
  struct Options {
    std::int64_t axis = -1;
    double epsilon = 1e-5;
    bool center = true;
    bool scale = true;
    std::int64_t in_channels = 0;
    DType dtype = DType::float32;
  };

  LayerNorm() : LayerNorm(Options{}) {}
  explicit LayerNorm(Options options)
      : HybridBlock("layernorm"),
        axis_(options.axis),
        epsilon_(options.epsilon),
        gamma_(register_parameter("gamma", {options.in_channels}, options.dtype, init::One())),
        beta_(register_parameter("beta", {options.in_channels}, options.dtype, init::Zero())) {
    if (options.in_channels < 0)
      fail<ValueError>("LayerNorm: in_channels must be positive (or 0: inferred), not ", options.in_channels);
    if (!(epsilon_ > 0)) fail<ValueError>("LayerNorm: epsilon ", epsilon_, " must be positive");
    if (!options.scale) gamma_.set_grad_req("null");
    if (!options.center) beta_.set_grad_req("null");
  }

  template <class F>
  F hybrid_forward(const F& x) {
    const int a = hybra::detail::checked_axis(axis_, x.shape(), "block '" + name() + "'");
    const Shape channels{x.shape()[static_cast<std::size_t>(a)]};
    gamma_.complete_shape(channels);
    beta_.complete_shape(channels);
    return layer_norm(x, gamma_.as<F>(), beta_.as<F>(), axis_, epsilon_);
  }

  Parameter gamma() const { return gamma_; }
  Parameter beta() const { return beta_; }
  std::string settings() const override {
    return hybra::detail::concat(detail::size_or_unknown(gamma_.shape()[0]), " channels",
                                 axis_ == -1 ? "" : ", axis " + std::to_string(axis_), ", eps ", epsilon_);
  }

 private:
  std::int64_t axis_;
  double epsilon_;
  Parameter gamma_, beta_;
};
HYBRA_SEPARABLE_CLASS(HybridBlock<LayerNorm>);

// Gluon's Embedding: a (input_dim, output_dim) weight whose rows the input's
// indices pick (embedding, ops/embedding.hpp). Options by name:
//   nn::Embedding({.input_dim = 1000, .output_dim = 64})
class Embedding : public HybridBlock<Embedding> {
 public:
  struct Options {
    std::int64_t input_dim = 0;
    std::int64_t output_dim = 0;
    DType dtype = DType::float32;
    std::optional<Initializer> weight_initializer = std::nullopt;
  };

  explicit Embedding(Options options)
      : HybridBlock("embedding"),
        weight_(register_parameter("weight", {options.input_dim, options.output_dim}, options.dtype,
                                   std::move(options.weight_initializer))) {
    if (options.input_dim <= 0 || options.output_dim <= 0)
      fail<ValueError>("Embedding: input_dim and output_dim must be positive, not ", options.input_dim, " and ",
                       options.output_dim);
    if (!is_floating(options.dtype))
      fail<DTypeError>("Embedding: dtype ", hybra::name(options.dtype), " is not a float dtype");
  }

  template <class F>
  F hybrid_forward(const F& indices) {
    return embedding(indices, weight_.as<F>());
  }

  Parameter weight() const { return weight_; }
  std::string settings() const override {
    return hybra::detail::concat(weight_.shape()[0], " -> ", weight_.shape()[1]);
  }

 private:
  Parameter weight_;
};
HYBRA_SEPARABLE_CLASS(HybridBlock<Embedding>);

class Activation : public HybridBlock<Activation> {
 public:
  explicit Activation(std::string act_type) : HybridBlock(act_type), act_type_(std::move(act_type)) {
    hybra::check_activation(act_type_);
  }
  template <class F>
  F hybrid_forward(const F& x) {
    return activation(x, act_type_);
  }
  std::string settings() const override { return act_type_; }

 private:
  std::string act_type_;
};
HYBRA_SEPARABLE_CLASS(HybridBlock<Activation>);

// Gluon's activation layers with a setting, each the composition of the same
// name (expr/expression.hpp): hybridized, it fuses with the ops around it.
class LeakyReLU : public HybridBlock<LeakyReLU> {
 public:
  explicit LeakyReLU(double alpha) : HybridBlock("leakyrelu"), alpha_(alpha) {
    if (!std::isfinite(alpha)) fail<ValueError>("LeakyReLU: alpha must be a finite number, not ", alpha);
  }
  template <class F>
  F hybrid_forward(const F& x) {
    return F(leaky_relu(x, alpha_));
  }
  std::string settings() const override { return hybra::detail::concat("alpha ", alpha_); }

 private:
  double alpha_;
};
HYBRA_SEPARABLE_CLASS(HybridBlock<LeakyReLU>);

class ELU : public HybridBlock<ELU> {
 public:
  explicit ELU(double alpha = 1) : HybridBlock("elu"), alpha_(alpha) {
    if (!std::isfinite(alpha)) fail<ValueError>("ELU: alpha must be a finite number, not ", alpha);
  }
  template <class F>
  F hybrid_forward(const F& x) {
    return F(elu(x, alpha_));
  }
  std::string settings() const override { return hybra::detail::concat("alpha ", alpha_); }

 private:
  double alpha_;
};
HYBRA_SEPARABLE_CLASS(HybridBlock<ELU>);

class SELU : public HybridBlock<SELU> {
 public:
  SELU() : HybridBlock("selu") {}
  template <class F>
  F hybrid_forward(const F& x) {
    return F(selu(x));
  }
};
HYBRA_SEPARABLE_CLASS(HybridBlock<SELU>);

// approximation "erf" (exact, the default) or "tanh", as Gluon's GELU.
class GELU : public HybridBlock<GELU> {
 public:
  explicit GELU(std::string approximation = "erf") : HybridBlock("gelu"), tanh_(approximation == "tanh") {
    if (approximation != "erf" && approximation != "tanh")
      fail<ValueError>("GELU: approximation is 'erf' or 'tanh', not '", approximation, "'");
  }
  template <class F>
  F hybrid_forward(const F& x) {
    return tanh_ ? F(gelu_tanh(x)) : F(gelu(x));
  }
  std::string settings() const override { return tanh_ ? "tanh" : "erf"; }

 private:
  bool tanh_;
};
HYBRA_SEPARABLE_CLASS(HybridBlock<GELU>);

// x sigmoid(beta x); SiLU is Swish(1).
class Swish : public HybridBlock<Swish> {
 public:
  explicit Swish(double beta = 1) : HybridBlock("swish"), beta_(beta) {
    if (!std::isfinite(beta)) fail<ValueError>("Swish: beta must be a finite number, not ", beta);
  }
  template <class F>
  F hybrid_forward(const F& x) {
    return F(swish(x, beta_));
  }
  std::string settings() const override { return hybra::detail::concat("beta ", beta_); }

 private:
  double beta_;
};
HYBRA_SEPARABLE_CLASS(HybridBlock<Swish>);

class SiLU : public HybridBlock<SiLU> {
 public:
  SiLU() : HybridBlock("silu") {}
  template <class F>
  F hybrid_forward(const F& x) {
    return F(silu(x));
  }
};
HYBRA_SEPARABLE_CLASS(HybridBlock<SiLU>);

// LeakyReLU whose slope is learned: one (in_channels = 1, the default) or
// one per channel of axis 1, starting at 0.25 unless alpha_initializer says.
class PReLU : public HybridBlock<PReLU> {
 public:
  explicit PReLU(std::int64_t in_channels = 1, std::optional<Initializer> alpha_initializer = std::nullopt)
      : HybridBlock("prelu"),
        in_channels_(in_channels),
        alpha_(register_parameter("alpha", {in_channels}, DType::float32,
                                  alpha_initializer ? std::move(alpha_initializer) : init::Constant(0.25))) {
    if (in_channels < 1) fail<ValueError>("PReLU: in_channels must be positive, not ", in_channels);
  }
  template <class F>
  F hybrid_forward(const F& x) {
    F alpha = alpha_.as<F>();
    if (in_channels_ > 1) {
      if (x.ndim() < 2 || x.shape()[1] != in_channels_)
        fail<ShapeError>("block '", name(), "': input ", to_string(x.shape()), " has no axis 1 of its ", in_channels_,
                         " channels");
      Shape per_channel(static_cast<std::size_t>(x.ndim()), 1);
      per_channel[1] = in_channels_;
      alpha = reshape(alpha, per_channel);
    }
    return F(where(x > 0, x, x * alpha));
  }

  Parameter alpha() const { return alpha_; }
  std::string settings() const override {
    return in_channels_ == 1 ? "one slope" : hybra::detail::concat(in_channels_, " slopes");
  }

 private:
  std::int64_t in_channels_;
  Parameter alpha_;
};
HYBRA_SEPARABLE_CLASS(HybridBlock<PReLU>);

class Flatten : public HybridBlock<Flatten> {
 public:
  Flatten() : HybridBlock("flatten") {}
  template <class F>
  F hybrid_forward(const F& x) {
    return flatten(x);
  }
};
HYBRA_SEPARABLE_CLASS(HybridBlock<Flatten>);

// Drops elements with probability `rate` in training mode (autograd::train_mode).
class Dropout : public HybridBlock<Dropout> {
 public:
  explicit Dropout(double rate) : HybridBlock("dropout"), rate_(rate) {
    if (!(rate >= 0 && rate < 1)) fail<ValueError>("Dropout: rate ", rate, " must be in [0, 1)");
  }
  template <class F>
  F hybrid_forward(const F& x) {
    return dropout(x, rate_);
  }
  std::string settings() const override { return hybra::detail::concat("rate ", rate_); }

 private:
  double rate_;
};
HYBRA_SEPARABLE_CLASS(HybridBlock<Dropout>);

}  // namespace hybra::nn
