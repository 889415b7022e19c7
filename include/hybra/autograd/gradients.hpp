#pragma once
// The gradient rule of every op of the registry (graph/registry.hpp), in one
// table by op name, as io/mxnet_graph.hpp holds every op's file spelling; a
// test fails for any registry op without a rule. A rule is written once, over
// symbols: it adds the nodes that compute the operands' gradients from the
// operands, the result and the result's gradient. The eager tape
// (backward.hpp) calls it with constants (the recorded values) and runs the
// nodes; a captured graph's backward calls it with the graph's own nodes and
// compiles the result like any graph.
//
// A rule may return a gradient of any shape that broadcasts to its operand's
// (an elementwise op returns the result's shape) and any float dtype:
// `input_gradients` sums it down to the operand's shape and converts it.
#include <functional>
#include <numeric>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "../core/separate_compilation.hpp"
#include "../graph/symbol.hpp"

namespace hybra::autograd {

struct GradContext {
  std::span<const Symbol> in;  // the op's operands
  Symbol out;                  // its result
  Symbol dy;                   // the gradient of its result
  const graph::Attrs& attrs;
  std::vector<bool> wanted;  // which operands need a gradient

  const Shape& shape(std::size_t i) const { return in[i].shape(); }
  std::int64_t int_attr(std::string_view key) const {
    return graph::parse_int(graph::find_attr(attrs, key, "gradient"), "gradient");
  }
};

using GradRule = std::vector<Symbol> (*)(const GradContext&);

namespace detail {

// The axes of `from` that broadcasting added or stretched to reach it from `to`.
inline std::vector<std::int64_t> broadcast_axes(const Shape& from, const Shape& to) {
  std::vector<std::int64_t> axes;
  const std::size_t lead = from.size() - std::min(from.size(), to.size());
  for (std::size_t d = 0; d < from.size(); ++d)
    if (d < lead || (to[d - lead] == 1 && from[d] != 1)) axes.push_back(static_cast<std::int64_t>(d));
  return axes;
}

// g summed over its broadcast axes and reshaped to `shape` (the inverse of
// broadcasting `shape` to g's shape).
inline Symbol sum_to(const Symbol& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  auto axes = broadcast_axes(g.shape(), shape);
  Symbol r = axes.empty() ? g : sum(g, axes, false);
  if (r.shape() != shape) r = checked_numel(r.shape()) == checked_numel(shape) ? reshape(r, shape) : broadcast_to(r, shape);
  return r;
}

// A reduction's axes attribute (None: every axis).
inline Axes reduced_axes(const GradContext& c) {
  auto axes = graph::parse_optional(graph::find_attr(c.attrs, "axis", "gradient"),
                                    [](std::string_view t) { return graph::parse_tuple(t, "gradient"); });
  return axes ? Axes(*axes) : Axes();
}

// A reduction's result-shaped value (its result, or the result's gradient)
// with the reduced axes put back as size 1, so that it broadcasts to the input.
inline Symbol keep_reduced_axes(const GradContext& c, const Symbol& v) {
  if (graph::parse_bool(graph::find_attr(c.attrs, "keepdims", "gradient"), "gradient")) return v;
  const Shape& x = c.shape(0);
  Shape kept = x;
  const Axes reduced = reduced_axes(c);
  const auto& axes = reduced.list();
  if (!axes) std::fill(kept.begin(), kept.end(), 1);
  else
    for (auto a : *axes) kept[static_cast<std::size_t>(normalize_axis(a, x.size(), "gradient"))] = 1;
  return reshape(v, kept);
}

// The last two axes swapped.
inline Symbol swap_last(const Symbol& s) {
  std::vector<std::int64_t> axes(static_cast<std::size_t>(s.ndim()));
  std::iota(axes.begin(), axes.end(), 0);
  std::swap(axes[axes.size() - 1], axes[axes.size() - 2]);
  return transpose(s, axes);
}

// The minimum and maximum: the gradient goes to the elements equal to the
// result, shared equally among ties.
inline std::vector<Symbol> extreme_rule(const GradContext& c) {
  const Shape& x = c.shape(0);
  Symbol hit = Symbol(c.in[0] == keep_reduced_axes(c, c.out)).astype(c.dy.dtype());
  Symbol ties = sum(hit, reduced_axes(c), true);
  return {Symbol(hit * broadcast_to(keep_reduced_axes(c, c.dy), x) / ties)};
}

inline graph::Attrs with_shape(graph::Attrs attrs, const Shape& shape) {
  attrs.emplace_back("shape", graph::attr_text(shape));
  return attrs;
}

HYBRA_SEPARABLE const std::unordered_map<std::string_view, GradRule>& rules();
#if HYBRA_DEFINE_SEPARABLE
HYBRA_SEPARABLE const std::unordered_map<std::string_view, GradRule>& rules() {
  using C = const GradContext&;
  using V = std::vector<Symbol>;
  static const std::unordered_map<std::string_view, GradRule> table = {
      {"add", [](C c) -> V { return {c.dy, c.dy}; }},
      {"subtract", [](C c) -> V { return {c.dy, Symbol(-c.dy)}; }},
      {"multiply", [](C c) -> V { return {Symbol(c.dy * c.in[1]), Symbol(c.dy * c.in[0])}; }},
      {"divide", [](C c) -> V { return {Symbol(c.dy / c.in[1]), Symbol(-c.dy * c.out / c.in[1])}; }},
      {"negative", [](C c) -> V { return {Symbol(-c.dy)}; }},
      {"exp", [](C c) -> V { return {Symbol(c.dy * c.out)}; }},
      {"log", [](C c) -> V { return {Symbol(c.dy / c.in[0])}; }},
      {"sqrt", [](C c) -> V { return {Symbol(c.dy * 0.5 / c.out)}; }},
      {"abs", [](C c) -> V { return {Symbol(where(c.in[0] < 0, -c.dy, c.dy))}; }},
      {"tanh", [](C c) -> V { return {Symbol(c.dy * (1 - c.out * c.out))}; }},
      {"sigmoid", [](C c) -> V { return {Symbol(c.dy * c.out * (1 - c.out))}; }},
      // From the result (relu(x) > 0 exactly where x > 0): a captured graph's
      // backward then keeps only the result, so a product before the relu
      // keeps it as its epilogue in training too.
      {"relu", [](C c) -> V { return {Symbol(where(c.out > 0, c.dy, 0))}; }},
      {"pow",
       [](C c) -> V {
         V g(2);
         if (c.wanted[0]) g[0] = Symbol(c.dy * c.in[1] * pow(c.in[0], c.in[1] - 1));
         if (c.wanted[1]) g[1] = Symbol(c.dy * c.out * log(c.in[0]));
         return g;
       }},
      {"maximum",
       [](C c) -> V {
         Symbol first = c.in[0] >= c.in[1];
         return {Symbol(where(first, c.dy, 0)), Symbol(where(first, 0, c.dy))};
       }},
      {"minimum",
       [](C c) -> V {
         Symbol first = c.in[0] <= c.in[1];
         return {Symbol(where(first, c.dy, 0)), Symbol(where(first, 0, c.dy))};
       }},
      {"where", [](C c) -> V { return {Symbol(), Symbol(where(c.in[0], c.dy, 0)), Symbol(where(c.in[0], 0, c.dy))}; }},
      // Comparisons are piecewise constant, argmax an index: no gradient.
      {"less", [](C) -> V { return {}; }},
      {"less_equal", [](C) -> V { return {}; }},
      {"greater", [](C) -> V { return {}; }},
      {"greater_equal", [](C) -> V { return {}; }},
      {"equal", [](C) -> V { return {}; }},
      {"not_equal", [](C) -> V { return {}; }},
      {"argmax", [](C) -> V { return {}; }},
      {"matmul",
       [](C c) -> V {
         // 1-d operands as the row and column they stand for; batch dims broadcast (sum_to undoes it).
         const bool row = c.shape(0).size() == 1, col = c.shape(1).size() == 1;
         Symbol a = row ? reshape(c.in[0], {1, c.shape(0)[0]}) : c.in[0];
         Symbol b = col ? reshape(c.in[1], {c.shape(1)[0], 1}) : c.in[1];
         Shape out = c.out.shape();
         if (row) {
           // out[..., n] -> out[..., 1, n], as a push and a swap: GCC 12 (-O3)
           // cannot see that an insert before end() - 1 has an element to move,
           // and warns (-Wstringop-overflow) in every program that trains.
           out.push_back(1);
           if (!col) std::swap(out[out.size() - 1], out[out.size() - 2]);
         }
         if (col) out.push_back(1);
         Symbol g = reshape(c.dy, out);
         V r(2);
         if (c.wanted[0]) r[0] = reshape(sum_to(matmul(g, swap_last(b)), a.shape()), c.shape(0));
         if (c.wanted[1]) r[1] = reshape(sum_to(matmul(swap_last(a), g), b.shape()), c.shape(1));
         return r;
       }},
      {"dot",
       [](C c) -> V {
         const Shape &sa = c.shape(0), &sb = c.shape(1);
         if (sa.empty() || sb.empty()) return {Symbol(c.dy * c.in[1]), Symbol(c.dy * c.in[0])};
         // The forward's own layout: a as (P, K) rows, b as (K, rest) with K first.
         const std::int64_t K = sa.back(), P = checked_numel(sa) / K, rest = checked_numel(sb) / K;
         std::vector<std::int64_t> k_first{static_cast<std::int64_t>(sb.size()) - (sb.size() == 1 ? 1 : 2)};
         for (std::size_t d = 0; d < sb.size(); ++d)
           if (static_cast<std::int64_t>(d) != k_first[0]) k_first.push_back(static_cast<std::int64_t>(d));
         Symbol a2 = reshape(c.in[0], {P, K});
         Symbol b2 = reshape(transpose(c.in[1], k_first), {K, rest});
         Symbol g2 = reshape(c.dy, {P, rest});
         V r(2);
         if (c.wanted[0]) r[0] = reshape(matmul(g2, transpose(b2)), sa);
         if (c.wanted[1]) {
           Shape permuted;
           for (auto d : k_first) permuted.push_back(sb[static_cast<std::size_t>(d)]);
           std::vector<std::int64_t> back(k_first.size());
           for (std::size_t i = 0; i < k_first.size(); ++i) back[static_cast<std::size_t>(k_first[i])] = static_cast<std::int64_t>(i);
           r[1] = transpose(reshape(matmul(transpose(a2), g2), permuted), back);
         }
         return r;
       }},
      {"sum", [](C c) -> V { return {broadcast_to(keep_reduced_axes(c, c.dy), c.shape(0))}; }},
      {"mean",
       [](C c) -> V {
         const double count = static_cast<double>(checked_numel(c.shape(0))) /
                              static_cast<double>(std::max<std::int64_t>(1, checked_numel(c.out.shape())));
         return {Symbol(broadcast_to(keep_reduced_axes(c, c.dy), c.shape(0)) / count)};
       }},
      {"max", extreme_rule},
      {"min", extreme_rule},
      {"softmax",
       [](C c) -> V {
         return {Symbol(c.out * (c.dy - sum(Symbol(c.dy * c.out), c.int_attr("axis"), true)))};
       }},
      {"log_softmax",
       [](C c) -> V { return {Symbol(c.dy - exp(c.out) * sum(c.dy, c.int_attr("axis"), true))}; }},
      {"reshape", [](C c) -> V { return {reshape(c.dy, c.shape(0))}; }},
      {"flatten", [](C c) -> V { return {reshape(c.dy, c.shape(0))}; }},
      {"broadcast_to", [](C c) -> V { return {sum_to(c.dy, c.shape(0))}; }},
      {"transpose",
       [](C c) -> V {
         auto axes = graph::parse_optional(graph::find_attr(c.attrs, "axis", "gradient"),
                                           [](std::string_view t) { return graph::parse_tuple(t, "gradient"); });
         if (!axes) return {transpose(c.dy)};
         std::vector<std::int64_t> back(axes->size());
         for (std::size_t i = 0; i < axes->size(); ++i)
           back[static_cast<std::size_t>(normalize_axis((*axes)[i], axes->size(), "gradient"))] = static_cast<std::int64_t>(i);
         return {transpose(c.dy, back)};
       }},
      {"slice",
       [](C c) -> V { return {graph::make_symbol("slice_backward", with_shape(c.attrs, c.shape(0)), {c.dy})}; }},
      {"concat",
       [](C c) -> V {
         const std::int64_t axis = normalize_axis(c.int_attr("axis"), c.shape(0).size(), "gradient");
         V r;
         std::int64_t at = 0;
         for (std::size_t i = 0; i < c.in.size(); ++i) {
           const std::int64_t n = c.shape(i)[static_cast<std::size_t>(axis)];
           r.push_back(slice(c.dy, axis, at, at + n, 1));
           at += n;
         }
         return r;
       }},
      {"astype", [](C c) -> V { return {c.dy}; }},
      {"fully_connected",
       [](C c) -> V {
         V r(c.in.size());
         if (c.wanted[0]) r[0] = reshape(matmul(c.dy, c.in[1]), c.shape(0));
         if (c.wanted[1]) r[1] = matmul(transpose(c.dy), flatten(c.in[0]));
         if (c.in.size() == 3 && c.wanted[2]) r[2] = sum(c.dy, 0);
         return r;
       }},
      // Training dropout's kept elements are the nonzero results (a kept
      // zero gets no gradient, which matters only where x is exactly 0).
      {"dropout",
       [](C c) -> V {
         const double rate = graph::parse_double(graph::find_attr(c.attrs, "rate", "gradient"), "gradient");
         return {Symbol(where(c.out != 0, c.dy * (1 / (1 - rate)), 0))};
       }},
      {"conv2d",
       [](C c) -> V {
         V r(c.in.size());
         if (c.wanted[0]) r[0] = graph::make_symbol("conv2d_backward_data", with_shape(c.attrs, c.shape(0)), {c.dy, c.in[1]});
         if (c.wanted[1])
           r[1] = graph::make_symbol("conv2d_backward_weight", with_shape(c.attrs, c.shape(1)), {c.dy, c.in[0]});
         if (c.in.size() == 3 && c.wanted[2]) r[2] = sum(c.dy, {0, 2, 3});
         return r;
       }},
      {"pool2d", [](C c) -> V { return {graph::make_symbol("pool2d_backward", c.attrs, {c.dy, c.in[0]})}; }},
      // The inference form: the running statistics are constants of the
      // forward (auxiliary states), so only x, gamma and beta get gradients.
      {"batch_norm",
       [](C c) -> V {
         const Shape& x = c.shape(0);
         const auto axis = static_cast<std::size_t>(normalize_axis(c.int_attr("axis"), x.size(), "gradient"));
         const double eps = graph::parse_double(graph::find_attr(c.attrs, "eps", "gradient"), "gradient");
         Shape channel(x.size(), 1);
         channel[axis] = x[axis];
         std::vector<std::int64_t> others;
         for (std::size_t d = 0; d < x.size(); ++d)
           if (d != axis) others.push_back(static_cast<std::int64_t>(d));
         Symbol rstd = reshape(Symbol(1 / sqrt(c.in[4] + eps)), channel);
         V r(5);
         if (c.wanted[0]) r[0] = Symbol(c.dy * reshape(c.in[1], channel) * rstd);
         if (c.wanted[1]) r[1] = sum(Symbol(c.dy * (c.in[0] - reshape(c.in[3], channel)) * rstd), others);
         if (c.wanted[2]) r[2] = sum(c.dy, others);
         return r;
       }},
      {"slice_backward", nullptr},
      {"conv2d_backward_data", nullptr},
      {"conv2d_backward_weight", nullptr},
      {"pool2d_backward", nullptr},
  };
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
    g[i] = detail::sum_to(g[i], c.shape(i));
    if (g[i].dtype() != c.in[i].dtype()) g[i] = g[i].astype(c.in[i].dtype());
  }
  return g;
}

}  // namespace hybra::autograd
