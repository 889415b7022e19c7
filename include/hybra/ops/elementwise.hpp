#pragma once
// The op table for elementwise ops: one struct per op, read by every layer
// that needs to know an op (fused CPU kernels, printing, dtype rules; the
// symbolic graph, code generation and autograd read the same entries).
//
// An entry has:
//   name    the op's name (also used in error messages)
//   symbol  the C++ infix operator, or "" for a function-call op
//   arity   number of operands
//   rule    how the result dtype follows from the operands' (DTypeRule)
//   apply   the scalar function, on operands already converted to the
//           compute type (for `where`, the condition comes first as a bool)
//   costly  true when apply costs tens of instructions per element (a call
//           into vector math on the CPU): a fused loop containing such an op
//           is compute-bound and prefetches its operands (expr/evaluate.hpp)
//
// The entries up to `where` are also CUDA device code: NVRTC compiles this
// header into every generated kernel (jit/cuda_source.hpp), which calls
// Op::apply as the CPU loops do. NVRTC has no host standard library, so
// there NVRTC's built-in math functions and the few traits below stand in for
// <cmath> and <type_traits> (libcu++'s headers would cost most of each
// compile: docs/cuda.md), and the dtype rules below, which are host-only,
// are left out.
#ifndef __CUDACC_RTC__
#include <cmath>
#include <cstdint>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "../backend/cpu/vector_math.hpp"
#include "../core/dtype.hpp"
#endif
#include "../core/macros.hpp"

