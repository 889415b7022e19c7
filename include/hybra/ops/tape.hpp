#pragma once
// Recording (MXNet's autograd.record): while a `record` scope is open on a
// thread, every eager op whose operands need a gradient notes itself on the
// tape: its op name and attributes (the registry's, graph/registry.hpp), its
// operand tensors and its result's value. The tape is not a list: each result
// tensor points at the node that made it, and each node holds its operands,
// so the recorded graph lives exactly as long as the tensors computed from it.
// backward() (autograd/backward.hpp) walks it from the head back to the
// leaves that attach_grad() marked. It sits in ops/, below expr/, since
// every eager op and expression records itself here; the namespace is the
// user's (autograd::record), as for core/mode.hpp's flag.
//
// Ops record from their public function, after their operands are evaluated:
//   autograd::op_record rec("sum", {x});      // pauses recording inside the op
//   ...
//   return rec.output(out, [&] { return reduce_attrs(axes, keepdims); });
// The attributes are built only when the op is recorded.
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../core/creation.hpp"
#include "../core/mode.hpp"
#include "attrs.hpp"

namespace hybra::autograd {

// What backward does with a leaf's gradient: overwrite it, add to it
// (accumulate over several backward passes), or nothing (a frozen value).
enum class GradReq { write, add, null };

inline GradReq parse_grad_req(std::string_view req, std::string_view who) {
  if (req == "write") return GradReq::write;
  if (req == "add") return GradReq::add;
  if (req == "null") return GradReq::null;
  fail<ValueError>(who, ": grad_req '", req, "' is not write, add or null");
}

// One recorded op. Its outputs keep their values only (not their own
// entries), so a node never owns itself.
struct Node {
  std::string op;  // a registry op, or a description when `backward` is set
  op::Attrs attrs;
  std::vector<Tensor> inputs;
  std::vector<bool> weak;  // inputs that were C++ scalars (0-d tensors of their dtype)
  std::vector<Tensor> outputs;
  // The gradients of the inputs from those of the outputs, for what has no
  // registry rule: a captured graph (its compiled backward plan), a copy
  // between devices. Empty for registry ops.
  std::function<std::vector<Tensor>(std::span<const Tensor> output_grads)> backward;
};

// A tensor's place in autograd: either a leaf (attach_grad: its gradient
// buffer) or output `index` of a recorded node.
struct Entry {
  std::shared_ptr<const Node> node;
  std::size_t index = 0;
  Tensor grad;
  GradReq req = GradReq::write;
};

namespace detail {
inline thread_local bool recording = false;
}

inline bool is_recording() { return detail::recording; }

// Whether backward from t reaches anything: t is a recorded result or a leaf
// with a gradient buffer.
inline bool requires_grad(const Tensor& t) {
  const auto& e = t.autograd_entry();
  return e && (e->node || e->req != GradReq::null);
}

namespace detail {
// Sets recording and the training mode for the current thread until the end
// of the scope.
class recording_scope {
 public:
  recording_scope(bool on, bool train_mode) : saved_(recording), mode_(train_mode) { recording = on; }
  recording_scope(const recording_scope&) = delete;
  recording_scope& operator=(const recording_scope&) = delete;
  ~recording_scope() { recording = saved_; }

 private:
  bool saved_;
  mode_scope mode_;
};
}  // namespace detail

// Records (and sets the training mode, as MXNet's record(train_mode=True))
// until the end of the scope.
class record : detail::recording_scope {
 public:
  explicit record(bool train_mode = true) : recording_scope(true, train_mode) {}
};

// Stops recording (MXNet's pause(train_mode=False)) until the end of the scope.
class pause : detail::recording_scope {
 public:
  explicit pause(bool train_mode = false) : recording_scope(false, train_mode) {}
};

// Makes `outputs` the results of a new node that has `backward` as its rule
// (or the registry's rule of `op` when `backward` is empty).
inline void record_node(std::string op, op::Attrs attrs, std::vector<Tensor> inputs, std::vector<bool> weak,
                        std::span<Tensor> outputs,
                        std::function<std::vector<Tensor>(std::span<const Tensor>)> backward = {}) {
  auto node = std::make_shared<Node>();
  node->op = std::move(op);
  node->attrs = std::move(attrs);
  node->inputs = std::move(inputs);
  node->weak = weak.empty() ? std::vector<bool>(node->inputs.size(), false) : std::move(weak);
  node->backward = std::move(backward);
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    node->outputs.push_back(outputs[i].detach());
    auto entry = std::make_shared<Entry>();
    entry->node = node;
    entry->index = i;
    outputs[i].set_autograd_entry(std::move(entry));
  }
}

// The recording half of one eager op (see the top of this file). While the
// op runs, recording is paused, so the ops it is made of are not recorded
// as well.
class op_record {
 public:
  op_record(std::string_view op, std::initializer_list<Tensor> inputs) : op_record(op, std::span<const Tensor>(inputs.begin(), inputs.size())) {}
  op_record(std::string_view op, std::span<const Tensor> inputs) {
    if (!is_recording()) return;
    for (const auto& t : inputs) active_ = active_ || requires_grad(t);
    if (!active_) return;
    op_ = op;
    inputs_.assign(inputs.begin(), inputs.end());
    detail::recording = false;
  }
  op_record(const op_record&) = delete;
  op_record& operator=(const op_record&) = delete;
  ~op_record() {
    if (active_) detail::recording = true;
  }

  bool active() const { return active_; }

  template <class AttrsFn>
  Tensor output(Tensor out, AttrsFn&& attrs) {
    if (active_) record_node(std::string(op_), attrs(), std::move(inputs_), {}, std::span<Tensor>(&out, 1));
    return out;
  }
  Tensor output(Tensor out) {
    return output(std::move(out), [] { return op::Attrs{}; });
  }
  // For an op with no registry entry: its own rule.
  Tensor output_with_rule(Tensor out, std::function<std::vector<Tensor>(std::span<const Tensor>)> backward) {
    if (active_)
      record_node(std::string(op_), {}, std::move(inputs_), {}, std::span<Tensor>(&out, 1), std::move(backward));
    return out;
  }

 private:
  bool active_ = false;
  std::string_view op_;
  std::vector<Tensor> inputs_;
};

}  // namespace hybra::autograd

namespace hybra {

inline void Tensor::attach_grad(std::string_view grad_req) {
  auto entry = std::make_shared<autograd::Entry>();
  entry->req = autograd::parse_grad_req(grad_req, "attach_grad");
  entry->grad = zeros(require("attach_grad").shape(), dtype_, device());
  autograd_ = std::move(entry);
}

inline Tensor Tensor::grad() const {
  if (!autograd_ || autograd_->node || !autograd_->grad.defined())
    fail<ValueError>("grad: this tensor has no gradient buffer; call attach_grad() on it before recording");
  return autograd_->grad;
}

}  // namespace hybra
