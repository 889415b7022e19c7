#pragma once
// Blocks, as Gluon's: a Block is any C++ (eager only); a HybridBlock's
// forward is written once, as a template over its argument type F (Tensor
// or Symbol), and after hybridize() a call captures it once per input
// signature (shape, dtype, device, training mode), optimises the graph
// (graph/passes.hpp) and runs the compiled plan (jit/cpu_plan.hpp) from
// then on, without calling the forward again.
//
//   class Net : public nn::HybridBlock<Net> {
//    public:
//     Net() : HybridBlock("net") { dense = register_child(nn::Dense(2)); }
//     template <class F> F hybrid_forward(const F& x) { return (*dense)(relu(x)); }
//    private:
//     std::shared_ptr<nn::Dense> dense;
//   };
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "../graph/passes.hpp"
#include "../jit/cpu_plan.hpp"
#include "parameter.hpp"

namespace hybra::nn {

namespace detail {
// Gluon's naming: a block made outside any parent is `<class><n>_` with n
// counted per class name; a child takes its parent's prefix, then its own
// class and its number among the parent's children of that class.
inline std::string fresh_prefix(const std::string& class_name) {
  static std::mutex m;
  static std::unordered_map<std::string, int> count;
  std::lock_guard lock(m);
  return class_name + std::to_string(count[class_name]++) + "_";
}
}  // namespace detail

class Block {
 public:
  explicit Block(std::string class_name = "block")
      : class_name_(std::move(class_name)), prefix_(detail::fresh_prefix(class_name_)) {}
  Block(Block&&) = default;
  Block& operator=(Block&&) = default;
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
  virtual ~Block() = default;

  // Eager forward.
  virtual Tensor forward(const Tensor& x) = 0;
  // Symbolic forward: a plain Block has none. Reached when a hybridized
  // parent captures its graph through this block.
  virtual Symbol forward(const Symbol&) {
    fail<ValueError>("block '", name(), "' is a Block, not a HybridBlock: its forward is eager-only C++ and cannot be "
                     "captured into a graph. Make it a HybridBlock, or hold it in an nn::Sequential (whose Block "
                     "children run eagerly)");
  }

  Tensor operator()(const Tensor& x) { return call(x); }
  Symbol operator()(const Symbol& x) { return forward(x); }

  // `hybridsequential0_dense1_`; name() is the prefix without its underscore.
  const std::string& prefix() const { return prefix_; }
  std::string name() const { return prefix_.substr(0, prefix_.size() - 1); }

  // Every parameter of this block and its children, by full name.
  ParameterDict collect_params() const {
    ParameterDict d;
    collect(d);
    return d;
  }
  void initialize(const Initializer& init = init::Uniform(), Device device = cpu(), bool force_reinit = false,
                  Generator& gen = default_generator()) {
    collect_params().initialize(init, device, gen, force_reinit);
  }
  // Hybridizes every HybridBlock in this tree (plain Blocks stay eager).
  virtual void hybridize(bool active = true) {
    for (auto& c : children_) c->hybridize(active);
  }

  const std::vector<std::shared_ptr<Block>>& children() const { return children_; }

 protected:
  virtual Tensor call(const Tensor& x) { return forward(x); }

  // Adds a child (given by value or as a shared_ptr) and names it within this block.
  template <class B>
  std::shared_ptr<std::remove_cvref_t<B>> register_child(B&& child) {
    using C = std::remove_cvref_t<B>;
    static_assert(std::is_base_of_v<Block, C>, "hybra: register_child takes an nn::Block");
    static_assert(!std::is_lvalue_reference_v<B>,
                  "hybra: blocks are not copied; pass a child by value (std::move) or as a std::shared_ptr");
    return register_child(std::make_shared<C>(static_cast<B&&>(child)));
  }
  template <class C>
  std::shared_ptr<C> register_child(std::shared_ptr<C> child) {
    int& n = child_count_[child->class_name_];
    child->set_prefix(prefix_ + child->class_name_ + std::to_string(n++) + "_");
    children_.push_back(child);
    return child;
  }
  // A parameter named `<prefix><local_name>`, e.g. dense0_weight (a handle:
  // keep the returned copy, it shares the block's).
  Parameter register_parameter(const std::string& local_name, Shape shape, DType dtype = DType::float32,
                                std::optional<Initializer> init = std::nullopt) {
    params_.emplace_back(local_name, Parameter(prefix_ + local_name, std::move(shape), dtype, std::move(init)));
    return params_.back().second;
  }