namespace hybra::op {

#ifdef __CUDACC_RTC__
namespace math {
using ::exp;
using ::log;
using ::pow;
using ::sqrt;
using ::tanh;
template <class T> inline constexpr bool is_integral_v = false;
template <> inline constexpr bool is_integral_v<bool> = true;
template <> inline constexpr bool is_integral_v<signed char> = true;
template <> inline constexpr bool is_integral_v<unsigned char> = true;
template <> inline constexpr bool is_integral_v<int> = true;
template <> inline constexpr bool is_integral_v<unsigned> = true;
template <> inline constexpr bool is_integral_v<long long> = true;
template <> inline constexpr bool is_integral_v<unsigned long long> = true;
template <class T> inline constexpr bool is_signed_v = T(-1) < T(0);
template <class T> inline constexpr bool is_unsigned_v = is_integral_v<T> && !is_signed_v<T>;
template <class T> struct make_unsigned { using type = T; };
template <> struct make_unsigned<signed char> { using type = unsigned char; };
template <> struct make_unsigned<int> { using type = unsigned; };
template <> struct make_unsigned<long long> { using type = unsigned long long; };
template <class T> using make_unsigned_t = typename make_unsigned<T>::type;
}  // namespace math
struct text {  // an op's name where std::string_view is missing
  const char* data;
  constexpr text(const char* s) : data(s) {}  // NOLINT(google-explicit-constructor)
};
#else
namespace math = std;
using text = std::string_view;
#endif

enum class DTypeRule {
  promote,        // operands promote to a common type, which is the result
  promote_float,  // as promote, then integers become float32 (true division, exp, ...)
  select,         // operand 0 is a condition (any dtype); the others promote
};

namespace detail {
// Signed overflow is undefined in C++; tensors wrap around like NumPy's.
template <class T, class F>
HYBRA_HD constexpr T wrapping(T a, T b, F f) {
  if constexpr (math::is_integral_v<T> && math::is_signed_v<T>) {
    using U = math::make_unsigned_t<T>;
    return static_cast<T>(f(static_cast<U>(a), static_cast<U>(b)));
  } else {
    return static_cast<T>(f(a, b));
  }
}
template <class T>
HYBRA_HD constexpr T int_pow(T base, T exp) {
  if (exp < 0) return base == 1 ? T(1) : base == T(-1) ? (exp % 2 ? T(-1) : T(1)) : T(0);
  using U = math::make_unsigned_t<T>;
  U result = 1, b = static_cast<U>(base);
  for (auto e = static_cast<U>(exp); e; e >>= 1, b *= b)
    if (e & 1) result *= b;
  return static_cast<T>(result);
}
}  // namespace detail

template <text const& Name, text const& Symbol, int Arity, DTypeRule Rule>
struct entry {
  static constexpr text name = Name;
  static constexpr text symbol = Symbol;
  static constexpr int arity = Arity;
  static constexpr DTypeRule rule = Rule;
  static constexpr bool costly = false;
};

#define HYBRA_OP_NAME(id, spelling) inline constexpr text id##_name = spelling;
HYBRA_OP_NAME(none, "")
HYBRA_OP_NAME(add, "add") HYBRA_OP_NAME(plus, "+")
HYBRA_OP_NAME(subtract, "subtract") HYBRA_OP_NAME(minus, "-")
HYBRA_OP_NAME(multiply, "multiply") HYBRA_OP_NAME(times, "*")
HYBRA_OP_NAME(divide, "divide") HYBRA_OP_NAME(slash, "/")
HYBRA_OP_NAME(negative, "negative")
HYBRA_OP_NAME(less, "less") HYBRA_OP_NAME(lt, "<")
HYBRA_OP_NAME(less_equal, "less_equal") HYBRA_OP_NAME(le, "<=")
HYBRA_OP_NAME(greater, "greater") HYBRA_OP_NAME(gt, ">")
HYBRA_OP_NAME(greater_equal, "greater_equal") HYBRA_OP_NAME(ge, ">=")
HYBRA_OP_NAME(equal, "equal") HYBRA_OP_NAME(eq, "==")
HYBRA_OP_NAME(not_equal, "not_equal") HYBRA_OP_NAME(ne, "!=")
HYBRA_OP_NAME(exp, "exp") HYBRA_OP_NAME(log, "log") HYBRA_OP_NAME(sqrt, "sqrt")
HYBRA_OP_NAME(abs, "abs") HYBRA_OP_NAME(tanh, "tanh") HYBRA_OP_NAME(sigmoid, "sigmoid")
HYBRA_OP_NAME(relu, "relu") HYBRA_OP_NAME(pow, "pow") HYBRA_OP_NAME(maximum, "maximum")
HYBRA_OP_NAME(minimum, "minimum") HYBRA_OP_NAME(where, "where")
#undef HYBRA_OP_NAME

using enum DTypeRule;

struct add : entry<add_name, plus_name, 2, promote> {
  template <class T> HYBRA_HD static constexpr T apply(T a, T b) { return detail::wrapping(a, b, [](auto x, auto y) { return x + y; }); }
};
struct subtract : entry<subtract_name, minus_name, 2, promote> {
  template <class T> HYBRA_HD static constexpr T apply(T a, T b) { return detail::wrapping(a, b, [](auto x, auto y) { return x - y; }); }
};
struct multiply : entry<multiply_name, times_name, 2, promote> {
  template <class T> HYBRA_HD static constexpr T apply(T a, T b) { return detail::wrapping(a, b, [](auto x, auto y) { return x * y; }); }
};
struct divide : entry<divide_name, slash_name, 2, promote_float> {
  template <class T> HYBRA_HD static constexpr T apply(T a, T b) { return a / b; }
};
struct negative : entry<negative_name, minus_name, 1, promote> {
  template <class T> HYBRA_HD static constexpr T apply(T a) { return detail::wrapping(T(0), a, [](auto x, auto y) { return x - y; }); }
};
// Comparisons yield 1 or 0 in the operands' common type (as MXNet's NDArray),
// so a comparison fuses into arithmetic without a dtype change.
struct less : entry<less_name, lt_name, 2, promote> {
  template <class T> HYBRA_HD static constexpr T apply(T a, T b) { return a < b; }
};
struct less_equal : entry<less_equal_name, le_name, 2, promote> {
  template <class T> HYBRA_HD static constexpr T apply(T a, T b) { return a <= b; }
};
struct greater : entry<greater_name, gt_name, 2, promote> {
  template <class T> HYBRA_HD static constexpr T apply(T a, T b) { return a > b; }
};
struct greater_equal : entry<greater_equal_name, ge_name, 2, promote> {
  template <class T> HYBRA_HD static constexpr T apply(T a, T b) { return a >= b; }
};
struct equal : entry<equal_name, eq_name, 2, promote> {
  template <class T> HYBRA_HD static constexpr T apply(T a, T b) { return a == b; }
};
struct not_equal : entry<not_equal_name, ne_name, 2, promote> {
  template <class T> HYBRA_HD static constexpr T apply(T a, T b) { return a != b; }
};
struct exp : entry<exp_name, none_name, 1, promote_float> {
  static constexpr bool costly = true;
  template <class T> HYBRA_HD static T apply(T a) { return math::exp(a); }
};
struct log : entry<log_name, none_name, 1, promote_float> {
  static constexpr bool costly = true;
  template <class T> HYBRA_HD static T apply(T a) { return math::log(a); }
};
struct sqrt : entry<sqrt_name, none_name, 1, promote_float> {
  template <class T> HYBRA_HD static T apply(T a) { return math::sqrt(a); }
};
struct abs : entry<abs_name, none_name, 1, promote> {
  template <class T> HYBRA_HD static constexpr T apply(T a) {
    if constexpr (math::is_unsigned_v<T>) return a;
    else return a < T(0) ? negative::apply(a) : a;
  }
};
struct tanh : entry<tanh_name, none_name, 1, promote_float> {
  static constexpr bool costly = true;
  template <class T> HYBRA_HD static T apply(T a) { return math::tanh(a); }
};
struct sigmoid : entry<sigmoid_name, none_name, 1, promote_float> {
  static constexpr bool costly = true;
  template <class T> HYBRA_HD static T apply(T a) { return T(1) / (T(1) + math::exp(-a)); }
};
// Written as a select on `a < 0` (not `a > 0 ? a : 0`) so NaN propagates and
// GCC emits a vector blend/max rather than leaving the loop scalar.
struct relu : entry<relu_name, none_name, 1, promote> {
  template <class T> HYBRA_HD static constexpr T apply(T a) { return a < T(0) ? T(0) : a; }
};
struct pow : entry<pow_name, none_name, 2, promote> {
  static constexpr bool costly = true;
  template <class T> HYBRA_HD static T apply(T a, T b) {
    if constexpr (math::is_integral_v<T>) return detail::int_pow(a, b);
    else return math::pow(a, b);
  }
};
// NaN in either operand gives NaN, as NumPy's maximum/minimum.
struct maximum : entry<maximum_name, none_name, 2, promote> {
  template <class T> HYBRA_HD static constexpr T apply(T a, T b) { return (a > b || a != a) ? a : b; }
};
struct minimum : entry<minimum_name, none_name, 2, promote> {
  template <class T> HYBRA_HD static constexpr T apply(T a, T b) { return (a < b || a != a) ? a : b; }
};
struct where : entry<where_name, none_name, 3, select> {
  template <class T> HYBRA_HD static constexpr T apply(bool c, T a, T b) { return c ? a : b; }
};

#ifndef __CUDACC_RTC__
// Every elementwise op, for the layers that look ops up by name or number at
// run time (the graph, fused CPU loops of captured graphs). A new op's struct
// goes here too.
using elementwise_ops = std::tuple<add, subtract, multiply, divide, negative, less, less_equal, greater,
                                   greater_equal, equal, not_equal, exp, log, sqrt, abs, tanh, sigmoid, relu, pow,
                                   maximum, minimum, where>;

// Op's place in elementwise_ops, or -1: how fused programs name their ops.
template <class Op>
constexpr int elementwise_index() {
  return []<std::size_t... I>(std::index_sequence<I...>) {
    int found = -1;
    ((found = std::is_same_v<Op, std::tuple_element_t<I, elementwise_ops>> ? static_cast<int>(I) : found), ...);
    return found;
  }(std::make_index_sequence<std::tuple_size_v<elementwise_ops>>{});
}

// The C++ type an op computes in and returns, from its operands' C++ types and
// whether each is a "weak" scalar (see hybra::promote).
template <class Op, class... Operands>
struct result;
template <class Op, class A>
struct result<Op, A> {
  using type = std::conditional_t<Op::rule == promote_float, floating_t<typename A::type>, typename A::type>;
};
template <class Op, class A, class B>
struct result<Op, A, B> {
  using common = promote_t<typename A::type, A::weak, typename B::type, B::weak>;
  using type = std::conditional_t<Op::rule == promote_float, floating_t<common>, common>;
};
template <class Op, class C, class A, class B>
struct result<Op, C, A, B> {
  static_assert(Op::rule == select);
  using type = promote_t<typename A::type, A::weak, typename B::type, B::weak>;
};

// The run-time form of the same rule, for dtype inference without C++ types.
template <class Op>
DType result_dtype(std::initializer_list<DType> operands) {
  auto it = operands.begin();
  if constexpr (Op::rule == select) ++it;
  DType d = *it++;
  for (; it != operands.end(); ++it) d = promote_types(d, *it);
  if (Op::rule == promote_float && !is_floating(d)) d = DType::float32;
  return d;
}

#endif  // __CUDACC_RTC__

}  // namespace hybra::op
