#pragma once
// Helpers the op tests share to build inputs and walk reference loops.
#include <hybra/eager.hpp>
#include <vector>

namespace hybra::test {

// Small integers (centred on 0, except uint8) in a scrambled order, so sums
// and products are exact in every dtype whatever the summation order.
inline Tensor small_ints(const Shape& shape, DType dtype, int seed = 0, int modulus = 11) {
  std::vector<double> v(static_cast<std::size_t>(checked_numel(shape)));
  for (std::size_t i = 0; i < v.size(); ++i) {
    auto r = static_cast<double>((i * 7 + static_cast<std::size_t>(seed) * 5 + 3) % static_cast<std::size_t>(modulus));
    v[i] = dtype == DType::uint8 ? r : r - modulus / 2;
  }
  return array(v, shape).astype(dtype);
}

inline std::vector<std::int64_t> unravel(std::int64_t flat, const Shape& shape) {
  std::vector<std::int64_t> idx(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
  return idx;
}

inline std::int64_t ravel(const std::vector<std::int64_t>& idx, const Shape& shape) {
  std::int64_t flat = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + idx[d];
  return flat;
}

}  // namespace hybra::test
