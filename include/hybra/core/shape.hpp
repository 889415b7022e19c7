#pragma once
// N-d shapes and strides (in elements), row-major, with NumPy broadcasting.
#include <algorithm>
#include <array>
#include <boost/container/small_vector.hpp>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <ostream>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "error.hpp"

namespace hybra {

using Shape = boost::container::small_vector<std::int64_t, 6>;
using Strides = Shape;

inline std::ostream& print_shape(std::ostream& os, const Shape& s) {
  os << '(';
  for (std::size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  return os << (s.size() == 1 ? ",)" : ")");
}
inline std::string to_string(const Shape& s) {
  std::ostringstream os;
  print_shape(os, s);
  return os.str();
}

// Number of elements; rejects negative extents and products that overflow.
inline std::int64_t checked_numel(const Shape& s, std::string_view op = "shape") {
  std::int64_t n = 1;
  for (auto d : s) {
    if (d < 0) fail<ShapeError>(op, ": negative extent in shape ", to_string(s));
    if (d != 0 && n > std::numeric_limits<std::int64_t>::max() / d)
      fail<ShapeError>(op, ": shape ", to_string(s), " has more elements than fit in int64");
    n *= d;
  }
  return n;
}

inline Strides contiguous_strides(const Shape& s) {
  Strides st(s.size());
  std::int64_t acc = 1;
  for (std::size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    if (__builtin_mul_overflow(acc, s[i] ? s[i] : 1, &acc))
      fail<ShapeError>("shape ", to_string(s), " has more elements than fit in int64");
  }
  return st;
}

// Calls visit(at_0, at_1, ...) for each element of `shape` in row-major
// order, one offset per layout through its strides (in elements): a view read
// into another.
template <class Visit, class... Layouts>
void for_each_offsets(const Shape& shape, Visit&& visit, const Layouts&... strides) {
  Shape index(shape.size(), 0);
  std::array<std::int64_t, sizeof...(Layouts)> at{};
  for (std::int64_t n = checked_numel(shape); n > 0; --n) {
    std::apply(visit, at);
    for (std::size_t axis = shape.size(); axis-- > 0;) {
      std::size_t k = 0;
      ((at[k++] += strides[axis]), ...);
      if (++index[axis] < shape[axis]) break;
      k = 0;
      ((at[k++] -= strides[axis] * shape[axis]), ...);
      index[axis] = 0;
    }
  }
}

// The walk through one layout: how a view's values are read in order (a
// file's bytes, a batch's rows).
template <class Visit>
void for_each_offset(const Shape& shape, const Strides& strides, Visit&& visit) {
  for_each_offsets(shape, std::forward<Visit>(visit), strides);
}

inline Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op) {
  Shape out(std::max(a.size(), b.size()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    auto da = i < out.size() - a.size() ? 1 : a[i - (out.size() - a.size())];
    auto db = i < out.size() - b.size() ? 1 : b[i - (out.size() - b.size())];
    if (da != db && da != 1 && db != 1)
      fail<ShapeError>(op, ": shapes ", to_string(a), " and ", to_string(b), " cannot be broadcast together");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// Resolves a possibly negative axis against ndim, naming the op on failure.
inline int normalize_axis(std::int64_t axis, std::size_t ndim, std::string_view op) {
  auto n = static_cast<std::int64_t>(ndim);
  if (axis < -n || axis >= n)
    fail<AxisError>(op, ": axis ", axis, " is out of range for a tensor of ", ndim, " dimension",
                    ndim == 1 ? "" : "s");
  return static_cast<int>(axis < 0 ? axis + n : axis);
}

}  // namespace hybra
