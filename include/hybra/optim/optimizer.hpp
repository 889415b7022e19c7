#pragma once
// Optimizers, as MXNet's: an Optimizer updates one weight from its gradient,
// IN PLACE (into the weight's own storage, as weight.assign(...) writes), so
// every handle of the parameter sees the new values. It keeps per-index
// state (SGD's momentum, Adam's moments), created on the index's first update. The
// Trainer (trainer.hpp) numbers every copy of every trained parameter and
// calls update(index, weight, grad) once per copy per step, after setting
// rescale_grad to 1 / batch_size.
//
// Each update is a few fused expressions queued on the engine, one pass over
// memory per tensor written (detail::write_fused); nothing waits, so a
// training step stays a chain of futures. Errors about the operands (shape, dtype, device) are
// thrown by the call itself and name the optimizer, the index and the shapes.
//
// This header declares the base class and create(); it includes sgd.hpp and
// adam.hpp at its end, so including any of the three gives all of them.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "../core/creation.hpp"
#include "../core/error.hpp"
#include "../core/separate_compilation.hpp"
#include "../core/tensor.hpp"
#include "../expr/evaluate.hpp"
#include "../expr/expression.hpp"

namespace hybra::optim {

// Hyperparameters by Gluon's names: {"learning_rate", 0.1}, {"momentum", 0.9}, ...
using Options = std::map<std::string, double>;

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // State tensors are handles: a copy would share them with the original.
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // "SGD", "Adam": how errors name the optimizer.
  std::string_view name() const { return name_; }

  // Updates `weight` in place from `grad` (same shape, dtype and device;
  // float32 or float64), using and advancing the state of `index`.
  // Asynchronous: the work is queued on the engine and the call returns.
  virtual void update(std::size_t index, Tensor& weight, const Tensor& grad) = 0;

  // The state tensors of `index` (SGD: {momentum}; Adam: {mean, var}), as
  // handles; empty before its first update (and for SGD without momentum).
  virtual std::vector<Tensor> state(std::size_t index) const {
    static_cast<void>(index);
    return {};
  }
  // What state(index) holds after an update, by name, in its order.
  virtual std::vector<std::string> state_names() const { return {}; }

  // Resumes `index` where a saved run left it: its state tensors (in
  // state_names() order, kept as handles: the updates write into them) and
  // its update count. Nothing of a count of 0 is kept (its first update
  // starts afresh).
  void restore(std::size_t index, std::vector<Tensor> values, std::int64_t update_count) {
    if (update_count < 0)
      fail<ValueError>(name_, ".restore (index ", index, "): update_count must be >= 0, not ", update_count);
    if (update_count > 0 && values.size() != state_names().size())
      fail<ValueError>(name_, ".restore (index ", index, "): ", values.size(), " state tensors given, ",
                       state_names().size(), " expected");
    restore_state(index, update_count > 0 ? std::move(values) : std::vector<Tensor>{});
    if (update_count == 0) counts_.erase(index);
    else counts_[index] = update_count;
    num_update_ = 0;
    for (const auto& [i, count] : counts_) num_update_ = std::max(num_update_, count);
  }

  double learning_rate() const { return learning_rate_; }
  // For schedules: the next update uses it.
  void set_learning_rate(double lr) { learning_rate_ = checked("learning_rate", lr, 0); }
  double wd() const { return wd_; }
  void set_wd(double wd) { wd_ = checked("wd", wd); }
  // The factor gradients are multiplied by first (the Trainer sets 1 / batch_size).
  double rescale_grad() const { return rescale_grad_; }
  void set_rescale_grad(double r) { rescale_grad_ = checked("rescale_grad", r); }
  // Gradients (after rescaling) are clipped to [-c, c]; c <= 0: no clipping.
  double clip_gradient() const { return clip_gradient_; }
  void set_clip_gradient(double c) { clip_gradient_ = checked("clip_gradient", c); }

  // How many updates `index` has had (0 before its first), and the most of
  // any index: MXNet's _index_update_count and num_update.
  std::int64_t update_count(std::size_t index) const {
    auto it = counts_.find(index);
    return it == counts_.end() ? 0 : it->second;
  }
  std::int64_t num_update() const { return num_update_; }

