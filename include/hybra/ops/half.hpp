#pragma once
// How every op computes on the 16-bit floats (core/half.hpp): in float32. An
// op whose operands include a float16 or bfloat16 tensor converts those to
// float32, runs itself on them, and converts its floating results to the
// dtype its operands promote to (float16 with float16 stays float16; with a
// float32 tensor it is float32), or to the dtype the op names (batch_norm's
// is its input's: its statistics stay float32, as Gluon keeps them). So sums, products and normalisations
// accumulate in float32 (or wider) and round once, at the end, and gradients
// flow through the conversions as through any astype. Each op's entry starts
// with
//   if (auto r = compute_in_float32({x, w}, [](std::span<const Tensor> f) { return op(f[0], f[1]); })) return *r;
// Elementwise ops do the same in one place (expr/elementwise_op.hpp).
#include <concepts>
#include <initializer_list>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include "../core/tensor.hpp"

namespace hybra::detail {

// The dtype the floating results of an op on `operands` take (undefined
// operands, an absent bias, are skipped); nullopt when none is a 16-bit float.
inline std::optional<DType> half_result_dtype(std::initializer_list<Tensor> operands) {
  std::optional<DType> result;
  bool half = false;
  for (const Tensor& t : operands) {
    if (!t.defined()) continue;
    half = half || is_half(t.dtype());
    result = result ? promote_types(*result, t.dtype()) : t.dtype();
  }
  if (!half) return std::nullopt;
  return result;
}

inline Tensor result_as(const Tensor& t, DType d) {
  return t.defined() && is_floating(t.dtype()) && t.dtype() != d ? t.astype(d) : t;
}

template <class Op>
auto compute_in_float32(std::initializer_list<Tensor> operands, Op&& op, std::optional<DType> result_dtype = {})
    -> std::optional<std::invoke_result_t<Op&, std::span<const Tensor>>> {
  std::optional<DType> result = half_result_dtype(operands);
  if (!result) return std::nullopt;
  if (result_dtype) result = result_dtype;
  std::vector<Tensor> wide;
  for (const Tensor& t : operands) wide.push_back(t.defined() && is_half(t.dtype()) ? t.astype(DType::float32) : t);
  auto out = op(std::span<const Tensor>(wide));
  if (!is_half(*result)) return out;
  if constexpr (std::same_as<decltype(out), Tensor>) {
    return result_as(out, *result);
  } else {
    for (Tensor& t : out) t = result_as(t, *result);
    return out;
  }
}

}  // namespace hybra::detail
