#pragma once
// Adam: MXNet's adam_update (src/operator/optimizer_op-inl.h, AdamUpdateKernel)
// with the bias correction MXNet's Adam optimizer folds into the learning
// rate (python/mxnet/optimizer/adam.py). At the index's t-th update (t = 1, 2, ...):
//   g      = clip(rescale_grad * grad + wd * weight, clip_gradient)   (no clipping if clip_gradient <= 0)
//   mean   = beta1 * mean + (1 - beta1) * g
//   var    = beta2 * var + (1 - beta2) * g * g
//   lr_t   = learning_rate * sqrt(1 - beta2^t) / (1 - beta1^t)
//   weight = weight - lr_t * mean / (sqrt(var) + epsilon)
// As in MXNet's kernel, weight decay is added before clipping (MXNet's
// docstring and its unfused Python step clip first, then add wd * weight;
// the fused kernel Gluon runs does this).
#include "optimizer.hpp"

namespace hybra::optim {

class Adam final : public Optimizer {
 public:
  explicit Adam(double learning_rate = 0.001, double beta1 = 0.9, double beta2 = 0.999, double epsilon = 1e-8,
                double wd = 0)
      : Optimizer("Adam", learning_rate, wd),
        beta1_(beta(beta1, "beta1")),
        beta2_(beta(beta2, "beta2")),
        epsilon_(checked("epsilon", epsilon, 0)) {}

  double beta1() const { return beta1_; }
  double beta2() const { return beta2_; }
  double epsilon() const { return epsilon_; }

  void update(std::size_t index, Tensor& weight, const Tensor& grad) override;

  std::vector<Tensor> state(std::size_t index) const override {
    auto m = means_.find(index);
    auto v = vars_.find(index);
    if (m == means_.end() || v == vars_.end()) return {};
    return {m->second, v->second};
  }
  std::vector<std::string> state_names() const override { return {"mean", "var"}; }

 private:
  void restore_state(std::size_t index, std::vector<Tensor> values) override {
    means_.erase(index);
    vars_.erase(index);
    if (values.empty()) return;
    means_[index] = std::move(values[0]);
    vars_[index] = std::move(values[1]);
  }

  double beta(double value, std::string_view what) const {
    checked(what, value, 0);
    if (!(value < 1)) fail<ValueError>(name(), ": ", what, " must be in [0, 1), not ", value);
    return value;
  }

  double beta1_, beta2_, epsilon_;
  std::unordered_map<std::size_t, Tensor> means_, vars_;
};

// Out of the class: a separately compiled program instantiates its fused
// expressions once (core/separate_compilation.hpp).
#if HYBRA_DEFINE_SEPARABLE
HYBRA_SEPARABLE void Adam::update(std::size_t index, Tensor& weight, const Tensor& grad) {
  check_operands(index, weight, grad);
  Tensor& mean = state_for(means_, index, weight, "mean");
  Tensor& var = state_for(vars_, index, weight, "var");
  const auto t = static_cast<double>(count_update(index));
  const double c = clip_bound(), rescale = rescale_grad(), wd = this->wd();
  const double lr_t = learning_rate() * std::sqrt(1 - std::pow(beta2_, t)) / (1 - std::pow(beta1_, t));
  const double b1 = beta1_, b2 = beta2_, a1 = 1 - beta1_, a2 = 1 - beta2_;
  // Both moments from the same gradient expression; the weight is read
  // only when weight decay needs it.
  auto moments = [&](const auto& g) {
    detail::write_fused(mean, b1 * mean + a1 * g);
    detail::write_fused(var, b2 * var + a2 * g * g);
  };
  if (wd == 0) moments(minimum(maximum(rescale * grad, -c), c));
  else moments(minimum(maximum(rescale * grad + wd * weight, -c), c));
  detail::write_fused(weight, weight - lr_t * mean / (sqrt(var) + epsilon_));
}
#endif

namespace detail {
inline std::unique_ptr<Optimizer> make_adam(const Options& options) {
  check_options("adam", options,
                {"learning_rate", "beta1", "beta2", "epsilon", "wd", "clip_gradient", "rescale_grad"});
  auto opt = std::make_unique<Adam>(option(options, "learning_rate", 0.001), option(options, "beta1", 0.9),
                                    option(options, "beta2", 0.999), option(options, "epsilon", 1e-8),
                                    option(options, "wd", 0));
  apply_common(*opt, options);
  return opt;
}
}  // namespace detail

}  // namespace hybra::optim