 protected:
  Optimizer(std::string_view name, double learning_rate, double wd) : name_(name) {
    set_learning_rate(learning_rate);
    set_wd(wd);
  }

  // A finite hyperparameter, at least `min` when given; else a ValueError naming it.
  double checked(std::string_view what, double value,
                 double min = -std::numeric_limits<double>::infinity()) const {
    if (!std::isfinite(value) || value < min) {
      if (min == -std::numeric_limits<double>::infinity())
        fail<ValueError>(name_, ": ", what, " must be a finite number, not ", value);
      fail<ValueError>(name_, ": ", what, " must be a finite number >= ", min, ", not ", value);
    }
    return value;
  }

  // Checks the operands of update(index, weight, grad): first thing in an update.
  void check_operands(std::size_t index, const Tensor& weight, const Tensor& grad) const {
    const auto where = [&] { return hybra::detail::concat(name(), ".update (index ", index, ")"); };
    if (!weight.defined()) fail<ValueError>(where(), ": the weight is empty (default-constructed or moved-from)");
    if (!grad.defined()) fail<ValueError>(where(), ": the gradient is empty (default-constructed or moved-from)");
    if (!is_floating(weight.dtype()))
      fail<DTypeError>(where(), ": weight has dtype ", hybra::name(weight.dtype()),
                       "; optimizers update float32 or float64 weights");
    if (grad.shape() != weight.shape())
      fail<ShapeError>(where(), ": gradient of shape ", to_string(grad.shape()), " does not match weight of shape ",
                       to_string(weight.shape()));
    if (grad.dtype() != weight.dtype())
      fail<DTypeError>(where(), ": gradient of dtype ", hybra::name(grad.dtype()), " does not match weight of dtype ",
                       hybra::name(weight.dtype()), " (shape ", to_string(weight.shape()), ")");
    if (grad.device() != weight.device())
      fail<DeviceError>(where(), ": gradient on ", grad.device(), " but weight of shape ", to_string(weight.shape()),
                        " on ", weight.device(), "; copy one with to(device) first");
  }

  // Counts an update of `index` (once its operands and state are known to be
  // good); returns the index's count including this one (Adam's t).
  std::int64_t count_update(std::size_t index) {
    const std::int64_t t = ++counts_[index];
    num_update_ = std::max(num_update_, t);
    return t;
  }

  // The state tensor for `index` from `states` (created as zeros like the
  // weight on first use, so the engine orders it before the update's reads);
  // a state made for a weight of another shape, dtype or device is an error.
  Tensor& state_for(std::unordered_map<std::size_t, Tensor>& states, std::size_t index, const Tensor& weight,
                    std::string_view what) {
    auto [it, fresh] = states.try_emplace(index);
    if (fresh) {
      try {
        it->second = zeros(weight.shape(), weight.dtype(), weight.device());
      } catch (...) {
        states.erase(it);
        throw;
      }
      return it->second;
    }
    const Tensor& s = it->second;
    if (s.shape() != weight.shape() || s.dtype() != weight.dtype() || s.device() != weight.device())
      fail<ValueError>(name(), ".update (index ", index, "): its ", what, " state was made for a weight of shape ",
                       to_string(s.shape()), ", ", hybra::name(s.dtype()), " on ", s.device(),
                       ", but this weight has shape ", to_string(weight.shape()), ", ", hybra::name(weight.dtype()),
                       " on ", weight.device(), "; use another index for another weight");
    return it->second;
  }

  // restore()'s part in the optimizer's own state: `values` as state(index)
  // would return them, or none (index starts afresh).
  virtual void restore_state(std::size_t index, std::vector<Tensor> values) {
    static_cast<void>(index);
    static_cast<void>(values);
  }

  // The clipping bound: clip_gradient, or infinity when clipping is off, so
  // one expression serves both (minimum/maximum with +-inf keep every value,
  // NaN included, as MXNet's clip does).
  double clip_bound() const {
    return clip_gradient_ > 0 ? clip_gradient_ : std::numeric_limits<double>::infinity();
  }

