#pragma once
// The op table for elementwise ops: one struct per op, read by every layer
// that needs to know an op (fused CPU kernels, printing, dtype rules; the
// symbolic graph, code generation, autograd and model files read the same
// entries). Every op, elementwise or not, follows the contract of ops/op.hpp;
// an elementwise entry has, besides:
//   symbol  the C++ infix operator, or "" for a function-call op
//   rule    how the result dtype follows from the operands' (DTypeRule)
//   apply   the scalar function, on operands already converted to the
//           compute type (for `where`, the condition comes first as a bool)
//   costly  true when apply costs tens of instructions per element (vector
//           math on the CPU, backend/cpu/vector_math.hpp): a fused loop containing such an op
//           is compute-bound and prefetches its operands (expr/evaluate.hpp)
//   mxnet   MXNet's spellings on arrays (the first is written; default: the
//           name); binary ops also `mxnet_scalar` (array op scalar), and where
//           operands do not commute `mxnet_reversed` (scalar op array) or, for
//           comparisons, `mirror` (the op that is this one with operands
//           swapped); an op MXNet has only as an Activation, its
//           `mxnet_activation` (act_type) instead
// A new op is one struct here and its name in HYBRA_ELEMENTWISE_OPS (and in
// HYBRA_ELEMENTWISE_FUNCTIONS when it is called by name, as exp(x) is).
//
// The entries are also CUDA device code: NVRTC compiles this header into
// every generated kernel (expr/cuda_elementwise.hpp), which calls Op::apply as the
// CPU loops do. NVRTC has no host standard library, so there NVRTC's built-in
// math functions and the few traits below stand in for <cmath> and
// <type_traits> (libcu++'s headers would cost most of each compile:
// docs/cuda.md), and the dtype rules below, which are host-only, are left
// out. The gradients are templates over autograd's gradient builder, never
// instantiated there.
#ifndef __CUDACC_RTC__
#include <cmath>
#include <cstdint>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "../backend/cpu/vector_math.hpp"
#include "../core/dtype.hpp"
#endif
#include "../core/half.hpp"
#include "../core/macros.hpp"

