#pragma once
// A dtype conversion on a GPU (astype, a copy into another dtype): one kernel
// per pair of dtypes.
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "../../core/dtype.hpp"
#include "gpu.hpp"
#include "launch.hpp"
#include "ptx.hpp"
#include "source.hpp"

namespace hybra::backend::cuda {

// Converts a contiguous tensor to another dtype, each element by a C++
// conversion, as astype does on the CPU (so a value the new dtype cannot
// hold converts as C++ leaves undefined, and may differ between devices).
inline std::string cuda_convert_kernel_name(DType from, DType to) {
  return "hybra_convert_" + std::string(name(from)) + "_to_" + std::string(name(to));
}

inline CudaKernel cuda_convert_kernel(DType from, DType to) {
  CudaKernel k;
  k.name = cuda_convert_kernel_name(from, to);
  k.definition =
      "extern \"C\" __global__ void " + k.name + "(const " + std::string(cuda_type(from)) + "* __restrict__ in, " +
      std::string(cuda_type(to)) + "* __restrict__ out, long long n) {\n" +
      "  const long long stride = static_cast<long long>(blockDim.x) * gridDim.x;\n" +
      "  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n; i += stride)\n" +
      "    out[i] = static_cast<" + std::string(cuda_type(to)) + ">(in[i]);\n}\n";
  return k;
}

// The launch that converts `count` contiguous elements.
inline CudaLaunch cuda_convert_launch(DType from, DType to, std::int64_t count, backend::cuda::Gpu& gpu) {
  std::string kernel = cuda_convert_kernel_name(from, to);
  const std::string& ptx =
      program_ptx(kernel, gpu.arch(), [&] { return cuda_program({cuda_convert_kernel(from, to)}); });
  return {0, [&ptx, kernel = std::move(kernel), count](backend::cuda::Gpu& gpu, std::span<const void* const> in,
                                                       void* out, void*) {
            const void* source = in[0];
            long long n = count;
            void* args[] = {&source, &out, &n};
            gpu.launch(gpu.function(ptx, kernel), n, args, "astype");
          }};
}

}  // namespace hybra::backend::cuda
