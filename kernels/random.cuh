#pragma once
// Random fills on a GPU: element pair j of a fill takes counter block
// first + j, as the CPU's fill does (include/hybra/core/creation.hpp), and
// both make their values with include/hybra/core/philox.hpp, so a tensor
// drawn on a GPU holds what it would hold drawn on the CPU.
// include/hybra/jit/cuda_random.hpp writes the entries and launches them;
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

}  // namespace hybra::kernels
