#pragma once
// Blocks, as Gluon's: a Block is any C++ (eager only); a HybridBlock's
// forward is written once, as a template over its argument type F (Tensor
// or Symbol), and after hybridize() a call captures it once per input
// signature (shape, dtype, device, training mode), optimises the graph
// (graph/passes.hpp) and runs the compiled plan (jit/plan.hpp) from
// then on, without calling the forward again.
//
//   class Net : public nn::HybridBlock<Net> {
//    public:
//     Net() : HybridBlock("net") { dense = register_child(nn::Dense(2)); }
//     template <class F> F hybrid_forward(const F& x) { return (*dense)(relu(x)); }
//    private:
//     std::shared_ptr<nn::Dense> dense;
//   };
#include <boost/container/small_vector.hpp>
#include <boost/core/demangle.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <map>
#include <span>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../autograd/backward.hpp"
#include "../core/separate_compilation.hpp"
#include "../graph/passes.hpp"
#include "../io/mxnet_graph.hpp"
#include "../io/ndarray_list.hpp"
#include "../jit/plan.hpp"
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

namespace detail {
// A parameter that the forward itself updates rather than training (BatchNorm's
// running statistics): target = momentum * target + (1 - momentum) * value.
struct StateUpdate {
  Parameter target;
  Symbol value;
  double momentum;
};
// The updates of the forward being captured (HybridBase::capture).
inline thread_local std::vector<StateUpdate>* captured_updates = nullptr;
}  // namespace detail

class Block;
namespace detail {
// A size a block takes from its first input, as printed: "?" until then.
inline std::string size_or_unknown(std::int64_t n) { return n > 0 ? std::to_string(n) : "?"; }

// Sees every eager block call on this thread: how summary() (summary.hpp)
// learns each block's output shape without a hook in any layer.
struct CallObserver {
  virtual ~CallObserver() = default;
  virtual void enter(const Block& block) = 0;
  virtual void leave(const Block& block, const Tensor& output) = 0;
};
inline thread_local CallObserver* call_observer = nullptr;
}  // namespace detail

// What a layer calls in training mode to move a state parameter towards a
// value of this batch. Eagerly it updates the parameter's copy on the
// forward's device at once; while a graph is captured the value becomes an
// extra output of the graph, and each call of the plan applies the update.
// Neither is recorded by autograd.
template <class F>
void update_state(const Parameter& target, const F& value, double momentum) {
  if constexpr (std::is_same_v<F, Tensor>) {
    autograd::pause not_recorded(true);
    Tensor t = target.data(value.device());
    t.assign(t * momentum + value.detach() * (1 - momentum));
  } else if (detail::captured_updates) {
    detail::captured_updates->push_back(detail::StateUpdate{target, value, momentum});
  }
}

class Block {
 public:
  explicit Block(std::string class_name = "block")
      : class_name_(std::move(class_name)), prefix_(detail::fresh_prefix(class_name_)) {}
  // A block whose prefix is given ("" for a SymbolBlock, whose parameters
  // keep the names of the model file).
  Block(std::string class_name, std::string prefix) : class_name_(std::move(class_name)), prefix_(std::move(prefix)) {}
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

  Tensor operator()(const Tensor& x) {
    detail::forward_device_scope on(checked(x).device());
    if (!detail::call_observer) return call(x);
    detail::call_observer->enter(*this);
    Tensor y = call(x);
    detail::call_observer->leave(*this, y);
    return y;
  }
  Symbol operator()(const Symbol& x) { return forward(x); }

  // `hybridsequential0_dense1_`; name() is the prefix without its underscore.
  const std::string& prefix() const { return prefix_; }
  std::string name() const { return prefix_.empty() ? class_name_ : prefix_.substr(0, prefix_.size() - 1); }

  // The C++ class without its namespaces ("Dense", "HybridNet"): how a
  // printed network names each block.
  std::string type_name() const {
    std::string t = boost::core::demangle(typeid(*this).name());
    t = t.substr(0, t.find('<'));
    const std::size_t colons = t.rfind("::");
    return colons == std::string::npos ? t : t.substr(colons + 2);
  }
  // What a printed network shows of this block after its type, such as a
  // layer's sizes and activation: nothing unless the block says.
  virtual std::string settings() const { return ""; }

