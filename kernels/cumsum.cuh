#pragma once
// cumsum on a GPU, as include/hybra/ops/cumsum.hpp computes it on the CPU
// (which writes the entry and launches it); tests run it on the CPU
// (tests/unit/simt.hpp).
#include "grid.cuh"

namespace hybra::kernels {

// y = the running sums of x seen as (outer, R, inner) along R, from the
// first element or (reverse) from the last: a thread per (outer, inner)
// column, adding in the order the CPU adds.
template <class In, class Out>
__device__ void cumsum(const In* x, Out* y, long long outer, long long R, long long inner, bool reverse) {
  const long long columns = outer * inner;
  for (long long c = first_element(); c < columns; c += grid_stride()) {
    const long long start = c / inner * R * inner + c % inner;
    Out acc = 0;
    for (long long k = 0; k < R; ++k) {
      const long long at = start + (reverse ? R - 1 - k : k) * inner;
      acc += static_cast<Out>(x[at]);
      y[at] = acc;
    }
  }
}

}  // namespace hybra::kernels
