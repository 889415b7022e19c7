#pragma once
// Printing in MXNet NDArray's style: nested brackets, then
// `<Tensor 2x3 @cpu(0)>` (the dtype is named when it is not float32).
// Tensors over 1000 elements show the first and last 3 entries per axis.
#include <cmath>
#include <iomanip>
#include <ostream>
#include <sstream>

#include "tensor.hpp"

namespace hybra {

namespace detail {

template <class T>
std::string format_element(T v) {
  std::ostringstream os;
  if constexpr (!std::is_arithmetic_v<T>) {  // float16_t, bfloat16_t
    return format_element(static_cast<float>(v));
  } else if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
    os << std::setprecision(std::is_same_v<T, float> ? 8 : 16) << v;
    auto s = os.str();
    if (s.find_first_of(".e") == std::string::npos) s += '.';
    return s;
  } else {
    os << +v;
    return os.str();
  }
}

template <class T>
void print_axis(std::ostream& os, const Tensor& t, const T* base, int axis, std::int64_t offset, bool summarise,
                int indent) {
  const std::int64_t n = t.shape()[axis];
  const std::int64_t stride = t.strides()[axis];
  os << '[';
  for (std::int64_t i = 0; i < n; ++i) {
    if (summarise && n > 6 && i == 3) {
      os << (axis + 1 == t.ndim() ? "... " : "...\n" + std::string(indent + 1, ' '));
      i = n - 3;
    }
    if (axis + 1 == t.ndim()) os << format_element(base[offset + i * stride]);
    else print_axis(os, t, base, axis + 1, offset + i * stride, summarise, indent + 1);
    if (i + 1 < n) os << (axis + 1 == t.ndim() ? " " : "\n" + std::string(indent + 1, ' '));
  }
  os << ']';
}

}  // namespace detail

inline std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "<Tensor empty handle>";
  const Tensor host = t.device().kind == DeviceKind::cuda ? t.to(cpu()) : t;
  host.wait_to_read();
  dispatch_stored(host.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* base = static_cast<const T*>(host.raw_data());
    if (host.ndim() == 0) os << detail::format_element(base[0]);
    else detail::print_axis(os, host, base, 0, 0, host.size() > 1000, 0);
  });
  os << "\n<Tensor ";
  if (t.ndim() == 0) os << "()";
  for (int i = 0; i < t.ndim(); ++i) os << (i ? "x" : "") << t.shape()[i];
  if (t.dtype() != DType::float32) os << ' ' << name(t.dtype());
  return os << " @" << t.device() << '>';
}

}  // namespace hybra