  // This block's own parameters (not its children's), by local name.
  const std::vector<std::pair<std::string, Parameter>>& own_params() const { return params_; }

  // Every parameter of this block and its children, by full name.
  ParameterDict collect_params() const {
    ParameterDict d;
    collect(d);
    return d;
  }
  // Every parameter by its place in the tree below this block: a child is
  // named by its own part of the prefix (`dense1.weight`,
  // `hybridsequential0.dense0.bias`), so the names do not change when this
  // block is wrapped in another (its prefix does).
  std::vector<std::pair<std::string, Parameter>> structured_params() const {
    std::vector<std::pair<std::string, Parameter>> out;
    collect_structured("", out);
    return out;
  }

  // The parameters' values, by structured_params() names, in MXNet's
  // NDArray-list format (written atomically).
  void save_parameters(const std::filesystem::path& file) const {
    std::vector<std::pair<std::string, Tensor>> arrays;
    for (const auto& [key, p] : structured_params()) arrays.emplace_back(key, p.data());
    io::save_ndarray_list(file, arrays);
  }

  // Loads a save_parameters() file, or an export_model() `.params` file
  // (names `arg:<parameter name>`, matched to collect_params() names, as
  // Gluon's load_parameters does for names without a '.'). A parameter the
  // file lacks is an error unless allow_missing; a name the block lacks is
  // an error unless ignore_extra.
  void load_parameters(const std::filesystem::path& file, Device device = cpu(), bool allow_missing = false,
                       bool ignore_extra = false) {
    auto loaded = io::load_ndarray_list(file);
    const bool full_names = std::none_of(loaded.begin(), loaded.end(), [](const auto& a) {
      return a.first.find('.') != std::string::npos;
    });
    std::vector<std::pair<std::string, Parameter>> expected;
    if (full_names) {
      for (const auto& p : collect_params()) expected.emplace_back(p.name(), p);
      for (auto& [key, value] : loaded)
        if (key.starts_with("arg:") || key.starts_with("aux:")) key.erase(0, 4);
    } else {
      expected = structured_params();
    }
    std::vector<bool> used(loaded.size(), false);
    for (auto& entry : expected) {
      const std::string& key = entry.first;
      Parameter& p = entry.second;
      auto at = std::find_if(loaded.begin(), loaded.end(), [&](const auto& a) { return a.first == key; });
      if (at == loaded.end()) {
        if (allow_missing) continue;
        fail<ValueError>("load_parameters: file '", file.string(), "' has no parameter '", key, "' (block '", name(),
                         "' parameter '", p.name(), "'); pass allow_missing=true to leave it as it is");
      }
      used[static_cast<std::size_t>(at - loaded.begin())] = true;
      try {
        p.set_data(at->second.to(device));
      } catch (const ShapeError& e) {
        fail<ShapeError>("load_parameters: file '", file.string(), "': ", e.what());
      }
    }
    for (std::size_t k = 0; k < loaded.size(); ++k)
      if (!used[k] && !ignore_extra)
        fail<ValueError>("load_parameters: file '", file.string(), "' has parameter '", loaded[k].first, "', which block '",
                         name(), "' does not have; pass ignore_extra=true to skip it");
  }

  void initialize(const Initializer& init = init::Uniform(), Device device = cpu(), bool force_reinit = false,
                  Generator& gen = default_generator()) {
    collect_params().initialize(init, device, gen, force_reinit);
  }
  // Data parallelism: a copy of every parameter on each device (equal values).
  void initialize(const Initializer& init, const std::vector<Device>& devices, bool force_reinit = false,
                  Generator& gen = default_generator()) {
    collect_params().initialize(init, devices, gen, force_reinit);
  }
  // Converts every parameter of this tree to `dtype` (Gluon's cast): a model
  // in float16 or bfloat16 for mixed-precision training (Trainer's
  // multi_precision keeps float32 master weights) or inference. BatchNorm
  // keeps float32 parameters and statistics for the 16-bit floats, as Gluon's.
  virtual void cast(DType dtype) {
    for (auto& entry : params_) entry.second.cast(dtype);
    for (auto& c : children_) c->cast(dtype);
  }

  // Hybridizes every HybridBlock in this tree (plain Blocks stay eager).
  virtual void hybridize(bool active = true) {
    for (auto& c : children_) c->hybridize(active);
  }

