#pragma once
// batch_norm's inference form on a GPU, as include/hybra/ops/conv.hpp
// computes it on the CPU; include/hybra/ops/conv_cuda.hpp writes the entry
// and launches it; tests run it on the CPU (tests/unit/simt.hpp).
#include "grid.cuh"

namespace hybra::kernels {

// y = x scale[c] + shift[c] over x seen as (outer, C, inner): batch_norm's
// inference form, scale = gamma / sqrt(var + eps), shift = beta - mean scale
// (computed per element: a thread would wait longer for a table of them).
__device__ inline float square_root(float v) { return ::sqrtf(v); }
__device__ inline double square_root(double v) { return ::sqrt(v); }

template <class T>
__device__ void batch_norm(const T* x, const T* gamma, const T* beta, const T* mean, const T* var, T* y,
                           long long outer, long long C, long long inner, double eps) {
  const long long total = outer * C * inner;
  for (long long i = first_element(); i < total; i += grid_stride()) {
    const long long c = i / inner % C;
    const T scale = gamma[c] / square_root(var[c] + static_cast<T>(eps));
    y[i] = x[i] * scale + (beta[c] - mean[c] * scale);
  }
}

}  // namespace hybra::kernels
