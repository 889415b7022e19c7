#pragma once
// Convolutional layers, as Gluon 1.x's nn (NCHW): Conv2D, the pooling layers
// and BatchNorm. Sizes (kernel, strides, padding, dilation) take one integer
// for both dims or a {height, width} pair. Prefixes are Gluon's: conv<n>_,
// pool<n>_ for every pooling layer, batchnorm<n>_.
#include <optional>
#include <string>
#include <utility>

#include "../ops/batch_norm_training.hpp"
#include "../ops/conv.hpp"
#include "../ops/pool.hpp"
#include "block.hpp"

namespace hybra::nn {

// A 2-d convolution: y = activation(conv2d(x, weight) + bias). weight is
// (channels, in_channels / groups, kernel height, kernel width), bias
// (channels,), zeros at first. in_channels = 0 (the default) takes it from
// the first input. Options by name, as Gluon's keywords:
//   nn::Conv2D({.channels = 64, .kernel_size = 3, .padding = 1, .activation = "relu"})
class Conv2D : public HybridBlock<Conv2D> {
 public:
  struct Options {
    std::int64_t channels = 0;
    Size2d kernel_size = 0;
    Size2d strides = 1;
    Size2d padding = 0;
    Size2d dilation = 1;
    std::int64_t groups = 1;
    std::string activation = "";
    bool use_bias = true;
    std::optional<Initializer> weight_initializer = std::nullopt;
    std::int64_t in_channels = 0;
    DType dtype = DType::float32;
  };

  explicit Conv2D(Options o)
      : HybridBlock("conv"),
        channels_(o.channels),
        kernel_(o.kernel_size),
        strides_(o.strides),
        padding_(o.padding),
        dilation_(o.dilation),
        groups_(o.groups),
        activation_(std::move(o.activation)),
        weight_(register_parameter("weight",
                                   {o.channels, o.groups > 0 ? o.in_channels / o.groups : 0, o.kernel_size.h,
                                    o.kernel_size.w},
                                   o.dtype, std::move(o.weight_initializer))) {
    if (o.use_bias) bias_ = register_parameter("bias", {o.channels}, o.dtype, init::Zero());
    if (o.channels <= 0) fail<ValueError>("Conv2D: channels must be positive, not ", o.channels);
    if (o.kernel_size.h < 1 || o.kernel_size.w < 1)
      fail<ValueError>("Conv2D: kernel_size ", o.kernel_size, " must be positive");
    hybra::detail::nn::require_window("Conv2D", o.strides, o.padding, o.dilation);
    if (o.groups < 1 || o.channels % o.groups != 0)
      fail<ValueError>("Conv2D: groups ", o.groups, " must be positive and divide channels (", o.channels, ")");
    if (o.in_channels < 0 || o.in_channels % o.groups != 0)
      fail<ValueError>("Conv2D: in_channels ", o.in_channels, " must be a multiple of groups (", o.groups,
                       "), or 0: inferred");
    if (!activation_.empty()) hybra::check_activation(activation_);
  }
  Conv2D(std::int64_t channels, Size2d kernel_size, Size2d strides = 1, Size2d padding = 0, Size2d dilation = 1,
         std::int64_t groups = 1, std::string activation = "", bool use_bias = true, std::int64_t in_channels = 0,
         DType dtype = DType::float32, std::optional<Initializer> weight_initializer = std::nullopt)
      : Conv2D(Options{.channels = channels,
                       .kernel_size = kernel_size,
                       .strides = strides,
                       .padding = padding,
                       .dilation = dilation,
                       .groups = groups,
                       .activation = std::move(activation),
                       .use_bias = use_bias,
                       .weight_initializer = std::move(weight_initializer),
                       .in_channels = in_channels,
                       .dtype = dtype}) {}

  template <class F>
  F hybrid_forward(const F& x) {
    if (x.ndim() != 4)
      fail<ShapeError>("block '", name(), "': input of shape ", to_string(x.shape()),
                       " is not 4-d (batch, channels, height, width)");
    if (x.shape()[1] % groups_ != 0)
      fail<ShapeError>("block '", name(), "': input of shape ", to_string(x.shape()), " has ", x.shape()[1],
                       " channels, which ", groups_, " groups do not divide");
    weight_.complete_shape({channels_, x.shape()[1] / groups_, kernel_.h, kernel_.w});
    F y = conv2d(x, weight_.as<F>(), bias_ ? bias_->as<F>() : F{}, strides_, padding_, dilation_, groups_);
    if (activation_.empty()) return y;
    return activation(y, activation_);
  }

  Parameter weight() const { return weight_; }
  std::optional<Parameter> bias() const { return bias_; }
  std::string settings() const override {
    const std::int64_t in = weight_.shape()[1] * groups_;
    return hybra::detail::concat(detail::size_or_unknown(in), " -> ", channels_, ", kernel ", kernel_,
                                 strides_ == Size2d(1) ? "" : ", stride " + hybra::detail::concat(strides_),
                                 padding_ == Size2d(0) ? "" : ", padding " + hybra::detail::concat(padding_),
                                 dilation_ == Size2d(1) ? "" : ", dilation " + hybra::detail::concat(dilation_),
                                 groups_ == 1 ? "" : ", groups " + std::to_string(groups_),
                                 activation_.empty() ? "" : ", " + activation_, bias_ ? "" : ", no bias");
  }

