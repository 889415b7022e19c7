#pragma once
// The compile-time fusion kernel: a whole Yap expression, turned into its
// kernel tree on the host (include/hybra/expr/kernel.hpp: tensor leaves
// become device pointers, scalars values), computes element i in one
// expression, so `relu(a * b + 2)` is one kernel launch with no temporaries.
// The tree's operator() and the op table's `apply` are host-and-device
// functions, compiled by nvcc with --expt-relaxed-constexpr (std::get and
// friends are constexpr host functions; without the flag nvcc drops the
// kernel body with warning 20013/20015, which hybra's CMake makes errors).
#include <hybra/expr/kernel.hpp>

namespace hybra::kernels {

template <class Kernel, class Out>
__global__ void evaluate(Kernel k, Out* out, long long n) {
  const long long stride = static_cast<long long>(blockDim.x) * gridDim.x;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n; i += stride)
    out[i] = static_cast<Out>(k(i));
}

}  // namespace hybra::kernels
