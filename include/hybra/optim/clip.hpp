#pragma once
// Gradient clipping by global norm, as Gluon's gluon.utils.clip_global_norm.
// In training, Trainer::clip_global_norm clips the summed gradients between
// allreduce_grads() and update(), every device's copy alike.
#include <cmath>
#include <span>
#include <vector>

#include "../core/error.hpp"
#include "../core/tensor.hpp"
#include "../ops/reduce.hpp"

namespace hybra::optim {

namespace detail {
inline void check_max_norm(double max_norm) {
  if (!(max_norm > 0)) fail<ValueError>("clip_global_norm: max_norm must be > 0, not ", max_norm);
}
}  // namespace detail

// The 2-norm of all the arrays' elements together, summed in double.
// Waits for the arrays.
inline double global_norm(std::span<const Tensor> arrays) {
  std::vector<Tensor> squares;  // all queued before the first wait
  for (const Tensor& a : arrays) {
    if (!is_floating(a.dtype()))
      fail<DTypeError>("clip_global_norm: arrays must be floating (float32, float64, float16, bfloat16), not ",
                       name(a.dtype()));
    const Tensor wide = a.astype(DType::float64);
    squares.push_back(sum(wide * wide));
  }
  double total = 0;
  for (const Tensor& s : squares) total += s.item<double>();
  return std::sqrt(total);
}

// Scales every array in place by max_norm / (norm + 1e-8) where `norm`
// exceeds max_norm. A norm that is not finite (a NaN or an infinite
// gradient) leaves the arrays as they are: the caller, given the norm,
// decides (skip the step, lower a loss scale) rather than have every
// gradient turned to NaN.
inline void scale_to_norm(std::span<Tensor> arrays, double norm, double max_norm) {
  detail::check_max_norm(max_norm);
  if (!std::isfinite(norm)) return;
  const double scale = max_norm / (norm + 1e-8);
  if (scale < 1)
    for (Tensor& a : arrays) a.assign(a * scale);
}

// Clips the arrays to a global norm of at most max_norm (scale_to_norm) and
// returns their norm before. Waits for the arrays.
inline double clip_global_norm(std::span<Tensor> arrays, double max_norm) {
  detail::check_max_norm(max_norm);
  const double norm = global_norm(arrays);
  scale_to_norm(arrays, norm, max_norm);
  return norm;
}

}  // namespace hybra::optim
