#pragma once
// Rules written over symbols: an op's gradient (autograd/gradients.hpp) and
// its decomposition (ops/op.hpp's `decompose`), each a template over a
// context that gives it the node's operands and attributes and the symbolic
// functions it composes. Inside hybra::op the names exp, sqrt, reshape, ...
// are the ops' entries, so rules call the functions through the context
// (c.sqrt(...)). This file holds that context and the table of the ops'
// decompositions, generated from the op table (ops/table.hpp).
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../core/separate_compilation.hpp"
#include "symbol.hpp"

namespace hybra::graph {

struct RuleContext {
  using symbol = Symbol;

  std::span<const Symbol> in;  // the node's operands
  const op::Attrs& attrs;
  std::string_view rule;       // what runs, for errors: "gradient", "decompose"

  const Shape& shape(std::size_t i) const { return in[i].shape(); }
  std::int64_t int_attr(std::string_view key) const { return op::int_attr(attrs, key, rule); }
  double double_attr(std::string_view key) const { return op::double_attr(attrs, key, rule); }

  template <class X>
  static Symbol sym(X&& x) {
    return Symbol(std::forward<X>(x));
  }

#define HYBRA_RULE_FUNCTION(fn)                      \
  template <class... A>                              \
  static Symbol fn(A&&... a) {                       \
    return Symbol(hybra::fn(std::forward<A>(a)...)); \
  }
  HYBRA_RULE_FUNCTION(where)
  HYBRA_RULE_FUNCTION(exp)
  HYBRA_RULE_FUNCTION(log)
  HYBRA_RULE_FUNCTION(pow)
  HYBRA_RULE_FUNCTION(sqrt)
  HYBRA_RULE_FUNCTION(sigmoid)
  HYBRA_RULE_FUNCTION(sum)
  HYBRA_RULE_FUNCTION(reshape)
  HYBRA_RULE_FUNCTION(broadcast_to)
  HYBRA_RULE_FUNCTION(transpose)
  HYBRA_RULE_FUNCTION(matmul)
  HYBRA_RULE_FUNCTION(flatten)
  HYBRA_RULE_FUNCTION(slice)
#undef HYBRA_RULE_FUNCTION
  // A node of an op that only rules use.
  static Symbol make(std::string op, op::Attrs attrs, std::vector<Symbol> inputs) {
    return graph::make_symbol(std::move(op), std::move(attrs), std::move(inputs));
  }
};

// An op as a composition of others: the symbol that computes its result, or
// an undefined one where this node is better left whole.
using Decomposition = Symbol (*)(const RuleContext&);

namespace detail {

template <class Op>
constexpr Decomposition decomposition_of() {
  if constexpr (requires(const RuleContext& c) { Op::decompose(c); })
    return [](const RuleContext& c) -> Symbol { return Op::decompose(c); };
  else
    return nullptr;
}

HYBRA_SEPARABLE const std::unordered_map<std::string_view, Decomposition>& decompositions();
#if HYBRA_DEFINE_SEPARABLE
HYBRA_SEPARABLE const std::unordered_map<std::string_view, Decomposition>& decompositions() {
  static const auto table = op::by_name<Decomposition>([]<class Op>() { return decomposition_of<Op>(); });
  return table;
}
#endif

}  // namespace detail

// The op's decomposition, or null for a primitive.
inline Decomposition find_decomposition(std::string_view op) {
  auto it = detail::decompositions().find(op);
  return it == detail::decompositions().end() ? nullptr : it->second;
}

}  // namespace hybra::graph