 private:
  std::int64_t channels_;
  Size2d kernel_, strides_, padding_, dilation_;
  std::int64_t groups_;
  std::string activation_;
  Parameter weight_;
  std::optional<Parameter> bias_;
};
HYBRA_SEPARABLE_CLASS(HybridBlock<Conv2D>);

namespace detail {
// Gluon's strides=None: a stride of 0 (the default) is the pool size.
inline Size2d pool_strides(Size2d strides, Size2d pool_size) {
  return {strides.h == 0 ? pool_size.h : strides.h, strides.w == 0 ? pool_size.w : strides.w};
}
// A pooling layer's settings, as printed.
inline std::string pool_settings(Size2d pool_size, Size2d strides, Size2d padding, PoolingConvention convention) {
  return hybra::detail::concat("size ", pool_size, ", stride ", strides,
                               padding == Size2d(0) ? "" : ", padding " + hybra::detail::concat(padding),
                               convention == PoolingConvention::full ? ", ceil mode" : "");
}
}  // namespace detail

// Max over pool_size windows moved by strides (0, the default: pool_size);
// PoolingConvention::full is Gluon's ceil_mode=True, and by name
// `nn::MaxPool2D({.pool_size = 3, .strides = 2, .ceil_mode = true})`.
class MaxPool2D : public HybridBlock<MaxPool2D> {
 public:
  struct Options {
    Size2d pool_size = 2;
    Size2d strides = 0;
    Size2d padding = 0;
    bool ceil_mode = false;
  };

  explicit MaxPool2D(Options o)
      : MaxPool2D(o.pool_size, o.strides, o.padding,
                  o.ceil_mode ? PoolingConvention::full : PoolingConvention::valid) {}
  explicit MaxPool2D(Size2d pool_size = 2, Size2d strides = 0, Size2d padding = 0,
                     PoolingConvention convention = PoolingConvention::valid)
      : HybridBlock("pool"),
        pool_size_(pool_size),
        strides_(detail::pool_strides(strides, pool_size)),
        padding_(padding),
        convention_(convention) {
    hybra::detail::nn::require_pool_window("MaxPool2D", pool_size_, strides_, padding_);
  }
  template <class F>
  F hybrid_forward(const F& x) {
    return max_pool2d(x, pool_size_, strides_, padding_, convention_);
  }
  std::string settings() const override {
    return detail::pool_settings(pool_size_, strides_, padding_, convention_);
  }

 private:
  Size2d pool_size_, strides_, padding_;
  PoolingConvention convention_;
};
HYBRA_SEPARABLE_CLASS(HybridBlock<MaxPool2D>);

// Average over pool_size windows moved by strides (0, the default:
// pool_size), dividing by the whole window or, without count_include_pad,
// by the input elements in it. By name, as MaxPool2D, with `.count_include_pad`.
class AvgPool2D : public HybridBlock<AvgPool2D> {
 public:
  struct Options {
    Size2d pool_size = 2;
    Size2d strides = 0;
    Size2d padding = 0;
    bool ceil_mode = false;
    bool count_include_pad = true;
  };

  explicit AvgPool2D(Options o)
      : AvgPool2D(o.pool_size, o.strides, o.padding, o.count_include_pad,
                  o.ceil_mode ? PoolingConvention::full : PoolingConvention::valid) {}
  explicit AvgPool2D(Size2d pool_size = 2, Size2d strides = 0, Size2d padding = 0, bool count_include_pad = true,
                     PoolingConvention convention = PoolingConvention::valid)
      : HybridBlock("pool"),
        pool_size_(pool_size),
        strides_(detail::pool_strides(strides, pool_size)),
        padding_(padding),
        count_include_pad_(count_include_pad),
        convention_(convention) {
    hybra::detail::nn::require_pool_window("AvgPool2D", pool_size_, strides_, padding_);
  }
  template <class F>
  F hybrid_forward(const F& x) {
    return avg_pool2d(x, pool_size_, strides_, padding_, count_include_pad_, convention_);
  }
  std::string settings() const override {
    return detail::pool_settings(pool_size_, strides_, padding_, convention_) +
           (count_include_pad_ ? "" : ", padding not counted");
  }