namespace hybra::op {

#ifdef __CUDACC_RTC__
namespace math {
using ::erf;
using ::exp;
using ::log;
using ::log1p;
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
// float32 exp, tanh and sigmoid in a build for AVX2 and FMA are hybra's own,
// which GCC vectorises inline (backend/cpu/vector_math.hpp); CUDA's are
// NVRTC's and nvcc's.
template <class T>
HYBRA_HD T exp(T a) {
#if !defined(__CUDACC_RTC__) && !defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float> && backend::cpu::float32::used_by_ops) return backend::cpu::float32::exp(a);
#endif
  return math::exp(a);
}
template <class T>
HYBRA_HD T tanh(T a) {
#if !defined(__CUDACC_RTC__) && !defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float> && backend::cpu::float32::used_by_ops) return backend::cpu::float32::tanh(a);
#endif
  return math::tanh(a);
}
template <class T>
HYBRA_HD T sigmoid(T a) {
#if !defined(__CUDACC_RTC__) && !defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float> && backend::cpu::float32::used_by_ops) return backend::cpu::float32::sigmoid(a);
#endif
  return T(1) / (T(1) + math::exp(-a));
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
  static constexpr text mxnet[] = {Name};
};

// Every elementwise op; its place in this list is how fused programs name it.
#define HYBRA_ELEMENTWISE_OPS(X)                                                                              \
  X(add) X(subtract) X(multiply) X(divide) X(negative) X(less) X(less_equal) X(greater) X(greater_equal)       \
  X(equal) X(not_equal) X(exp) X(log) X(sqrt) X(abs) X(tanh) X(sigmoid) X(relu) X(pow) X(maximum) X(minimum) \
  X(where) X(softplus) X(erf)
// The ops called by name (exp(x)); the others are C++ operators (expr/expression.hpp).
#define HYBRA_ELEMENTWISE_FUNCTIONS(X) \
  X(exp) X(log) X(sqrt) X(abs) X(tanh) X(sigmoid) X(relu) X(pow) X(maximum) X(minimum) X(where) X(softplus) X(erf)

// An op's name is its identifier, spelled once.
#define HYBRA_OP_NAME(id) inline constexpr text id##_name = #id;
HYBRA_ELEMENTWISE_OPS(HYBRA_OP_NAME)
#undef HYBRA_OP_NAME
inline constexpr text none_name = "", plus_name = "+", minus_name = "-", times_name = "*", slash_name = "/",
                      lt_name = "<", le_name = "<=", gt_name = ">", ge_name = ">=", eq_name = "==", ne_name = "!=";

using enum DTypeRule;

// A comparison yields 1 or 0 in the operands' common type (as MXNet's
// NDArray), so it fuses into arithmetic without a dtype change. It is
// piecewise constant: no gradient flows through it.
template <text const& Name, text const& Symbol>
struct comparison : entry<Name, Symbol, 2, promote> {
  template <class G> static auto gradient(const G& g) { return g.grads(); }
};

struct add : entry<add_name, plus_name, 2, promote> {
  template <class T> HYBRA_HD static constexpr T apply(T a, T b) { return detail::wrapping(a, b, [](auto x, auto y) { return x + y; }); }
  template <class G> static auto gradient(const G& g) { return g.grads(g.dy, g.dy); }
  static constexpr text mxnet[] = {"broadcast_add", "elemwise_add", "_plus", "_Plus", "broadcast_plus"};
  static constexpr text mxnet_scalar = "_plus_scalar";
};
struct subtract : entry<subtract_name, minus_name, 2, promote> {
  template <class T> HYBRA_HD static constexpr T apply(T a, T b) { return detail::wrapping(a, b, [](auto x, auto y) { return x - y; }); }
  template <class G> static auto gradient(const G& g) { return g.grads(g.dy, -g.dy); }
  static constexpr text mxnet[] = {"broadcast_sub", "elemwise_sub", "_minus", "_Minus", "broadcast_minus"};
  static constexpr text mxnet_scalar = "_minus_scalar", mxnet_reversed = "_rminus_scalar";
};
struct multiply : entry<multiply_name, times_name, 2, promote> {
  template <class T> HYBRA_HD static constexpr T apply(T a, T b) { return detail::wrapping(a, b, [](auto x, auto y) { return x * y; }); }
  template <class G> static auto gradient(const G& g) { return g.grads(g.dy * g.in[1], g.dy * g.in[0]); }
  static constexpr text mxnet[] = {"broadcast_mul", "elemwise_mul", "_mul", "_Mul"};
  static constexpr text mxnet_scalar = "_mul_scalar";
};
struct divide : entry<divide_name, slash_name, 2, promote_float> {
  template <class T> HYBRA_HD static constexpr T apply(T a, T b) { return a / b; }
  template <class G> static auto gradient(const G& g) { return g.grads(g.dy / g.in[1], -g.dy * g.out / g.in[1]); }
  static constexpr text mxnet[] = {"broadcast_div", "elemwise_div", "_div", "_Div"};
  static constexpr text mxnet_scalar = "_div_scalar", mxnet_reversed = "_rdiv_scalar";
};
struct negative : entry<negative_name, minus_name, 1, promote> {
  template <class T> HYBRA_HD static constexpr T apply(T a) { return detail::wrapping(T(0), a, [](auto x, auto y) { return x - y; }); }
  template <class G> static auto gradient(const G& g) { return g.grads(-g.dy); }
};
struct less : comparison<less_name, lt_name> {
  template <class T> HYBRA_HD static constexpr T apply(T a, T b) { return a < b; }
  static constexpr text mxnet[] = {"broadcast_lesser", "_lesser"};
  static constexpr text mxnet_scalar = "_lesser_scalar", mirror = "greater";
};
struct less_equal : comparison<less_equal_name, le_name> {
  template <class T> HYBRA_HD static constexpr T apply(T a, T b) { return a <= b; }
  static constexpr text mxnet[] = {"broadcast_lesser_equal", "_lesser_equal"};
  static constexpr text mxnet_scalar = "_lesser_equal_scalar", mirror = "greater_equal";
};
struct greater : comparison<greater_name, gt_name> {
  template <class T> HYBRA_HD static constexpr T apply(T a, T b) { return a > b; }
  static constexpr text mxnet[] = {"broadcast_greater", "_greater"};
  static constexpr text mxnet_scalar = "_greater_scalar", mirror = "less";
};
struct greater_equal : comparison<greater_equal_name, ge_name> {
  template <class T> HYBRA_HD static constexpr T apply(T a, T b) { return a >= b; }
  static constexpr text mxnet[] = {"broadcast_greater_equal", "_greater_equal"};
  static constexpr text mxnet_scalar = "_greater_equal_scalar", mirror = "less_equal";
};
struct equal : comparison<equal_name, eq_name> {
  template <class T> HYBRA_HD static constexpr T apply(T a, T b) { return a == b; }
  static constexpr text mxnet[] = {"broadcast_equal", "_equal"};
  static constexpr text mxnet_scalar = "_equal_scalar";
};
struct not_equal : comparison<not_equal_name, ne_name> {
  template <class T> HYBRA_HD static constexpr T apply(T a, T b) { return a != b; }
  static constexpr text mxnet[] = {"broadcast_not_equal", "_not_equal"};
  static constexpr text mxnet_scalar = "_not_equal_scalar";
};
struct exp : entry<exp_name, none_name, 1, promote_float> {
  static constexpr bool costly = true;
  template <class T> HYBRA_HD static T apply(T a) { return detail::exp(a); }
  template <class G> static auto gradient(const G& g) { return g.grads(g.dy * g.out); }
};
struct log : entry<log_name, none_name, 1, promote_float> {
  static constexpr bool costly = true;
  template <class T> HYBRA_HD static T apply(T a) { return math::log(a); }
  template <class G> static auto gradient(const G& g) { return g.grads(g.dy / g.in[0]); }
};
struct sqrt : entry<sqrt_name, none_name, 1, promote_float> {
  template <class T> HYBRA_HD static T apply(T a) { return math::sqrt(a); }
  template <class G> static auto gradient(const G& g) { return g.grads(g.dy * 0.5 / g.out); }
};
struct abs : entry<abs_name, none_name, 1, promote> {
  template <class T> HYBRA_HD static constexpr T apply(T a) {
    if constexpr (math::is_unsigned_v<T>) return a;
    else return a < T(0) ? negative::apply(a) : a;
  }
  template <class G> static auto gradient(const G& g) { return g.grads(g.where(g.in[0] < 0, -g.dy, g.dy)); }
};
struct tanh : entry<tanh_name, none_name, 1, promote_float> {
  static constexpr bool costly = true;
  template <class T> HYBRA_HD static T apply(T a) { return detail::tanh(a); }
  template <class G> static auto gradient(const G& g) { return g.grads(g.dy * (1 - g.out * g.out)); }
};
struct sigmoid : entry<sigmoid_name, none_name, 1, promote_float> {
  static constexpr bool costly = true;
  template <class T> HYBRA_HD static T apply(T a) { return detail::sigmoid(a); }
  template <class G> static auto gradient(const G& g) { return g.grads(g.dy * g.out * (1 - g.out)); }
};
// Written as a select on `a < 0` (not `a > 0 ? a : 0`) so NaN propagates and
// GCC emits a vector blend/max rather than leaving the loop scalar. Its
// gradient reads the result (relu(x) > 0 exactly where x > 0): a captured
// graph's backward then keeps only the result, so a product before the relu
// keeps it as its epilogue in training too.
struct relu : entry<relu_name, none_name, 1, promote> {
  template <class T> HYBRA_HD static constexpr T apply(T a) { return a < T(0) ? T(0) : a; }
  template <class G> static auto gradient(const G& g) { return g.grads(g.where(g.out > 0, g.dy, 0)); }
};
struct pow : entry<pow_name, none_name, 2, promote> {
  static constexpr bool costly = true;
  template <class T> HYBRA_HD static T apply(T a, T b) {
    if constexpr (math::is_integral_v<T>) return detail::int_pow(a, b);
    else return math::pow(a, b);
  }
  template <class G> static auto gradient(const G& g) {
    auto r = g.grads();
    r.resize(2);
    if (g.wanted[0]) r[0] = g.sym(g.dy * g.in[1] * g.pow(g.in[0], g.in[1] - 1));
    if (g.wanted[1]) r[1] = g.sym(g.dy * g.out * g.log(g.in[0]));
    return r;
  }
  static constexpr text mxnet[] = {"broadcast_power", "_power", "_Power"};
  static constexpr text mxnet_scalar = "_power_scalar", mxnet_reversed = "_rpower_scalar";
};
// NaN in either operand gives NaN, as NumPy's maximum/minimum. The gradient
// goes to the first operand on ties.
struct maximum : entry<maximum_name, none_name, 2, promote> {
  template <class T> HYBRA_HD static constexpr T apply(T a, T b) { return (a > b || a != a) ? a : b; }
  template <class G> static auto gradient(const G& g) {
    auto first = g.sym(g.in[0] >= g.in[1]);
    return g.grads(g.where(first, g.dy, 0), g.where(first, 0, g.dy));
  }
  static constexpr text mxnet[] = {"broadcast_maximum", "_maximum", "_Maximum"};
  static constexpr text mxnet_scalar = "_maximum_scalar";
};
struct minimum : entry<minimum_name, none_name, 2, promote> {
  template <class T> HYBRA_HD static constexpr T apply(T a, T b) { return (a < b || a != a) ? a : b; }
  template <class G> static auto gradient(const G& g) {
    auto first = g.sym(g.in[0] <= g.in[1]);
    return g.grads(g.where(first, g.dy, 0), g.where(first, 0, g.dy));
  }
  static constexpr text mxnet[] = {"broadcast_minimum", "_minimum", "_Minimum"};
  static constexpr text mxnet_scalar = "_minimum_scalar";
};
struct where : entry<where_name, none_name, 3, select> {
  template <class T> HYBRA_HD static constexpr T apply(bool c, T a, T b) { return c ? a : b; }
  template <class G> static auto gradient(const G& g) {
    auto r = g.grads(g.where(g.in[0], g.dy, 0), g.where(g.in[0], 0, g.dy));
    r.insert(r.begin(), typename G::symbol());
    return r;
  }
};
// log(1 + e^x), computed as max(x, 0) + log1p(e^-|x|): exact where e^x would
// overflow (MXNet's softrelu returns inf above x = 88 in float32) and where
// 1 + e^x would round to 1. MXNet's spelling is an Activation.
struct softplus : entry<softplus_name, none_name, 1, promote_float> {
  static constexpr bool costly = true;
  template <class T> HYBRA_HD static T apply(T a) {
    return relu::apply(a) + math::log1p(math::exp(-abs::apply(a)));
  }
  template <class G> static auto gradient(const G& g) { return g.grads(g.dy * g.sigmoid(g.in[0])); }
  static constexpr text mxnet_activation = "softrelu";
};
// The Gauss error function, for GELU (expr/expression.hpp); its derivative
// is 2/sqrt(pi) e^(-x^2).
struct erf : entry<erf_name, none_name, 1, promote_float> {
  static constexpr bool costly = true;
  template <class T> HYBRA_HD static T apply(T a) { return math::erf(a); }
  template <class G> static auto gradient(const G& g) {
    return g.grads(g.dy * 1.1283791670955126 * g.exp(-(g.in[0] * g.in[0])));
  }
};

#ifndef __CUDACC_RTC__
#define HYBRA_OP_TYPE(id) , id
template <class Ignored, class... Ops>
using drop_first = std::tuple<Ops...>;
using elementwise_ops = drop_first<void HYBRA_ELEMENTWISE_OPS(HYBRA_OP_TYPE)>;
#undef HYBRA_OP_TYPE

// Generated CUDA calls an op by its name (hybra::op::<name>::apply).
#define HYBRA_NAME_IS_IDENTIFIER(id) static_assert(id::name == #id, "hybra: the entry op::" #id " names another op");
HYBRA_ELEMENTWISE_OPS(HYBRA_NAME_IS_IDENTIFIER)
#undef HYBRA_NAME_IS_IDENTIFIER

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
