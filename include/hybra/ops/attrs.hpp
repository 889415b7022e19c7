#pragma once
// An op node's attributes, kept as text (key, value) pairs in the order the
// op declares them, as MXNet's graph files keep them: printing, comparing
// nodes (common sub-expressions) and writing model files need no per-op code.
// Tuples are written "(0, 1)", a missing optional value "None".
#include <charconv>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../core/shape.hpp"

namespace hybra::op {

using Attrs = std::vector<std::pair<std::string, std::string>>;

inline std::string attr_text(std::int64_t v) { return std::to_string(v); }
inline std::string attr_text(bool v) { return v ? "true" : "false"; }
inline std::string attr_text(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}
inline std::string attr_text(const std::vector<std::int64_t>& v) { return to_string(Shape(v.begin(), v.end())); }
inline std::string attr_text(const Shape& v) { return to_string(v); }
template <class T>
std::string attr_text(const std::optional<T>& v) {
  return v ? attr_text(*v) : "None";
}

inline const std::string& find_attr(const Attrs& attrs, std::string_view key, std::string_view op) {
  for (const auto& [k, v] : attrs)
    if (k == key) return v;
  fail<ValueError>(op, ": attribute '", key, "' is missing");
}

inline std::int64_t parse_int(std::string_view text, std::string_view what) {
  std::int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || end != text.data() + text.size())
    fail<ValueError>(what, ": '", text, "' is not an integer");
  return v;
}
inline bool parse_bool(std::string_view text, std::string_view what) {
  if (text == "true" || text == "True" || text == "1") return true;
  if (text == "false" || text == "False" || text == "0") return false;
  fail<ValueError>(what, ": '", text, "' is not a boolean");
}
inline double parse_double(std::string_view text, std::string_view what) {
  try {
    std::size_t used = 0;
    double v = std::stod(std::string(text), &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  fail<ValueError>(what, ": '", text, "' is not a number");
}
// "(0, 1)", "(3,)", "()" or a bare "2" (one element).
inline std::vector<std::int64_t> parse_tuple(std::string_view text, std::string_view what) {
  std::vector<std::int64_t> out;
  if (!text.empty() && text.front() == '(') {
    if (text.back() != ')') fail<ValueError>(what, ": '", text, "' is not a tuple");
    text = text.substr(1, text.size() - 2);
  }
  while (!text.empty()) {
    auto comma = text.find(',');
    auto item = text.substr(0, comma);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (!item.empty()) out.push_back(parse_int(item, what));
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return out;
}
template <class Parse>
auto parse_optional(std::string_view text, Parse parse) -> std::optional<decltype(parse(text))> {
  if (text == "None") return std::nullopt;
  return parse(text);
}

// One attr read as its type, errors naming the op.
inline std::int64_t int_attr(const Attrs& a, std::string_view key, std::string_view op) {
  return parse_int(find_attr(a, key, op), op);
}
inline std::optional<std::int64_t> optional_int_attr(const Attrs& a, std::string_view key, std::string_view op) {
  return parse_optional(find_attr(a, key, op), [&](std::string_view t) { return parse_int(t, op); });
}
inline bool bool_attr(const Attrs& a, std::string_view key, std::string_view op) {
  return parse_bool(find_attr(a, key, op), op);
}
inline double double_attr(const Attrs& a, std::string_view key, std::string_view op) {
  return parse_double(find_attr(a, key, op), op);
}
inline std::optional<std::vector<std::int64_t>> optional_tuple_attr(const Attrs& a, std::string_view key,
                                                                   std::string_view op) {
  return parse_optional(find_attr(a, key, op), [&](std::string_view t) { return parse_tuple(t, op); });
}
inline Shape shape_attr(const Attrs& a, std::string_view key, std::string_view op) {
  auto s = parse_tuple(find_attr(a, key, op), op);
  return Shape(s.begin(), s.end());
}

}  // namespace hybra::op
