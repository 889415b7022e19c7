#pragma once
// CUDA source → PTX through NVRTC, once per source, target architecture,
// NVRTC version and version of the hybra headers a kernel includes: later
// requests, in this process or the next, come from the kernel cache
// (kernel_cache.hpp).
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "../backend/cuda/nvrtc.hpp"
#include "kernel_cache.hpp"

namespace hybra::jit {

// The directory that holds hybra/ (the one consumers put on their include
// path), for NVRTC's -I: generated kernels include hybra's headers.
inline std::string hybra_include_dir() {
  return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path().string();
}

// The hybra headers NVRTC compiles into generated kernels, hashed into every
// cache key: a changed op table must not be served the old code.
inline const std::string& kernel_headers_hash() {
  static const std::string hash = [] {
    std::string text;
    for (const char* header : {"hybra/ops/elementwise.hpp", "hybra/core/macros.hpp"}) {
      std::ifstream in(std::filesystem::path(hybra_include_dir()) / header, std::ios::binary);
      if (!in) fail<Error>("cuda: hybra's header ", header, " is not under ", hybra_include_dir(),
                           ", where NVRTC will look for it");
      text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    return fnv1a64_hex(text);
  }();
  return hash;
}

// sm_90 (H100/H200): the architecture CI compiles every generated kernel for.
inline constexpr const char* default_cuda_arch = "compute_90";

inline std::string cuda_ptx(const std::string& source, const std::string& name, const std::string& arch = default_cuda_arch,
                            KernelCache& cache = KernelCache::global()) {
  const auto& compiler = backend::cuda::nvrtc();
  const std::string key = hybra::detail::concat("nvrtc ", compiler.version(), "\nheaders ", kernel_headers_hash(), '\n',
                                                arch, '\n', name, '\n', source);
  return cache.get(key, [&] { return compiler.compile_ptx(source, name, arch, {"-I" + hybra_include_dir()}); });
}

}  // namespace hybra::jit
