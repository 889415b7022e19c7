#pragma once
// backward: from recorded results back to the tensors that attach_grad
// marked (eager), and `grad`: the same over symbols (the gradient graph of a
// captured graph). Both walk their graph from the heads in reverse
// topological order, summing each value's gradient over its uses, and ask
// each op's rule (gradients.hpp) for its operands' gradients.
#include <algorithm>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "../graph/graph.hpp"
#include "gradients.hpp"
#include "../ops/tape.hpp"

namespace hybra::autograd {

namespace detail {

// A recorded operand as a symbol: a constant of its value, or a weak scalar.
inline Symbol operand_symbol(const Tensor& value, bool weak) {
  if (!weak) return sym::constant(value.detach());
  return dispatch(value.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    return graph::scalar_symbol(value.item<T>());
  });
}

// The gradients of one recorded node's operands from its outputs' gradients.
inline std::vector<Tensor> node_input_gradients(const Node& node, std::vector<Tensor>& output_grads,
                                                const std::vector<bool>& wanted) {
  for (std::size_t k = 0; k < output_grads.size(); ++k)
    if (!output_grads[k].defined()) output_grads[k] = zeros(node.outputs[k].shape(), node.outputs[k].dtype(), node.outputs[k].device());
  if (node.backward) return node.backward(output_grads);
  std::vector<Symbol> in;
  for (std::size_t i = 0; i < node.inputs.size(); ++i) in.push_back(operand_symbol(node.inputs[i], node.weak[i]));
  const GradContext c{{in, node.attrs, "gradient"}, sym::constant(node.outputs[0]), sym::constant(output_grads[0]), wanted};
  std::vector<Symbol> grads = input_gradients(node.op, c), defined;
  for (const auto& g : grads)
    if (g.defined()) defined.push_back(g);
  std::vector<Tensor> values = defined.empty() ? std::vector<Tensor>{} : graph::run(graph::trace(defined), {});
  std::vector<Tensor> out(grads.size());
  for (std::size_t i = 0, k = 0; i < grads.size(); ++i)
    if (grads[i].defined()) out[i] = values[k++];
  return out;
}

inline Tensor add_gradient(const Tensor& sum, const Tensor& g) { return sum.defined() ? Tensor(sum + g) : g; }

}  // namespace detail

// Fills the gradient buffers of the leaves (attach_grad) that the heads were
// recorded from: d(sum of heads[k] * head_grads[k]) / d(leaf). A head's
// gradient defaults to ones. grad_req "write" replaces a buffer's values,
// "add" adds to them.
inline void backward(const std::vector<Tensor>& heads, const std::vector<Tensor>& head_grads = {}) {
  if (!head_grads.empty() && head_grads.size() != heads.size())
    fail<ValueError>("backward: ", heads.size(), " heads but ", head_grads.size(), " head gradients");
  pause no_recording(is_training());
  // Nodes in topological order (operands first), by an explicit stack: a
  // recorded loop of thousands of steps must not overflow the call stack.
  std::vector<const Node*> order;
  std::unordered_set<const Node*> seen;
  for (const auto& h : heads) {
    const auto& e = h.require("backward").autograd_entry();
    if (!e || (!e->node && e->req == GradReq::null))
      fail<ValueError>("backward: a head of shape ", to_string(h.shape()),
                       " was not recorded (compute it inside autograd::record from tensors that attach_grad)");
    if (!e->node || !seen.insert(e->node.get()).second) continue;
    std::vector<std::pair<const Node*, std::size_t>> stack{{e->node.get(), 0}};
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      if (next < node->inputs.size()) {
        const auto& in = node->inputs[next++].autograd_entry();
        if (in && in->node && seen.insert(in->node.get()).second) stack.emplace_back(in->node.get(), 0);
      } else {
        order.push_back(node);
        stack.pop_back();
      }
    }
  }

  std::unordered_map<const Node*, std::vector<Tensor>> output_grads;
  std::vector<std::pair<std::shared_ptr<Entry>, Tensor>> leaves;
  auto accumulate = [&](const Tensor& t, const Tensor& g) {
    const auto& e = t.autograd_entry();
    if (!e) return;
    if (e->node) {
      auto& slot = output_grads[e->node.get()];
      slot.resize(e->node->outputs.size());
      slot[e->index] = detail::add_gradient(slot[e->index], g);
    } else if (e->req != GradReq::null) {
      auto it = std::find_if(leaves.begin(), leaves.end(), [&](const auto& l) { return l.first == e; });
      if (it == leaves.end()) leaves.emplace_back(e, g);
      else it->second = detail::add_gradient(it->second, g);
    }
  };
  for (std::size_t k = 0; k < heads.size(); ++k) {
    const Tensor& h = heads[k];
    Tensor g = head_grads.empty() || !head_grads[k].defined() ? ones(h.shape(), h.dtype(), h.device()) : head_grads[k];
    if (g.shape() != h.shape())
      fail<ShapeError>("backward: head gradient of shape ", to_string(g.shape()), " does not match head of shape ",
                       to_string(h.shape()));
    accumulate(h, g);
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const Node& node = **it;
    auto found = output_grads.find(&node);
    if (found == output_grads.end()) continue;
    std::vector<bool> wanted(node.inputs.size());
    bool any = false;
    for (std::size_t i = 0; i < wanted.size(); ++i) any |= wanted[i] = !node.weak[i] && requires_grad(node.inputs[i]);
    if (any) {
      auto grads = detail::node_input_gradients(node, found->second, wanted);
      for (std::size_t i = 0; i < grads.size() && i < wanted.size(); ++i)
        if (wanted[i] && grads[i].defined()) accumulate(node.inputs[i], grads[i]);
    }
    output_grads.erase(found);  // its memory is free as soon as its operands have theirs
  }
  for (auto& [entry, g] : leaves) {
    if (entry->req == GradReq::add) entry->grad.assign(entry->grad + g);
    else entry->grad.assign(g);
  }
}

