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
// flattened to (batch, in_units). in_units = 0 (the default) takes it from
// the first input. weight is (units, in_units), bias (units,), zeros at first.
class Dense : public HybridBlock<Dense> {
 public:
  explicit Dense(std::int64_t units, std::string activation = "", std::int64_t in_units = 0, bool use_bias = true,
                 DType dtype = DType::float32, std::optional<Initializer> weight_initializer = std::nullopt)
      : HybridBlock("dense"),
        units_(units),
        activation_(std::move(activation)),
        weight_(register_parameter("weight", {units, in_units}, dtype, std::move(weight_initializer))) {
    if (use_bias) bias_ = register_parameter("bias", {units}, dtype, init::Zero());
    if (units <= 0) fail<ValueError>("Dense: units must be positive, not ", units);
    if (in_units < 0) fail<ValueError>("Dense: in_units must be positive (or 0: inferred), not ", in_units);
    if (!activation_.empty()) hybra::check_activation(activation_);
  }

  template <class F>
  F hybrid_forward(const F& x) {
    if (x.ndim() == 0) fail<ShapeError>("block '", name(), "': input of shape () has no batch axis");
    weight_.complete_shape({units_, x.shape()[0] == 0 ? 0 : x.size() / x.shape()[0]});
    F y = bias_ ? fully_connected(x, weight_.as<F>(), bias_->as<F>()) : fully_connected(x, weight_.as<F>());
    if (activation_.empty()) return y;
    return activation(y, activation_);
  }

  Parameter weight() const { return weight_; }
  std::optional<Parameter> bias() const { return bias_; }
  std::string settings() const override {
    return hybra::detail::concat(detail::size_or_unknown(weight_.shape()[1]), " -> ", units_,
                                 activation_.empty() ? "" : ", " + activation_, bias_ ? "" : ", no bias");
  }

 private:
  std::int64_t units_;
  std::string activation_;
  Parameter weight_;
  std::optional<Parameter> bias_;
};
HYBRA_SEPARABLE_CLASS(HybridBlock<Dense>);

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