  const std::vector<std::shared_ptr<Block>>& children() const { return children_; }

 protected:
  virtual Tensor call(const Tensor& x) { return forward(x); }

  // x, or the error naming this block if x is empty (the name is a string
  // built per call, so only then).
  const Tensor& checked(const Tensor& x) const { return x.defined() ? x : x.require(name().c_str()); }

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
  void collect_structured(const std::string& path, std::vector<std::pair<std::string, Parameter>>& out) const {
    for (const auto& [local, p] : params_) out.emplace_back(path + local, p);
    for (const auto& c : children_) {
      std::string part = c->prefix_.substr(prefix_.size());
      if (part.ends_with('_')) part.pop_back();
      c->collect_structured(path + part + ".", out);
    }
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

// What every HybridBlock shares, whatever its forward: the capture cache,
// and export of the captured graph.
class HybridBase : public Block {
 public:
  using Block::Block;
  using Block::forward;
  Symbol forward(const Symbol& x) override = 0;

  void hybridize(bool active = true) override {
    active_ = active;
    Block::hybridize(active);
  }
  // The graphs captured before name the parameters' old dtypes: gone.
  void cast(DType dtype) override {
    cache_.clear();
    last_ = nullptr;
    Block::cast(dtype);
  }
  bool hybridized() const { return active_; }

  // The names of the graph's inputs, in call order (Gluon's: one, "data").
  virtual std::vector<std::string> input_names() const { return graph_input_names(1); }

  // The plan of the last call's signature (to print its graph or read its
  // memory figures); a ValueError before the first hybridized call.
  const jit::Plan& plan() const { return last_captured("plan").plan; }
  // How many signatures have been captured.
  std::size_t captured() const { return cache_.size(); }

  // Writes the last captured graph as `<path>-symbol.json` and its
  // parameters as `<path>-<epoch, 4 digits>.params`, in MXNet's formats
  // (docs/model-format.md). The graph is the one the forward built, before
  // optimisation, so any program that imports it re-optimises it for itself.
  void export_model(const std::string& path, int epoch = 0) const {
    const Captured& c = last_captured("export_model");
    graph::Graph user_graph = c.graph;  // without the state updates' outputs
    user_graph.outputs.resize(c.outputs);
    user_graph = graph::eliminate_dead_code(user_graph);
    io::MxnetExport ex = io::to_mxnet(user_graph, graph_input_names(c.shapes.size()), prefix());
    std::vector<std::pair<std::string, Tensor>> arrays;
    const auto vars = c.graph.vars();
    for (bool aux : {false, true}) {
      for (std::size_t k = 0; k < vars.size(); ++k) {
        if (!c.sources[k].parameter) continue;
        const std::string& var = c.graph.nodes[static_cast<std::size_t>(vars[k])].name;
        if ((std::find(ex.aux.begin(), ex.aux.end(), var) != ex.aux.end()) == aux)
          arrays.emplace_back((aux ? "aux:" : "arg:") + var, c.sources[k].parameter->data());
      }
    }
    for (auto& [name, value] : ex.constants) arrays.emplace_back("arg:" + name, value);
    char epoch_text[16];
    std::snprintf(epoch_text, sizeof epoch_text, "%04d", epoch);
    io::save_ndarray_list(path + "-" + epoch_text + ".params", arrays);
    io::save_symbol_json(path + "-symbol.json", ex.symbol);
  }

 protected:
  // Observed (summary()), a hybridized block runs eagerly, so that each of
  // its children is seen.
  Tensor call(const Tensor& x) override {
    if (!active_ || detail::call_observer) return forward(x);
    return call_captured(std::span(&x, 1)).front();
  }

  // The symbolic forward over all inputs (one input: forward(Symbol)).
  virtual std::vector<Symbol> forward_all(const std::vector<Symbol>& inputs) { return {forward(inputs.front())}; }
  // The names of a graph of `count` inputs: Gluon's "data", or "data0", "data1", ...
  virtual std::vector<std::string> graph_input_names(std::size_t count) const {
    if (count == 1) return {"data"};
    std::vector<std::string> names;
    for (std::size_t k = 0; k < count; ++k) names.push_back("data" + std::to_string(k));
    return names;
  }

  // A hybridized call: the plan of the inputs' signature, captured on the
  // first call with that signature.
  std::vector<Tensor> call_captured(std::span<const Tensor> in) {
    for (const auto& t : in) checked(t);
    const bool training = autograd::is_training();
    if (!last_ || !last_->matches(in, training)) {
      Key key{{}, in.front().device(), training};
      for (const auto& t : in) key.signature.emplace_back(std::vector<std::int64_t>(t.shape().begin(), t.shape().end()), t.dtype());
      auto it = cache_.find(key);
      if (it == cache_.end()) it = cache_.emplace(key, capture(in, training)).first;
      last_ = it->second.get();
    }
    // Pointers: a call that copied each parameter's handle would change its
    // reference count, a cache line the engine's worker reads (plan.hpp).
    boost::container::small_vector<const Tensor*, 16> values(last_->sources.size());
    for (std::size_t k = 0; k < values.size(); ++k)
      values[k] = last_->sources[k].parameter ? &last_->sources[k].parameter->data(in.front().device())
                                              : &in[last_->sources[k].input];
    std::vector<bool> wanted(values.size());
    bool recorded = false;
    if (autograd::is_recording())
      for (std::size_t k = 0; k < values.size(); ++k) recorded |= wanted[k] = autograd::requires_grad(*values[k]);
    if (!recorded)
      return apply_updates(*last_, last_->plan.call(std::span<const Tensor* const>(values.data(), values.size())));
    std::vector<Tensor> copies;
    for (const Tensor* v : values) copies.push_back(*v);
    return call_recorded(*last_, std::move(copies), wanted);
  }

 private:
  struct Key {
    std::vector<std::pair<std::vector<std::int64_t>, DType>> signature;
    Device device;
    bool training;
    auto operator<=>(const Key&) const = default;
  };
  // Where a graph var's value comes from: a parameter, or an input.
  struct Source {
    std::optional<Parameter> parameter;
    std::size_t input = 0;
  };
  // A captured graph's forward that keeps what its backward reads, and that
  // backward, compiled (autograd::training_graphs); one per set of vars that
  // need gradients.
  struct Training {
    jit::Plan forward, backward;
    std::size_t outputs;
    // Per var of the backward plan: a forward var (k), a saved value
    // (saved_base + k) or an output's gradient (head_base + k).
    std::vector<std::size_t> binding;
    std::size_t saved_base, head_base;
  };
  struct Captured {
    std::vector<Shape> shapes;
    std::vector<DType> dtypes;
    Device device;
    bool training;
    // As the forward built it (what export_model writes): its outputs, then the state updates' values.
    graph::Graph graph;
    std::size_t outputs;
    std::vector<std::pair<Parameter, double>> updates;  // target and momentum, per extra output
    jit::Plan plan;
    std::vector<Source> sources;  // per graph var
    std::map<std::vector<bool>, std::shared_ptr<const Training>> training_plans{};

    bool matches(std::span<const Tensor> in, bool mode) const {
      if (in.size() != shapes.size() || mode != training || in.front().device() != device) return false;
      for (std::size_t k = 0; k < in.size(); ++k)
        if (in[k].shape() != shapes[k] || in[k].dtype() != dtypes[k]) return false;
      return true;
    }
  };

  const Captured& last_captured(std::string_view what) const {
    if (!last_)
      fail<ValueError>("block '", name(), "': ", what, ": no graph has been captured yet (hybridize(), then call it)");
    return *last_;
  }

  std::unique_ptr<Captured> capture(std::span<const Tensor> in, bool training) {
    const std::vector<std::string> names = graph_input_names(in.size());
    if (names.size() != in.size()) {
      std::string list;
      for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
      fail<ValueError>("block '", name(), "' takes ", names.size(), " inputs (", list, "), not ", in.size());
    }
    std::vector<Symbol> outs;
    std::vector<detail::StateUpdate> updates;
    {
      autograd::mode_scope mode(training);
      std::vector<Symbol> vars;
      for (std::size_t k = 0; k < in.size(); ++k) vars.push_back(sym::var(names[k], in[k].shape(), in[k].dtype()));
      auto* outer = std::exchange(detail::captured_updates, &updates);
      try {
        outs = forward_all(vars);
      } catch (...) {
        detail::captured_updates = outer;
        throw;
      }
      detail::captured_updates = outer;
    }
    const std::size_t outputs = outs.size();
    std::vector<std::pair<Parameter, double>> targets;
    for (const auto& u : updates) {
      outs.push_back(u.value);
      targets.emplace_back(u.target, u.momentum);
    }
    graph::Graph g = graph::trace(outs);
    const ParameterDict params = collect_params();
    std::vector<Source> sources;
    for (int v : g.vars()) {
      const auto& var = g.nodes[static_cast<std::size_t>(v)];
      if (auto at = std::find(names.begin(), names.end(), var.name); at != names.end()) {
        sources.push_back(Source{std::nullopt, static_cast<std::size_t>(at - names.begin())});
      } else if (const Parameter* p = params.find(var.name)) {
        sources.push_back(Source{*p, 0});
      } else {
        fail<ValueError>("block '", name(), "': its graph reads var '", var.name,
                         "', which is neither one of its inputs nor one of its parameters");
      }
    }
    std::vector<Shape> shapes;
    std::vector<DType> dtypes;
    for (const auto& t : in) {
      shapes.push_back(t.shape());
      dtypes.push_back(t.dtype());
    }
    jit::Plan plan(graph::optimize(g), in.front().device(), training, "hybridized " + name());
    return std::make_unique<Captured>(Captured{std::move(shapes), std::move(dtypes), in.front().device(), training,
                                               std::move(g), outputs, std::move(targets), std::move(plan),
                                               std::move(sources)});
  }

  std::shared_ptr<const Training> training_plan(Captured& c, const std::vector<bool>& wanted) const {
    auto& slot = c.training_plans[wanted];
    if (slot) return slot;
    autograd::TrainingGraphs graphs = autograd::training_graphs(c.graph, wanted, c.outputs);
    jit::Plan forward(graph::optimize(graphs.forward), c.device, c.training, "hybridized " + name() + " (recording)");
    jit::Plan backward(graph::optimize(graphs.backward), c.device, c.training, "backward of hybridized " + name());
    const std::size_t vars = c.sources.size(), outputs = c.graph.outputs.size();  // with the state updates
    std::vector<std::size_t> binding;
    for (int v : backward.graph().vars()) {
      const std::string& var = backward.graph().nodes[static_cast<std::size_t>(v)].name;
      std::size_t at = 0;
      if (var.starts_with("saved")) {
        at = vars + std::stoul(var.substr(5));
      } else if (var.starts_with("head_grad")) {
        at = vars + graphs.saved + std::stoul(var.substr(9));
      } else {
        const auto forward_vars = c.graph.vars();
        while (at < vars && c.graph.nodes[static_cast<std::size_t>(forward_vars[at])].name != var) ++at;
      }
      binding.push_back(at);
    }
    slot = std::make_shared<const Training>(
        Training{std::move(forward), std::move(backward), outputs, std::move(binding), vars, vars + graphs.saved});
    return slot;
  }

  // Applies a plan's state updates (its outputs after the graph's own) and
  // returns the graph's own outputs.
  std::vector<Tensor> apply_updates(const Captured& c, std::vector<Tensor> results) const {
    if (c.updates.empty()) return results;
    autograd::pause not_recorded(true);
    for (std::size_t k = 0; k < c.updates.size(); ++k) {
      const auto& [target, momentum] = c.updates[k];
      Tensor t = target.data(c.device);
      t.assign(t * momentum + results[c.outputs + k] * (1 - momentum));
    }
    results.resize(c.outputs);
    return results;
  }

  // A hybridized call under autograd::record: the forward that keeps what
  // the backward reads, recorded as one node whose rule is the compiled
  // backward.
  std::vector<Tensor> call_recorded(Captured& c, std::vector<Tensor> values, const std::vector<bool>& wanted) {
    std::shared_ptr<const Training> t = training_plan(c, wanted);
    std::vector<Tensor> results = t->forward(values);
    std::vector<Tensor> outputs =
        apply_updates(c, std::vector<Tensor>(results.begin(), results.begin() + static_cast<std::ptrdiff_t>(t->outputs)));
    // Everything the backward binds, in binding order: vars, saved values, then (at call time) head gradients.
    std::vector<Tensor> bound;
    for (const auto& v : values) bound.push_back(v.detach());
    bound.insert(bound.end(), results.begin() + static_cast<std::ptrdiff_t>(t->outputs), results.end());
    auto backward = [t, bound, wanted](std::span<const Tensor> output_grads) {
      std::vector<Tensor> in;
      for (std::size_t at : t->binding)
        in.push_back(at < t->head_base ? bound[at] : output_grads[at - t->head_base]);
      std::vector<Tensor> grads = t->backward(std::move(in)), out(wanted.size());
      for (std::size_t k = 0, next = 0; k < wanted.size(); ++k)
        if (wanted[k]) out[k] = grads[next++];
      return out;
    };
    autograd::record_node("hybridized " + name(), {}, std::move(values), {}, outputs, std::move(backward));
    return outputs;
  }

  bool active_ = false;
  std::map<Key, std::unique_ptr<Captured>> cache_;
  Captured* last_ = nullptr;
};

namespace detail {
// Whether Derived's hybrid_forward takes N operands of type F.
template <class Derived, class F, std::size_t N>
constexpr bool forward_takes() {
  return []<std::size_t... I>(std::index_sequence<I...>) {
    return requires(Derived& d, const F& x) { d.hybrid_forward(((void)I, x)...); };
  }(std::make_index_sequence<N>{});
}
// The input counts a hybrid block can be called with: those of its
// hybrid_forward's overloads, up to 8.
inline constexpr std::size_t max_block_inputs = 8;
template <class Derived>
constexpr std::size_t fewest_inputs() {
  return []<std::size_t... N>(std::index_sequence<N...>) {
    std::size_t fewest = 0;
    ((fewest = fewest ? fewest : (forward_takes<Derived, Tensor, N + 1>() ? N + 1 : 0)), ...);
    return fewest;
  }(std::make_index_sequence<max_block_inputs>{});
}

template <class R>
concept tuple_of_outputs = requires { std::tuple_size<std::remove_cvref_t<R>>::value; };

// A forward's result as its list of outputs: one F, a std::vector<F>, or a
// std::tuple (or pair, or array) of them.
template <class F, class R>
std::vector<F> outputs_of(R&& r) {
  if constexpr (std::same_as<std::remove_cvref_t<R>, std::vector<F>>) {
    return std::forward<R>(r);
  } else if constexpr (tuple_of_outputs<R>) {
    return std::apply([](auto&&... o) { return std::vector<F>{F(std::forward<decltype(o)>(o))...}; },
                      std::forward<R>(r));
  } else {
    return {F(std::forward<R>(r))};
  }
}

// A captured plan's outputs as the eager forward returns them (R): a
// std::vector or tuple of Tensors as it is, anything else as one Tensor.
template <class R>
auto from_outputs(std::vector<Tensor> outs) {
  using T = std::remove_cvref_t<R>;
  if constexpr (std::same_as<T, std::vector<Tensor>>) {
    return outs;
  } else if constexpr (tuple_of_outputs<T>) {
    if (outs.size() != std::tuple_size_v<T>)
      fail<ValueError>("a block's plan gave ", outs.size(), " outputs for a forward of ", std::tuple_size_v<T>);
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return T{std::move(outs[I])...};
    }(std::make_index_sequence<std::tuple_size_v<T>>{});
  } else {
    return std::move(outs.front());
  }
}
}  // namespace detail

// The base of a user's hybrid block: Derived defines
// `template <class F> F hybrid_forward(const F& x)`, used for both modes. It
// may take several inputs (`hybrid_forward(const F& x, const F& mask)`, and
// overloads of other counts) and give several outputs (a std::vector<F>, or
// a std::tuple of F): `block(x, mask)`, `auto [y, weights] = block(x, mask)`.
// A graph of one input calls it "data", one of several "data0", "data1", ...,
// as Gluon does. The forwards are defined outside the class, so not inline:
// for hybra's own layers (HYBRA_SEPARABLE_CLASS(HybridBlock<Layer>) after
// each) a separately compiled program instantiates them once.
template <class Derived>
class HybridBlock : public HybridBase {
 public:
  using HybridBase::HybridBase;
  // One input and one output, Block's interface (what a container calls):
  // for a block of other counts, a ValueError that says so.
  Tensor forward(const Tensor& x) override;
  Symbol forward(const Symbol& x) override;
  // Those of its hybrid_forward of fewest inputs.
  std::vector<std::string> input_names() const override {
    return graph_input_names(detail::fewest_inputs<Derived>());
  }