// The gradients of the heads (weighted by head_grads, which have the heads'
// shapes) with respect to `wrt`, as symbols: the gradient graph, which refers
// to the forward's nodes wherever a rule needs a forward value. A symbol in
// `wrt` that the heads do not depend on gets zeros.
inline std::vector<Symbol> grad(const std::vector<Symbol>& heads, const std::vector<Symbol>& head_grads,
                                const std::vector<Symbol>& wrt) {
  using graph::SymNode;
  if (head_grads.size() != heads.size())
    fail<ValueError>("grad: ", heads.size(), " heads but ", head_grads.size(), " head gradients");
  std::vector<const SymNode*> order;
  std::unordered_set<const SymNode*> seen;
  for (const auto& h : heads) {
    if (!seen.insert(h.require("grad").node_ptr().get()).second) continue;
    std::vector<std::pair<const SymNode*, std::size_t>> stack{{h.node_ptr().get(), 0}};
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      if (next < node->inputs.size()) {
        const SymNode* in = node->inputs[next++].get();
        if (seen.insert(in).second) stack.emplace_back(in, 0);
      } else {
        order.push_back(node);
        stack.pop_back();
      }
    }
  }
  // Which nodes depend on something in wrt: only they carry gradients.
  std::unordered_set<const SymNode*> varying;
  for (const auto& w : wrt) varying.insert(w.require("grad").node_ptr().get());
  std::unordered_map<const SymNode*, std::shared_ptr<const SymNode>> owner;
  for (const SymNode* n : order) {
    for (const auto& in : n->inputs) {
      owner.emplace(in.get(), in);
      if (varying.count(in.get())) varying.insert(n);
    }
  }
  for (const auto& h : heads) owner.emplace(h.node_ptr().get(), h.node_ptr());

  std::unordered_map<const SymNode*, Symbol> grads;
  auto accumulate = [&](const SymNode* n, const Symbol& g) {
    auto [it, fresh] = grads.emplace(n, g);
    if (!fresh) it->second = Symbol(it->second + g);
  };
  for (std::size_t k = 0; k < heads.size(); ++k) accumulate(heads[k].node_ptr().get(), head_grads[k]);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const SymNode* n = *it;
    auto found = grads.find(n);
    if (found == grads.end() || n->op == "var" || n->op == "const" || n->op == "scalar") continue;
    std::vector<Symbol> in;
    std::vector<bool> wanted;
    bool any = false;
    for (const auto& i : n->inputs) {
      in.emplace_back(i);
      wanted.push_back(varying.count(i.get()) > 0);
      any = any || wanted.back();
    }
    if (!any) continue;
    const GradContext c{{in, n->attrs, "gradient"}, Symbol(owner.at(n)), found->second, wanted};
    auto g = input_gradients(n->op, c);
    for (std::size_t i = 0; i < g.size(); ++i)
      if (g[i].defined()) accumulate(n->inputs[i].get(), g[i]);
  }
  std::vector<Symbol> out;
  for (const auto& w : wrt) {
    auto it = grads.find(w.node_ptr().get());
    out.push_back(it != grads.end() ? it->second : sym::constant(zeros(w.shape(), w.dtype())));
  }
  return out;
}