 private:
  Size2d pool_size_, strides_, padding_;
  bool count_include_pad_;
  PoolingConvention convention_;
};
HYBRA_SEPARABLE_CLASS(HybridBlock<AvgPool2D>);

// (N, C, H, W) -> (N, C, 1, 1): the average of each plane.
class GlobalAvgPool2D : public HybridBlock<GlobalAvgPool2D> {
 public:
  GlobalAvgPool2D() : HybridBlock("pool") {}
  template <class F>
  F hybrid_forward(const F& x) {
    return global_avg_pool2d(x);
  }
};
HYBRA_SEPARABLE_CLASS(HybridBlock<GlobalAvgPool2D>);

// (N, C, H, W) -> (N, C, 1, 1): the maximum of each plane.
class GlobalMaxPool2D : public HybridBlock<GlobalMaxPool2D> {
 public:
  GlobalMaxPool2D() : HybridBlock("pool") {}
  template <class F>
  F hybrid_forward(const F& x) {
    return global_max_pool2d(x);
  }
};
HYBRA_SEPARABLE_CLASS(HybridBlock<GlobalMaxPool2D>);

// Batch normalisation along `axis`. Predicting: y = (x - running_mean) /
// sqrt(running_var + epsilon) * gamma + beta. Training (autograd::record or
// train_mode): the batch's own mean and (biased) variance over every axis but
// `axis` take the running statistics' place, and each call moves the running
// statistics towards them: running = momentum * running + (1 - momentum) *
// batch (MXNet's rule), eagerly or from a captured graph; the normalisation
// is ops/batch_norm_training.hpp's, whose gradient is the closed form. gamma starts at ones, beta
// and running_mean at zeros, running_var at ones; the running statistics
// have grad_req "null", as have gamma without `scale` and beta without
// `center` (Gluon's fixed gamma and beta). in_channels = 0 (the default)
// takes the size of `axis` from the first input. By name:
//   nn::BatchNorm({.momentum = 0.99, .epsilon = 1e-3})
class BatchNorm : public HybridBlock<BatchNorm> {
 public:
  struct Options {
    std::int64_t axis = 1;
    double momentum = 0.9;
    double epsilon = 1e-5;
    bool center = true;
    bool scale = true;
    std::int64_t in_channels = 0;
    DType dtype = DType::float32;
  };

  explicit BatchNorm(Options o)
      : BatchNorm(o.axis, o.momentum, o.epsilon, o.center, o.scale, o.in_channels, o.dtype) {}
  explicit BatchNorm(std::int64_t axis = 1, double momentum = 0.9, double epsilon = 1e-5, bool center = true,
                     bool scale = true, std::int64_t in_channels = 0, DType dtype = DType::float32)
      : HybridBlock("batchnorm"),
        axis_(axis),
        momentum_(momentum),
        epsilon_(epsilon),
        gamma_(register_parameter("gamma", {in_channels}, dtype, init::One())),
        beta_(register_parameter("beta", {in_channels}, dtype, init::Zero())),
        running_mean_(register_parameter("running_mean", {in_channels}, dtype, init::Zero())),
        running_var_(register_parameter("running_var", {in_channels}, dtype, init::One())) {
    if (in_channels < 0)
      fail<ValueError>("BatchNorm: in_channels must be positive (or 0: inferred), not ", in_channels);
    if (!(epsilon > 0)) fail<ValueError>("BatchNorm: epsilon ", epsilon, " must be positive");
    if (!(momentum >= 0 && momentum <= 1)) fail<ValueError>("BatchNorm: momentum ", momentum, " must be in [0, 1]");
    if (!scale) gamma_.set_grad_req("null");
    if (!center) beta_.set_grad_req("null");
    running_mean_.set_grad_req("null");
    running_var_.set_grad_req("null");
  }

  std::string settings() const override {
    return hybra::detail::concat(detail::size_or_unknown(gamma_.shape()[0]), " channels",
                                 axis_ == 1 ? "" : ", axis " + std::to_string(axis_), ", eps ", epsilon_,
                                 ", momentum ", momentum_);
  }

  template <class F>
  F hybrid_forward(const F& x) {
    const int a = hybra::detail::checked_axis(axis_, x.shape(), "block '" + name() + "'");
    const Shape channels{x.shape()[static_cast<std::size_t>(a)]};
    for (Parameter* p : {&gamma_, &beta_, &running_mean_, &running_var_}) p->complete_shape(channels);
    if (!autograd::is_training())
      return batch_norm(x, gamma_.as<F>(), beta_.as<F>(), running_mean_.as<F>(), running_var_.as<F>(), epsilon_, axis_);
    std::vector<std::int64_t> others;
    for (std::int64_t d = 0; d < x.ndim(); ++d)
      if (d != a) others.push_back(d);
    const F batch_mean = mean(x, others, true);
    const F centred = x - batch_mean;
    const F batch_var = mean(F(centred * centred), others);
    const F channel_mean = reshape(batch_mean, channels);
    update_state(running_mean_, channel_mean, momentum_);
    update_state(running_var_, batch_var, momentum_);
    return batch_norm_training(x, gamma_.as<F>(), beta_.as<F>(), channel_mean, batch_var, epsilon_, axis_);
  }

  double momentum() const { return momentum_; }
  Parameter gamma() const { return gamma_; }
  Parameter beta() const { return beta_; }
  Parameter running_mean() const { return running_mean_; }
  Parameter running_var() const { return running_var_; }

  void cast(DType dtype) override { HybridBlock::cast(is_half(dtype) ? DType::float32 : dtype); }

 private:
  std::int64_t axis_;
  double momentum_, epsilon_;
  Parameter gamma_, beta_, running_mean_, running_var_;
};
HYBRA_SEPARABLE_CLASS(HybridBlock<BatchNorm>);

}  // namespace hybra::nn