  // Every input, as its hybrid_forward takes them; the result is what that
  // returns, eager or hybridized.
  template <class... More>
    requires(std::same_as<More, Tensor> && ...)
  auto operator()(const Tensor& x, const More&... more);
  // Inside a parent's capture: the child's forward, inlined into its graph.
  template <class... More>
    requires(std::same_as<More, Symbol> && ...)
  auto operator()(const Symbol& x, const More&... more) {
    static_assert(detail::forward_takes<Derived, Symbol, 1 + sizeof...(More)>(),
                  "hybra: a hybrid block takes the inputs its hybrid_forward takes, as many and as Symbols");
    return self().hybrid_forward(x, more...);
  }

 protected:
  std::vector<Symbol> forward_all(const std::vector<Symbol>& inputs) override;

 private:
  Derived& self() { return static_cast<Derived&>(*this); }
  // One input, one Tensor out: Block's own call (capture, observers, devices).
  static constexpr bool one_to_one() {
    if constexpr (detail::fewest_inputs<Derived>() != 1) return false;
    else return std::same_as<decltype(std::declval<Derived&>().hybrid_forward(std::declval<const Tensor&>())), Tensor>;
  }
  [[noreturn]] void fail_count(std::size_t count) const;
};

template <class Derived>
Tensor HybridBlock<Derived>::forward(const Tensor& x) {
  if constexpr (one_to_one()) return self().hybrid_forward(x);
  else fail_count(1);
}
template <class Derived>
Symbol HybridBlock<Derived>::forward(const Symbol& x) {
  if constexpr (one_to_one()) return self().hybrid_forward(x);
  else fail_count(1);
}
template <class Derived>
std::vector<Symbol> HybridBlock<Derived>::forward_all(const std::vector<Symbol>& inputs) {
  std::optional<std::vector<Symbol>> outs;
  [&]<std::size_t... N>(std::index_sequence<N...>) {
    ([&] {
      if constexpr (detail::forward_takes<Derived, Symbol, N + 1>()) {
        if (inputs.size() == N + 1)
          outs = [&]<std::size_t... I>(std::index_sequence<I...>) {
            return detail::outputs_of<Symbol>(self().hybrid_forward(inputs[I]...));
          }(std::make_index_sequence<N + 1>{});
      }
    }(), ...);
  }(std::make_index_sequence<detail::max_block_inputs>{});
  if (!outs) fail_count(inputs.size());
  return *std::move(outs);
}
template <class Derived>
void HybridBlock<Derived>::fail_count(std::size_t count) const {
  std::string counts;
  [&]<std::size_t... N>(std::index_sequence<N...>) {
    ([&] {
      if constexpr (detail::forward_takes<Derived, Tensor, N + 1>())
        counts += (counts.empty() ? "" : " or ") + std::to_string(N + 1);
    }(), ...);
  }(std::make_index_sequence<detail::max_block_inputs>{});
  fail<ValueError>("block '", name(), "' takes ", counts, " inputs, not ", count,
                   count == 1 ? ", or gives several outputs: call it as itself, block(x, ...), not through a container"
                              : "");
}
template <class Derived>
template <class... More>
  requires(std::same_as<More, Tensor> && ...)
auto HybridBlock<Derived>::operator()(const Tensor& x, const More&... more) {
  static_assert(detail::forward_takes<Derived, Tensor, 1 + sizeof...(More)>(),
                "hybra: a hybrid block takes the inputs its hybrid_forward takes, as many and as Tensors");
  if constexpr (sizeof...(More) == 0 && one_to_one()) {
    return Block::operator()(x);
  } else {
    using Result = decltype(self().hybrid_forward(x, more...));
    const std::array<Tensor, 1 + sizeof...(More)> in{x, more...};
    detail::forward_device_scope on(checked(x).device());
    if (hybridized() && !detail::call_observer) return detail::from_outputs<Result>(call_captured(in));
    if (detail::call_observer) detail::call_observer->enter(*this);
    auto result = detail::from_outputs<Result>(detail::outputs_of<Tensor>(self().hybrid_forward(x, more...)));
    if (detail::call_observer) detail::call_observer->leave(*this, detail::outputs_of<Tensor>(result).front());
    return result;
  }
}

}  // namespace hybra::nn