// A captured graph's training pair. `forward` computes the graph's outputs
// and then the values its gradient needs (`saved` of them); `backward`
// computes the gradients of the vars asked for from those saved values, the
// outputs' gradients (vars "head_grad<k>") and whichever of the graph's own
// vars its rules read. The forward runs once: nothing is recomputed, so a
// dropout mask is the one the forward drew.
struct TrainingGraphs {
  graph::Graph forward, backward;
  std::size_t saved = 0;
};

// Only the first `heads` outputs of g get gradients (the others, such as
// BatchNorm's batch statistics, are values the forward also reports).
inline TrainingGraphs training_graphs(const graph::Graph& g, const std::vector<bool>& wanted,
                                      std::size_t heads = static_cast<std::size_t>(-1)) {
  using graph::SymNode;
  std::vector<Symbol> vars;
  std::vector<Symbol> outs = graph::replay(g, [&](const graph::Node& n) {
    vars.push_back(sym::var(n.name, n.meta.shape, n.meta.dtype.value_or(DType::float32)));
    return vars.back();
  });
  std::vector<Symbol> head_grads, wrt;
  const std::vector<Symbol> differentiated(outs.begin(), outs.begin() + static_cast<std::ptrdiff_t>(std::min(heads, outs.size())));
  for (std::size_t k = 0; k < differentiated.size(); ++k)
    head_grads.push_back(sym::var("head_grad" + std::to_string(k), outs[k].shape(), outs[k].dtype()));
  for (std::size_t k = 0; k < vars.size(); ++k)
    if (wanted.at(k)) wrt.push_back(vars[k]);
  const std::vector<Symbol> grads = grad(differentiated, head_grads, wrt);

  std::unordered_set<const SymNode*> forward_nodes;
  std::vector<const SymNode*> stack;
  for (const auto& o : outs) stack.push_back(o.node_ptr().get());
  while (!stack.empty()) {
    const SymNode* n = stack.back();
    stack.pop_back();
    if (!forward_nodes.insert(n).second) continue;
    for (const auto& in : n->inputs) stack.push_back(in.get());
  }
  // The gradient graph with every forward value it reads (other than a var
  // or constant) replaced by a var of its own, bound to the saved value.
  std::vector<Symbol> saved;
  std::unordered_map<const SymNode*, Symbol> rebuilt;
  auto rebuild = [&](auto& self, const std::shared_ptr<const SymNode>& n) -> Symbol {
    if (auto it = rebuilt.find(n.get()); it != rebuilt.end()) return it->second;
    Symbol r;
    if (n->op == "var" || n->op == "const" || n->op == "scalar") {
      r = Symbol(n);
    } else if (forward_nodes.count(n.get())) {
      r = sym::var("saved" + std::to_string(saved.size()), n->meta.shape, n->meta.dtype.value_or(DType::float32));
      saved.emplace_back(n);
    } else {
      std::vector<Symbol> in;
      for (const auto& i : n->inputs) in.push_back(self(self, i));
      r = graph::make_symbol(n->op, n->attrs, std::move(in));
    }
    rebuilt.emplace(n.get(), r);
    return r;
  };
  std::vector<Symbol> backward_outs;
  for (const auto& gs : grads) backward_outs.push_back(rebuild(rebuild, gs.node_ptr()));
  std::vector<Symbol> forward_outs = outs;
  forward_outs.insert(forward_outs.end(), saved.begin(), saved.end());
  return TrainingGraphs{graph::trace(forward_outs), graph::trace(backward_outs), saved.size()};
}

}  // namespace hybra::autograd

namespace hybra {

inline void Tensor::backward() const { autograd::backward({*this}); }
inline void Tensor::backward(const Tensor& head_grad) const { autograd::backward({*this}, {head_grad}); }

}  // namespace hybra
