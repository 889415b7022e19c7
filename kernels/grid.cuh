#pragma once
// How the elementwise kernels of this directory cover their elements: a
// grid-stride loop, so one launch of any grid covers any count.

namespace hybra::kernels {

// The first of this thread's elements and the grid's stride over them.
__device__ inline long long first_element() { return blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; }
__device__ inline long long grid_stride() { return static_cast<long long>(blockDim.x) * gridDim.x; }

}  // namespace hybra::kernels
