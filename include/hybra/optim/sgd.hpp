#pragma once
// Stochastic gradient descent with optional momentum and weight decay: MXNet's
// sgd_update / sgd_mom_update (src/operator/optimizer_op-inl.h, SGDKernel and
// SGDMomKernel), which MXNet's SGD optimizer calls. With
//   g = clip(rescale_grad * grad, clip_gradient)        (no clipping if clip_gradient <= 0)
// momentum == 0 (no state):
//   weight = (1 - lr * wd) * weight - lr * g
// momentum > 0 (state: mom, zeros at first):
//   mom    = momentum * mom - lr * wd * weight - lr * g
//   weight = weight + mom
// Weight decay is added to the clipped gradient, so it is never clipped.
#include "optimizer.hpp"

namespace hybra::optim {

class SGD final : public Optimizer {
 public:
  explicit SGD(double learning_rate = 0.01, double momentum = 0, double wd = 0)
      : Optimizer("SGD", learning_rate, wd), momentum_(checked("momentum", momentum, 0)) {}

  double momentum() const { return momentum_; }

  void update(std::size_t index, Tensor& weight, const Tensor& grad) override;

  std::vector<Tensor> state(std::size_t index) const override {
    auto it = moms_.find(index);
    if (it == moms_.end()) return {};
    return {it->second};
  }
  std::vector<std::string> state_names() const override {
    return momentum_ == 0 ? std::vector<std::string>{} : std::vector<std::string>{"momentum"};
  }

 private:
  void restore_state(std::size_t index, std::vector<Tensor> values) override {
    if (values.empty()) moms_.erase(index);
    else moms_[index] = std::move(values[0]);
  }

  double momentum_;
  std::unordered_map<std::size_t, Tensor> moms_;
};

// Out of the class: a separately compiled program instantiates its fused
// expressions once (core/separate_compilation.hpp).
#if HYBRA_DEFINE_SEPARABLE
HYBRA_SEPARABLE void SGD::update(std::size_t index, Tensor& weight, const Tensor& grad) {
  check_operands(index, weight, grad);
  const double lr = learning_rate(), c = clip_bound(), rescale = rescale_grad();
  auto g = minimum(maximum(rescale * grad, -c), c);
  if (momentum_ == 0) {
    count_update(index);
    // One pass, no state (sgd_update). With wd == 0 the factor is 1: exact.
    detail::write_fused(weight, (1 - lr * wd()) * weight - lr * g);
    return;
  }
  Tensor& mom = state_for(moms_, index, weight, "momentum");
  count_update(index);
  if (wd() == 0) {
    detail::write_fused(mom, momentum_ * mom - lr * g);  // does not read the weight
  } else {
    const double lr_wd = lr * wd();
    detail::write_fused(mom, momentum_ * mom - lr_wd * weight - lr * g);
  }
  detail::write_fused(weight, weight + mom);
}
#endif

namespace detail {
inline std::unique_ptr<Optimizer> make_sgd(const Options& options) {
  check_options("sgd", options, {"learning_rate", "momentum", "wd", "clip_gradient", "rescale_grad"});
  auto opt = std::make_unique<SGD>(option(options, "learning_rate", 0.01), option(options, "momentum", 0),
                                   option(options, "wd", 0));
  apply_common(*opt, options);
  return opt;
}
}  // namespace detail

}  // namespace hybra::optim
