#pragma once
// An expression's typed graph as text. to_string(e) names tensor leaves a, b,
// c, ... in order of first appearance (the same tensor keeps its letter) and
// prints scalars by value: `relu((a * b) + 2)`. type_string(e) prints what
// the C++ type alone says: `relu((Tensor * Tensor) + int)`.
#include <algorithm>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "fold.hpp"

namespace hybra {

namespace detail {

template <class S>
constexpr const char* scalar_type_name() {
  if constexpr (std::is_same_v<S, bool>) return "bool";
  else if constexpr (std::is_same_v<S, float>) return "float";
  else if constexpr (std::is_same_v<S, double>) return "double";
  else if constexpr (std::is_same_v<S, int>) return "int";
  else if constexpr (std::is_same_v<S, long>) return "long";
  else if constexpr (std::is_same_v<S, unsigned>) return "unsigned";
  else if constexpr (std::is_floating_point_v<S>) return "floating";
  else return "integer";
}

// Folded value: the text and whether it is an infix node (needs parentheses
// when nested).
struct print_node {
  template <class Op, class... Children>
  std::pair<std::string, bool> operator()(Op, const Children&... c) const {
    const std::pair<std::string, bool>* parts[] = {&c...};
    auto wrapped = [](const std::pair<std::string, bool>& p) { return p.second ? "(" + p.first + ")" : p.first; };
    if (!Op::symbol.empty() && Op::arity == 2)
      return {wrapped(*parts[0]) + " " + std::string(Op::symbol) + " " + wrapped(*parts[1]), true};
    if (!Op::symbol.empty()) return {std::string(Op::symbol) + wrapped(*parts[0]), false};
    std::string s(Op::name);
    s += '(';
    for (std::size_t i = 0; i < sizeof...(Children); ++i) s += (i ? ", " : "") + parts[i]->first;
    return {s + ")", false};
  }
};

}  // namespace detail

template <class E>
std::string to_string(const E& e) {
  std::vector<const Tensor*> seen;
  auto leaf = [&](const auto& v) -> std::pair<std::string, bool> {
    using V = std::remove_cvref_t<decltype(v)>;
    if constexpr (std::is_same_v<V, Tensor>) {
      auto same_view = [&](const Tensor* t) {
        return t->storage() == v.storage() && t->shape() == v.shape() && t->strides() == v.strides() &&
               t->offset() == v.offset();
      };
      auto it = std::find_if(seen.begin(), seen.end(), same_view);
      if (it == seen.end()) it = seen.insert(it, &v);
      auto i = static_cast<std::size_t>(it - seen.begin());
      return {std::string(1, static_cast<char>('a' + i % 26)) + (i >= 26 ? std::to_string(i / 26) : ""), false};
    } else {
      std::ostringstream os;
      os << +v;
      return {os.str(), false};
    }
  };
  detail::print_node node;
  return fold(e, leaf, node).first;
}

template <class E>
std::string type_string(const E& e) {
  auto leaf = [](const auto& v) -> std::pair<std::string, bool> {
    using V = std::remove_cvref_t<decltype(v)>;
    if constexpr (std::is_same_v<V, Tensor>) return {"Tensor", false};
    else return {detail::scalar_type_name<V>(), false};
  };
  detail::print_node node;
  return fold(e, leaf, node).first;
}

}  // namespace hybra
