#pragma once
// Random fills and dropout on a GPU: element pair j of a fill takes counter block
// first + j, as the CPU's fill does (include/hybra/core/creation.hpp), and
// both make their values with include/hybra/core/philox.hpp, so a tensor
// drawn on a GPU holds what it would hold drawn on the CPU.
// include/hybra/backend/cuda/random.hpp writes the entries and launches them;
// tests run them on the CPU (tests/unit/simt.hpp).
#include <hybra/core/philox.hpp>

#include "grid.cuh"

namespace hybra::kernels {

// What a fill draws: the key, its first counter block, and the draw's two
// parameters (uniform: low and high; normal: mean and standard deviation).
struct draw_params {
  unsigned long long first;
  unsigned int key0, key1;
  double a, b;
};

template <class T, bool Normal>
__device__ void random_fill(T* out, long long count, draw_params p) {
  const long long pairs = (count + 1) / 2;
  for (long long j = first_element(); j < pairs; j += grid_stride()) {
    T v0, v1;
    philox::draw_pair<T>(Normal, p.a, p.b, philox::block(p.first + static_cast<unsigned long long>(j), p.key0, p.key1),
                         v0, v1);
    out[2 * j] = v0;
    if (2 * j + 1 < count) out[2 * j + 1] = v1;
  }
}

// dropout's training form, as include/hybra/ops/nn.hpp computes it on the
// CPU: element i draws the uniform random_uniform(0, 1) would give it, and
// y = x / (1 - rate) where that is at least rate, else 0. The draws start at
// from_plan's key and block when given (a captured plan writes them there
// before each call, so a replayed CUDA graph draws anew), else at by_value's.
template <class T>
__device__ void dropout(const T* x, T* y, long long count, draw_params by_value, const draw_params* from_plan,
                        double rate) {
  const draw_params p = from_plan ? *from_plan : by_value;
  const T threshold = static_cast<T>(rate), scale = static_cast<T>(1.0 - rate);
  const long long pairs = (count + 1) / 2;
  for (long long j = first_element(); j < pairs; j += grid_stride()) {
    T keep0, keep1;
    philox::draw_pair<T>(false, 0.0, 1.0, philox::block(p.first + static_cast<unsigned long long>(j), p.key0, p.key1),
                         keep0, keep1);
    y[2 * j] = keep0 >= threshold ? x[2 * j] / scale : T(0);
    if (2 * j + 1 < count) y[2 * j + 1] = keep1 >= threshold ? x[2 * j + 1] / scale : T(0);
  }
}

}  // namespace hybra::kernels
