#pragma once
// hybra's Boost.Yap expression template. `a * b + 2` builds a tree whose C++
// type is the expression's typed graph; nothing is computed until the tree is
// assigned to a Tensor (evaluate.hpp), which runs it in one fused pass. The
// same operators over Symbols (graph/symbol.hpp) build a tree that becomes
// graph nodes when assigned to a Symbol: one op table, two modes.
#include <boost/hana/tuple.hpp>
#include <boost/yap/algorithm.hpp>
#include <boost/yap/user_macros.hpp>
#include <type_traits>

#include "../core/tensor.hpp"
#include "../ops/elementwise.hpp"

namespace hybra {

namespace yap = boost::yap;

template <yap::expr_kind Kind, class Tuple>
struct expression {
  static constexpr yap::expr_kind kind = Kind;
  Tuple elements;

  // `if (x > 0)` on a tensor or symbol expression: an `if` must not silently
  // test something else (and a captured graph cannot branch on a value).
  template <class B>
    requires std::same_as<B, bool>
  explicit operator B() const {
    static_assert(!std::same_as<B, bool>,
                  "hybra: an expression has no truth value. On tensors, test a value (item<T>()); on symbols, "
                  "`if` on a value cannot be captured into a graph: use where(condition, a, b) instead");
  }
};

#define HYBRA_EXPR_BINARY(kind_name) BOOST_YAP_USER_BINARY_OPERATOR(kind_name, expression, expression)
HYBRA_EXPR_BINARY(plus)
HYBRA_EXPR_BINARY(minus)
HYBRA_EXPR_BINARY(multiplies)
HYBRA_EXPR_BINARY(divides)
HYBRA_EXPR_BINARY(less)
HYBRA_EXPR_BINARY(less_equal)
HYBRA_EXPR_BINARY(greater)
HYBRA_EXPR_BINARY(greater_equal)
HYBRA_EXPR_BINARY(equal_to)
HYBRA_EXPR_BINARY(not_equal_to)
#undef HYBRA_EXPR_BINARY
BOOST_YAP_USER_UNARY_OPERATOR(negate, expression, expression)

// The leaf types hybra's operators apply to.
template <class T>
struct is_leaf_type : std::bool_constant<std::is_same_v<T, Tensor> || std::is_same_v<T, Symbol>> {};

#define HYBRA_TENSOR_BINARY(kind_name) BOOST_YAP_USER_UDT_ANY_BINARY_OPERATOR(kind_name, expression, is_leaf_type)
HYBRA_TENSOR_BINARY(plus)
HYBRA_TENSOR_BINARY(minus)
HYBRA_TENSOR_BINARY(multiplies)
HYBRA_TENSOR_BINARY(divides)
HYBRA_TENSOR_BINARY(less)
HYBRA_TENSOR_BINARY(less_equal)
HYBRA_TENSOR_BINARY(greater)
HYBRA_TENSOR_BINARY(greater_equal)
HYBRA_TENSOR_BINARY(equal_to)
HYBRA_TENSOR_BINARY(not_equal_to)
#undef HYBRA_TENSOR_BINARY
BOOST_YAP_USER_UDT_UNARY_OPERATOR(negate, expression, is_leaf_type)

// Which op of the op table each C++ operator means.
template <yap::expr_kind Kind>
struct operator_op {
  static_assert(Kind != Kind, "hybra: this C++ operator is not an op of hybra's op table; "
                              "use + - * / unary -, comparisons, or the named functions (exp, relu, ...)");
};
template <> struct operator_op<yap::expr_kind::negate> { using type = op::negative; };
template <> struct operator_op<yap::expr_kind::plus> { using type = op::add; };
template <> struct operator_op<yap::expr_kind::minus> { using type = op::subtract; };
template <> struct operator_op<yap::expr_kind::multiplies> { using type = op::multiply; };
template <> struct operator_op<yap::expr_kind::divides> { using type = op::divide; };
template <> struct operator_op<yap::expr_kind::less> { using type = op::less; };
template <> struct operator_op<yap::expr_kind::less_equal> { using type = op::less_equal; };
template <> struct operator_op<yap::expr_kind::greater> { using type = op::greater; };
template <> struct operator_op<yap::expr_kind::greater_equal> { using type = op::greater_equal; };
template <> struct operator_op<yap::expr_kind::equal_to> { using type = op::equal; };
template <> struct operator_op<yap::expr_kind::not_equal_to> { using type = op::not_equal; };

// A Tensor or an expression over tensors (and scalars): it has values.
template <class X>
concept tensor_like = std::is_same_v<std::remove_cvref_t<X>, Tensor> ||
                      (yap_expression<X> && !contains_symbol_v<X>);
// A Symbol or an expression with a Symbol leaf: it describes a graph.
template <class X>
concept symbol_like = std::is_same_v<std::remove_cvref_t<X>, Symbol> || (yap_expression<X> && contains_symbol_v<X>);
template <class X>
concept array_like = tensor_like<X> || symbol_like<X>;
template <class X>
concept operand = array_like<X> || std::is_arithmetic_v<std::remove_cvref_t<X>>;

// An op-table op applied to operands: a Yap call node whose callee terminal
// holds the op's tag. At least one operand must be a Tensor or expression.
template <class Op, class... Args>
auto apply_op(Args&&... args) {
  static_assert(sizeof...(Args) == Op::arity, "hybra: wrong number of operands for this op");
  static_assert((operand<Args> && ...),
                "hybra: an operand of an elementwise op must be a Tensor, a Symbol, a hybra expression or an "
                "arithmetic scalar");
  static_assert((array_like<Args> || ...),
                "hybra: an elementwise op needs at least one Tensor, Symbol or expression operand");
  return yap::make_expression<expression, yap::expr_kind::call>(
      yap::make_terminal<expression>(Op{}), static_cast<Args&&>(args)...);
}

// Each op called by name (ops/elementwise.hpp). A unary one takes arrays
// only, so that exp(2.0) stays std::exp's; the others take any operands and
// apply_op says which are wrong.
#define HYBRA_ELEMENTWISE_FUNCTION(id)                                                        \
  template <class... Operands>                                                                \
    requires(sizeof...(Operands) == op::id::arity && (op::id::arity > 1 || (array_like<Operands> && ...))) \
  auto id(Operands&&... operands) {                                                           \
    return apply_op<op::id>(static_cast<Operands&&>(operands)...);                            \
  }
HYBRA_ELEMENTWISE_FUNCTIONS(HYBRA_ELEMENTWISE_FUNCTION)
#undef HYBRA_ELEMENTWISE_FUNCTION

// x limited to [low, high] (MXNet's clip): the maximum with low, then the
// minimum with high, so it fuses, runs on a GPU and differentiates as those
// do (the gradient passes where low <= x <= high); an exported graph holds
// MXNet's `_maximum_scalar` and `_minimum_scalar`. relu6 is MobileNet v2's.
template <array_like X, class Low, class High>
auto clip(X&& x, Low&& low, High&& high) {
  return minimum(maximum(static_cast<X&&>(x), static_cast<Low&&>(low)), static_cast<High&&>(high));
}
template <array_like X>
auto relu6(X&& x) {
  return clip(static_cast<X&&>(x), 0, 6);
}

// The activations of current models, each a short composition of op-table
// ops: it fuses into the loop around it, runs on a GPU, differentiates and is
// written to model files as those ops are. The expression a composition
// returns outlives its parameters, so it holds every operand by value: `use`
// copies an operand (an expression with all its leaves: tensor and symbol
// handles and scalars, cheap to copy), and `owning` checks at compile time
// that no reference is left in what a composition returns.
namespace detail {
struct leaves_by_value {
  template <class T>
  auto operator()(yap::expr_tag<yap::expr_kind::terminal>, T&& leaf) const {
    return yap::make_terminal<expression>(std::remove_cvref_t<T>(leaf));
  }
};
template <class X>
auto use(const X& x) {
  if constexpr (yap::is_expr<X>::value) return yap::transform(x, leaves_by_value{});
  else return std::remove_cvref_t<X>(x);
}
template <class T>
struct holds_values : std::bool_constant<!std::is_reference_v<T>> {};
template <yap::expr_kind Kind, class... Elements>
struct holds_values<expression<Kind, boost::hana::tuple<Elements...>>>
    : std::bool_constant<Kind != yap::expr_kind::expr_ref && (holds_values<Elements>::value && ...)> {};
template <class E>
E owning(E&& e) {
  static_assert(holds_values<E>::value,
                "hybra: this composition's expression refers to one of its parameters, which ends when it returns; "
                "take each operand through detail::use");
  return static_cast<E&&>(e);
}
}  // namespace detail

// x where x > 0, else slope x (Gluon's LeakyReLU). NaN stays NaN.
template <array_like X>
auto leaky_relu(const X& x, double slope) {
  using detail::use;
  return detail::owning(where(use(x) > 0, use(x), use(x) * use(slope)));
}
// x where x > 0, else alpha (e^x - 1). The exponent is min(x, 0): the branch
// not taken never overflows, so its zero gradient never meets infinity.
template <array_like X>
auto elu(const X& x, double alpha = 1) {
  using detail::use;
  return detail::owning(where(use(x) > 0, use(x), use(alpha) * (exp(minimum(use(x), 0)) - 1)));
}
// The self-normalising ELU, with its two constants.
template <array_like X>
auto selu(const X& x) {
  return detail::owning(1.0507009873554805 * elu(x, 1.6732632423543772));
}
// x sigmoid(beta x); with beta = 1 it is SiLU.
template <array_like X>
auto swish(const X& x, double beta = 1) {
  using detail::use;
  return detail::owning(use(x) * sigmoid(use(x) * use(beta)));
}
template <array_like X>
auto silu(const X& x) {
  return detail::owning(swish(x, 1));
}
// x Phi(x) = x (1 + erf(x / sqrt 2)) / 2, as BERT's and PyTorch's default;
// gelu_tanh is the tanh approximation (GPT-2's, PyTorch's approximate="tanh").
template <array_like X>
auto gelu(const X& x) {
  using detail::use;
  return detail::owning(0.5 * use(x) * (1 + erf(use(x) * 0.7071067811865476)));
}
template <array_like X>
auto gelu_tanh(const X& x) {
  using detail::use;
  return detail::owning(
      0.5 * use(x) * (1 + tanh(0.7978845608028654 * (use(x) + 0.044715 * use(x) * use(x) * use(x)))));
}

}  // namespace hybra
