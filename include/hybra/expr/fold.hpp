#pragma once
// The one walk over an expression tree that every consumer shares: shape and
// dtype inference, leaf collection, kernel building, printing and unfused
// evaluation are all folds. Children are visited left to right (braced
// initialisation fixes the order), so leaf numbering is the same in every fold.
#include <boost/hana/front.hpp>
#include <boost/hana/unpack.hpp>

#include "expression.hpp"

namespace hybra {

// Returns leaf(value) for a terminal (or a bare Tensor) and node(Op{}, folded children...) for an
// operator or op-table call, where Op is the node's op-table entry.
template <class E, class Leaf, class Node>
decltype(auto) fold(const E& e, Leaf& leaf, Node& node) {
  using X = std::remove_cvref_t<E>;
  if constexpr (!yap::is_expr<X>::value) {
    return leaf(e);  // a bare Tensor is a one-leaf tree
  } else if constexpr (X::kind == yap::expr_kind::expr_ref) {
    return fold(yap::deref(e), leaf, node);
  } else if constexpr (X::kind == yap::expr_kind::terminal) {
    return leaf(yap::value(e));
  } else if constexpr (X::kind == yap::expr_kind::call) {
    using Op = std::remove_cvref_t<decltype(yap::value(boost::hana::front(e.elements)))>;
    // Unpacked whole (drop_front would copy): leaves are folded in place.
    return boost::hana::unpack(e.elements, [&](const auto&, const auto&... children) {
      using Folded = boost::hana::tuple<std::remove_cvref_t<decltype(fold(children, leaf, node))>...>;
      return boost::hana::unpack(Folded{fold(children, leaf, node)...},
                                 [&](auto&&... r) { return node(Op{}, static_cast<decltype(r)&&>(r)...); });
    });
  } else {
    using Op = typename operator_op<X::kind>::type;
    return boost::hana::unpack(e.elements, [&](const auto&... children) {
      using Folded = boost::hana::tuple<std::remove_cvref_t<decltype(fold(children, leaf, node))>...>;
      return boost::hana::unpack(Folded{fold(children, leaf, node)...},
                                 [&](auto&&... r) { return node(Op{}, static_cast<decltype(r)&&>(r)...); });
    });
  }
}

}  // namespace hybra
