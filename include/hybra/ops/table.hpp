#pragma once
// The op table: every op of hybra, once. The graph's registry, the gradient
// rules and the model-file rows are generated from this list, each checking
// at compile time that every op fills its facet (ops/op.hpp).
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>

#include "batch_norm.hpp"
#include "batch_norm_training.hpp"
#include "conv_backward.hpp"
#include "cumsum.hpp"
#include "elementwise.hpp"
#include "embedding.hpp"
#include "linalg.hpp"
#include "op.hpp"
#include "pool.hpp"
#include "pool_backward.hpp"
#include "reduce.hpp"
#include "softmax.hpp"

namespace hybra::op {

// Every op that is not elementwise. X(id) for each; a new op's name goes here.
#define HYBRA_OPS(X)                                                                                              \
  X(matmul) X(dot) X(sum) X(mean) X(max) X(min) X(argmax) X(softmax) X(log_softmax) X(cumsum) X(reshape)      \
  X(transpose) X(slice) X(concat) X(astype) X(flatten) X(broadcast_to) X(fully_connected) X(dropout) X(conv2d) \
  X(pool2d) X(batch_norm) X(batch_norm_training) X(embedding) X(slice_backward) X(conv2d_backward_data)         \
  X(conv2d_backward_weight) X(pool2d_backward) X(embedding_backward)

// The elementwise ops first: their place is their index in elementwise_ops.
#define HYBRA_OP_TYPE(id) , id
using all_ops = decltype(std::tuple_cat(elementwise_ops{}, drop_first<void HYBRA_OPS(HYBRA_OP_TYPE)>{}));
#undef HYBRA_OP_TYPE

// An op's name is its identifier: gradient rules and model files name ops by it.
#define HYBRA_NAME_IS_IDENTIFIER(id) static_assert(id::name == #id, "hybra: the entry op::" #id " names another op");
HYBRA_OPS(HYBRA_NAME_IS_IDENTIFIER)
#undef HYBRA_NAME_IS_IDENTIFIER

// Calls f(Op{}) for each op, in the table's order.
template <class F>
void for_each_op(F&& f) {
  std::apply([&](auto... op) { (f(op), ...); }, all_ops{});
}

// A facet by op name: facet.template operator()<Op>() for each op (a gradient
// rule, a decomposition; null where an op has none).
template <class Value, class Facet>
std::unordered_map<std::string_view, Value> by_name(Facet facet) {
  std::unordered_map<std::string_view, Value> table;
  for_each_op([&](auto op) { table.emplace(decltype(op)::name, facet.template operator()<decltype(op)>()); });
  return table;
}

namespace detail {
template <class Op>
constexpr bool follows_contract() {
  static_assert(std::is_convertible_v<decltype(Op::name), std::string_view>, "hybra: an op needs a name (ops/op.hpp)");
  static_assert(elementwise<Op> || requires { &Op::eval; },
                "hybra: a non-elementwise op needs eval(in, attrs), its eager op on tensors (ops/op.hpp)");
  static_assert(exported<Op> || gradient_only<Op>,
                "hybra: an op needs its MXNet spelling (mxnet, write, read), unless only gradients make it");
  static_assert(!(gradient_only<Op> && requires { Op::mxnet; }),
                "hybra: an op only gradients make is never in a model file: it has no MXNet spelling");
  return true;
}
template <class... Ops>
constexpr bool all_follow_contract(std::tuple<Ops...>*) {
  return (follows_contract<Ops>() && ...);
}
}  // namespace detail
static_assert(detail::all_follow_contract(static_cast<all_ops*>(nullptr)));

}  // namespace hybra::op
