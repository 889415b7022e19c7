#pragma once
// The gradient rules of every op, generated from the op table
// (ops/table.hpp): each op's `gradient` facet, a template over this file's
// GradContext, which gives it the operands, the result, the result's
// gradient and the symbolic functions it composes (graph/compose.hpp); a compile-time check
// refuses an op without one (unless only gradients make it). A rule is
// written once, over symbols: it adds the nodes that compute the operands'
// gradients. The eager tape (backward.hpp) calls it with constants (the
// recorded values) and runs the nodes; a captured graph's backward calls it
// with the graph's own nodes and compiles the result like any graph.
//
// A rule may return a gradient of any shape that broadcasts to its operand's
// (an elementwise op returns the result's shape) and any float dtype:
// `input_gradients` sums it down to the operand's shape and converts it.
#include <functional>
#include <numeric>
#include <span>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../core/separate_compilation.hpp"
#include "../graph/compose.hpp"

namespace hybra::autograd {

namespace detail {
// The axes of `from` that broadcasting added or stretched to reach it from `to`.
inline std::vector<std::int64_t> broadcast_axes(const Shape& from, const Shape& to) {
  std::vector<std::int64_t> axes;
  const std::size_t lead = from.size() - std::min(from.size(), to.size());
  for (std::size_t d = 0; d < from.size(); ++d)
    if (d < lead || (to[d - lead] == 1 && from[d] != 1)) axes.push_back(static_cast<std::int64_t>(d));
  return axes;
}
}  // namespace detail

// What a gradient rule is given beyond the node's operands and attributes:
// the result, its gradient and which operands want one.
struct GradContext : graph::RuleContext {
  Symbol out;                // the op's result
  Symbol dy;                 // the gradient of its result
  std::vector<bool> wanted;  // which operands need a gradient

  // The operands' gradients, in order (fewer than the operands: the rest get none).
  template <class... X>
  static std::vector<Symbol> grads(X&&... x) {
    return {Symbol(std::forward<X>(x))...};
  }
  static op::Attrs with_shape(op::Attrs attrs, const Shape& shape) {
    attrs.emplace_back("shape", op::attr_text(shape));
    return attrs;
  }

  // g summed over its broadcast axes and reshaped to `shape` (the inverse of
  // broadcasting `shape` to g's shape).
  static Symbol sum_to(const Symbol& g, const Shape& shape) {
    if (g.shape() == shape) return g;
    auto axes = detail::broadcast_axes(g.shape(), shape);
    Symbol r = axes.empty() ? g : hybra::sum(g, axes, false);
    if (r.shape() != shape)
      r = checked_numel(r.shape()) == checked_numel(shape) ? hybra::reshape(r, shape) : hybra::broadcast_to(r, shape);
    return r;
  }
  // The last two axes swapped.
  static Symbol swap_last(const Symbol& s) {
    std::vector<std::int64_t> axes(static_cast<std::size_t>(s.ndim()));
    std::iota(axes.begin(), axes.end(), 0);
    std::swap(axes[axes.size() - 1], axes[axes.size() - 2]);
    return hybra::transpose(s, axes);
  }
  // A reduction's axes attribute (None: every axis).
  Axes reduced_axes() const {
    auto axes = op::optional_tuple_attr(attrs, "axis", "gradient");
    return axes ? Axes(*axes) : Axes();
  }
  // A reduction's result-shaped value (its result, or the result's gradient)
  // with the reduced axes put back as size 1, so that it broadcasts to the input.
  Symbol keep_reduced_axes(const Symbol& v) const {
    if (op::bool_attr(attrs, "keepdims", "gradient")) return v;
    const Shape& x = shape(0);
    Shape kept = x;
    const Axes reduced = reduced_axes();
    const auto& axes = reduced.list();
    if (!axes) std::fill(kept.begin(), kept.end(), 1);
    else
      for (auto a : *axes) kept[static_cast<std::size_t>(normalize_axis(a, x.size(), "gradient"))] = 1;
    return hybra::reshape(v, kept);
  }
};

using GradRule = std::vector<Symbol> (*)(const GradContext&);

namespace detail {

template <class Op>
constexpr GradRule rule_of() {
  if constexpr (op::gradient_only<Op>) {
    static_assert(!op::differentiable<Op, GradContext>, "hybra: an op only gradients make has no gradient of its own");
    return nullptr;
  } else {
    static_assert(op::differentiable<Op, GradContext>,
                  "hybra: every op needs gradient(g) (ops/op.hpp), or `g.grads()` where none flows");
    return [](const GradContext& c) -> std::vector<Symbol> { return Op::gradient(c); };
  }
}

HYBRA_SEPARABLE const std::unordered_map<std::string_view, GradRule>& rules();
#if HYBRA_DEFINE_SEPARABLE
HYBRA_SEPARABLE const std::unordered_map<std::string_view, GradRule>& rules() {
  static const auto table = op::by_name<GradRule>([]<class Op>() { return rule_of<Op>(); });
  return table;
}
#endif

}  // namespace detail

// Whether the registry op has a rule (ops that only gradients use have none:
// hybra differentiates once).
inline bool has_gradient(std::string_view op) {
  auto it = detail::rules().find(op);
  return it != detail::rules().end() && it->second != nullptr;
}
inline bool has_rule_entry(std::string_view op) { return detail::rules().count(op) > 0; }

// The gradients of an op's operands (an undefined Symbol where none is
// wanted or none exists), each of its operand's shape and dtype.
inline std::vector<Symbol> input_gradients(std::string_view op, const GradContext& c) {
  auto it = detail::rules().find(op);
  if (it == detail::rules().end() || it->second == nullptr)
    fail<ValueError>("backward: op '", op, "' has no gradient (", it == detail::rules().end() ? "unknown op" : "an op of gradients themselves: hybra differentiates once", ")");
  std::vector<Symbol> g = it->second(c);
  g.resize(c.in.size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (!c.wanted[i] || !g[i].defined()) {
      g[i] = Symbol();
      continue;
    }
    g[i] = GradContext::sum_to(g[i], c.shape(i));
    if (g[i].dtype() != c.in[i].dtype()) g[i] = g[i].astype(c.in[i].dtype());
  }
  return g;
}

}  // namespace hybra::autograd