 private:
  std::string name_;
  double learning_rate_ = 0;
  double wd_ = 0;
  double rescale_grad_ = 1;
  double clip_gradient_ = 0;
  std::unordered_map<std::size_t, std::int64_t> counts_;
  std::int64_t num_update_ = 0;
};

namespace detail {

// Writes the expression e into dst in ONE fused pass, in place: what
// dst.assign(e) does when e's tensors share dst's dtype, instantiated for
// float32 and float64 only. update() has checked that every tensor of e has
// dst's shape, dtype and device, so assign's other paths (conversions,
// node-by-node and recorded evaluation, each instantiated for all five
// dtypes) can never run. Compiling them anyway took a file that uses both
// optimizers from 12 s to 31 s (CPU time at -O1; 3.4 s without optim/).
template <class E>
void write_fused(const Tensor& dst, const E& e) {
  static_assert(std::is_same_v<kernel::result_t<E, float>, float> &&
                    std::is_same_v<kernel::result_t<E, double>, double>,
                "hybra::optim: an update expression must keep the weight's dtype");
  auto run = [&](const auto& expr, const hybra::detail::leaf_list& leaves, const Tensor& out) {
    if (out.dtype() == DType::float32) hybra::detail::push_fused<float, float>(expr, leaves, out);
    else if (out.dtype() == DType::float64) hybra::detail::push_fused<double, double>(expr, leaves, out);
    else fail<DTypeError>("hybra::optim: cannot update a tensor of dtype ", hybra::name(out.dtype()));
  };
  const auto leaves = hybra::detail::tensor_leaves(e);
  // A different view of dst's storage (a gradient that is a transpose of
  // its weight) would be read after it is overwritten: such an update goes
  // through a temporary, as assign's does.
  bool other_view = false;
  for (const Tensor* t : leaves)
    other_view = other_view || (t->storage() == dst.storage() &&
                                (t->shape() != dst.shape() || t->strides() != dst.strides() || t->offset() != dst.offset()));
  if (!other_view) return run(e, leaves, dst);
  const Tensor tmp(dst.shape(), dst.dtype(), dst.device());
  run(e, leaves, tmp);
  run(yap::make_terminal<expression>(tmp), {&tmp}, dst);
}

// Defined in sgd.hpp and adam.hpp (included at the end of this header).
inline std::unique_ptr<Optimizer> make_sgd(const Options& options);
inline std::unique_ptr<Optimizer> make_adam(const Options& options);

inline std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// Rejects any option not in `valid`, naming it and listing the valid ones.
inline void check_options(std::string_view optimizer, const Options& options,
                          std::initializer_list<std::string_view> valid) {
  for (const auto& [key, value] : options) {
    static_cast<void>(value);
    if (std::find(valid.begin(), valid.end(), key) != valid.end()) continue;
    std::ostringstream list;
    for (auto v : valid) list << (v == *valid.begin() ? "" : ", ") << v;
    fail<ValueError>("optim::create: '", optimizer, "' has no option '", key, "'; its options are ", list.str());
  }
}

// options[key], or `fallback` when absent.
inline double option(const Options& options, const std::string& key, double fallback) {
  auto it = options.find(key);
  return it == options.end() ? fallback : it->second;
}

// The options every optimizer takes, applied after construction.
inline void apply_common(Optimizer& opt, const Options& options) {
  if (auto it = options.find("clip_gradient"); it != options.end()) opt.set_clip_gradient(it->second);
  if (auto it = options.find("rescale_grad"); it != options.end()) opt.set_rescale_grad(it->second);
}

}  // namespace detail

// An optimizer by name ("sgd" or "adam", any case) with Gluon's option
// names: learning_rate, wd, clip_gradient, rescale_grad for both, momentum
// for sgd, beta1, beta2, epsilon for adam. An unknown name or option, or an
// invalid value (a negative learning rate, ...), is a ValueError.
inline std::unique_ptr<Optimizer> create(std::string_view name, const Options& params = {}) {
  const std::string key = detail::lower(name);
  if (key == "sgd") return detail::make_sgd(params);
  if (key == "adam") return detail::make_adam(params);
  fail<ValueError>("optim::create: unknown optimizer '", name, "'; the optimizers are sgd, adam");
}

}  // namespace hybra::optim

#include "adam.hpp"
#include "sgd.hpp"