 private:
  void set_prefix(std::string prefix) {
    prefix_ = std::move(prefix);
    for (auto& [local, p] : params_) p.rename(prefix_ + local);
    std::unordered_map<std::string, int> count;
    for (auto& c : children_) c->set_prefix(prefix_ + c->class_name_ + std::to_string(count[c->class_name_]++) + "_");
  }
  void collect(ParameterDict& d) const {
    for (const auto& [local, p] : params_) d.add(p);
    for (const auto& c : children_) c->collect(d);
  }

  std::string class_name_, prefix_;
  std::vector<std::pair<std::string, Parameter>> params_;
  std::vector<std::shared_ptr<Block>> children_;
  std::unordered_map<std::string, int> child_count_;
};

// What every HybridBlock shares, whatever its forward: the capture cache.
class HybridBase : public Block {
 public:
  using Block::Block;
  using Block::forward;
  Symbol forward(const Symbol& x) override = 0;

  void hybridize(bool active = true) override {
    active_ = active;
    Block::hybridize(active);
  }
  bool hybridized() const { return active_; }

  // The plan of the last call's signature (to print its graph or read its
  // memory figures); a ValueError before the first hybridized call.
  const jit::CpuPlan& plan() const {
    if (!last_) fail<ValueError>("block '", name(), "': no graph has been captured yet (hybridize(), then call it)");
    return last_->plan;
  }
  // How many signatures have been captured.
  std::size_t captured() const { return cache_.size(); }

 protected:
  Tensor call(const Tensor& x) override {
    if (!active_) return forward(x);
    x.require(name().c_str());
    const bool training = autograd::is_training();
    if (!last_ || last_->shape != x.shape() || last_->dtype != x.dtype() || last_->device != x.device() ||
        last_->training != training) {
      Key key{std::vector<std::int64_t>(x.shape().begin(), x.shape().end()), x.dtype(), x.device(), training};
      auto it = cache_.find(key);
      if (it == cache_.end()) it = cache_.emplace(key, capture(x, training)).first;
      last_ = it->second.get();
    }
    std::vector<Tensor> in(last_->sources.size());
    for (std::size_t k = 0; k < in.size(); ++k) in[k] = last_->sources[k] ? last_->sources[k]->data() : x;
    return last_->plan(std::move(in)).front();
  }

 private:
  using Key = std::tuple<std::vector<std::int64_t>, DType, Device, bool>;
  struct Captured {
    Shape shape;
    DType dtype;
    Device device;
    bool training;
    jit::CpuPlan plan;
    std::vector<std::optional<Parameter>> sources;  // per graph var: a parameter, or the input
  };

  std::unique_ptr<Captured> capture(const Tensor& x, bool training) {
    Symbol out;
    {
      autograd::mode_scope mode(training);
      out = forward(sym::var("data", x.shape(), x.dtype()));
    }
    graph::Graph g = graph::trace({out});
    const ParameterDict params = collect_params();
    std::vector<std::optional<Parameter>> sources;
    for (int v : g.vars()) {
      const auto& var = g.nodes[static_cast<std::size_t>(v)];
      if (var.name == "data") {
        sources.emplace_back(std::nullopt);
      } else if (const Parameter* p = params.find(var.name)) {
        sources.emplace_back(*p);
      } else {
        fail<ValueError>("block '", name(), "': its graph reads var '", var.name,
                         "', which is neither its input 'data' nor one of its parameters");
      }
    }
    return std::make_unique<Captured>(Captured{x.shape(), x.dtype(), x.device(), training,
                                               jit::CpuPlan(graph::optimize(g), x.device(), training, "hybridized " + name()),
                                               std::move(sources)});
  }

  bool active_ = false;
  std::map<Key, std::unique_ptr<Captured>> cache_;
  Captured* last_ = nullptr;
};

// The base of a user's hybrid block: Derived defines
// `template <class F> F hybrid_forward(const F& x)`, used for both modes.
template <class Derived>
class HybridBlock : public HybridBase {
 public:
  using HybridBase::HybridBase;
  Tensor forward(const Tensor& x) override { return self().hybrid_forward(x); }
  Symbol forward(const Symbol& x) override { return self().hybrid_forward(x); }

 private:
  Derived& self() { return static_cast<Derived&>(*this); }
};

}  // namespace hybra::nn
