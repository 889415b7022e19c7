#pragma once
// The fused kernel of an expression: a tree of small structs mirroring the
// Yap tree, with tensor leaves turned into pointers. `k(i)` computes element
// i of the whole expression; the compiler inlines it into one vector loop.
// Each node's C++ type follows the op table's dtype rule at compile time.
// Element access is host and device code: nvcc instantiates the same tree in
// a CUDA kernel (kernels/evaluate.cuh).
#include <cstdint>
#include <tuple>
#include <utility>

#include "../core/macros.hpp"
#include "fold.hpp"

namespace hybra::kernel {

// A C++ scalar's type as a weak operand: any arithmetic type maps to a dtype.
template <class S>
using scalar_type_t =
    std::conditional_t<std::is_floating_point_v<S>, std::conditional_t<std::is_same_v<S, float>, float, double>,
                       std::conditional_t<(sizeof(S) <= 4), std::int32_t, std::int64_t>>;

// Every kernel type has `costly` (does the subtree contain a costly op of the
// op table) and `prefetch(i)` (asks the cache for element i of every tensor
// leaf; see run_fused).
template <class T>
struct tensor_leaf {
  using type = T;
  static constexpr bool weak = false;
  static constexpr bool costly = false;
  const T* p;
  HYBRA_HD T operator()(std::int64_t i) const { return p[i]; }
  void prefetch(std::int64_t i) const { __builtin_prefetch(p + i); }
};

template <class S>
struct scalar_leaf {
  using type = S;
  static constexpr bool weak = true;
  static constexpr bool costly = false;
  S v;
  HYBRA_HD S operator()(std::int64_t) const { return v; }
  void prefetch(std::int64_t) const {}
};

template <class Op, class... Args>
struct node {
  using type = typename op::result<Op, Args...>::type;
  static constexpr bool weak = (Args::weak && ...);
  static constexpr bool costly = Op::costly || (Args::costly || ...);
  std::tuple<Args...> args;

  HYBRA_HD type operator()(std::int64_t i) const { return eval(i, std::index_sequence_for<Args...>{}); }
  void prefetch(std::int64_t i) const {
    std::apply([i](const auto&... a) { (a.prefetch(i), ...); }, args);
  }

 private:
  template <std::size_t... I>
  HYBRA_HD type eval(std::int64_t i, std::index_sequence<I...>) const {
    if constexpr (Op::rule == op::DTypeRule::select)
      return Op::apply(std::get<0>(args)(i) != 0, static_cast<type>(std::get<1>(args)(i)),
                       static_cast<type>(std::get<2>(args)(i)));
    else {
      // Operands in the order written (a braced list is evaluated left to
      // right; a call's arguments, by GCC, right to left): the loop then
      // starts on a product's first factor as a hand-written one does, which
      // for tanh(...) * exp(...) puts the longer chain first.
      const type operands[] = {static_cast<type>(std::get<I>(args)(i))...};
      return Op::apply(operands[I]...);
    }
  }
};

// Builds the kernel for an expression whose tensor leaves all have dtype T:
// leaf k (in fold order) reads element i at ptrs[k][i].
template <class T>
struct builder {
  const T* const* ptrs;
  int next = 0;

  auto operator()(const Tensor&) { return tensor_leaf<T>{ptrs[next++]}; }
  template <class S>
  auto operator()(const S& s) {
    static_assert(std::is_arithmetic_v<S>, "hybra: an expression leaf must be a Tensor or an arithmetic scalar");
    return scalar_leaf<scalar_type_t<S>>{static_cast<scalar_type_t<S>>(s)};
  }
};

struct node_maker {
  template <class Op, class... Args>
  auto operator()(Op, Args&&... args) const {
    return node<Op, std::remove_cvref_t<Args>...>{{static_cast<Args&&>(args)...}};
  }
};

template <class T, class E>
auto build(const E& e, const T* const* ptrs) {
  builder<T> leaf{ptrs};
  node_maker make;
  return fold(e, leaf, make);
}

// The C++ result type of expression E when its tensors have dtype T.
template <class E, class T>
using result_t = typename decltype(build<T>(std::declval<const E&>(), nullptr))::type;

}  // namespace hybra::kernel
