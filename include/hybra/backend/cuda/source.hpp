#pragma once
// CUDA source text that every generated kernel shares: the CUDA type of each
// dtype, a kernel as a name and a definition, and the NVRTC program that
// holds kernels. Every program includes the op table (ops/elementwise.hpp),
// whose ops' `apply` the generated code calls, so that the GPU computes what
// the CPU loops compute, from the same line of code.
#include <string>
#include <string_view>
#include <vector>

#include "../../core/dtype.hpp"
#include "../../core/error.hpp"

namespace hybra::backend::cuda {

// The C++ type a dtype is in CUDA source.
inline std::string_view cuda_type(DType d) {
  switch (d) {
    case DType::float32: return "float";
    case DType::float64: return "double";
    case DType::int32: return "int";
    case DType::int64: return "long long";
    case DType::uint8: return "unsigned char";
    case DType::float16: return "hybra::float16_t";
    case DType::bfloat16: return "hybra::bfloat16_t";
  }
  fail<DTypeError>("cuda: no CUDA type for dtype ", static_cast<int>(d));
}

struct CudaKernel {
  std::string name;        // its extern "C" name
  std::string definition;  // the __global__ function; cuda_program() makes sources of definitions
};

// One NVRTC program holding the kernels: one compile, one module.
inline std::string cuda_program(const std::vector<CudaKernel>& kernels) {
  std::string source = "#include <hybra/ops/elementwise.hpp>\n";
  for (const auto& k : kernels) source += "\n" + k.definition;
  return source;
}

}  // namespace hybra::backend::cuda
