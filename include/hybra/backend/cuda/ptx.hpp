#pragma once
// CUDA source → PTX through NVRTC, once per source, target architecture,
// NVRTC (backend::cuda::nvrtc_identity) and version of the hybra headers a
// kernel includes: later requests, in this process or the next, come from the
// kernel cache (kernel_cache.hpp), without loading NVRTC.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "nvrtc.hpp"
#include "kernel_cache.hpp"

namespace hybra::backend::cuda {

// The directory that holds hybra/ (the one consumers put on their include
// path), for NVRTC's -I: generated kernels include hybra's headers. Where
// they were when the program was compiled, unless $HYBRA_INCLUDE_DIR says
// where they are now (a moved build, a bundle carried to another machine).
inline const std::string& hybra_include_dir() {
  static const std::string dir = [] {
    if (const char* v = std::getenv("HYBRA_INCLUDE_DIR"); v && *v) {
      if (!std::filesystem::exists(std::filesystem::path(v) / "hybra" / "ops" / "elementwise.hpp"))
        fail<Error>("cuda: HYBRA_INCLUDE_DIR=", v, " holds no hybra/ops/elementwise.hpp: it must name the directory ",
                    "that holds hybra's headers (hybra/), which NVRTC compiles into kernels");
      return std::string(v);
    }
    // __FILE__ is this header as the compiler first opened it, perhaps
    // through "..": <dir>/hybra/backend/cuda/ptx.hpp once normalised.
    const std::filesystem::path self = std::filesystem::path(__FILE__).lexically_normal();
    return self.parent_path().parent_path().parent_path().parent_path().string();
  }();
  return dir;
}

// The directory that holds kernels/, the hand-written device code NVRTC
// compiles with hybra's generated entries (as <kernels/NAME.cuh>):
// $HYBRA_KERNELS_DIR's parent when it names that kernels/ directory, else the
// one beside the headers: the source tree's top level, or share/hybra where
// CMake installs it.
inline const std::string& kernels_parent_dir() {
  static const std::string dir = [] {
    if (const char* v = std::getenv("HYBRA_KERNELS_DIR"); v && *v) {
      const std::filesystem::path kernels = std::filesystem::path(v).lexically_normal();
      const std::filesystem::path named = kernels.has_filename() ? kernels : kernels.parent_path();
      if (named.filename() != "kernels" || !std::filesystem::exists(named / "reduce.cuh"))
        fail<Error>("cuda: HYBRA_KERNELS_DIR=", v, " must name a directory called kernels that holds hybra's ",
                    "device code (reduce.cuh, ...): NVRTC includes it as <kernels/NAME.cuh>");
      return named.parent_path().string();
    }
    const std::filesystem::path include(hybra_include_dir());
    for (const auto& candidate : {include.parent_path(), include.parent_path() / "share" / "hybra"})
      if (std::filesystem::exists(candidate / "kernels" / "reduce.cuh")) return candidate.string();
    fail<Error>("cuda: hybra's device code (kernels/reduce.cuh) is neither in ", include.parent_path().string(),
                " nor in ", (include.parent_path() / "share" / "hybra").string(),
                ", where NVRTC looks for it; HYBRA_KERNELS_DIR names another directory");
  }();
  return dir;
}

// The hybra files NVRTC compiles into kernels (every .cuh of kernels/ among
// them), hashed into every cache key: a changed op table or kernel must not
// be served the old code.
inline const std::string& kernel_headers_hash() {
  static const std::string hash = [] {
    const std::filesystem::path include(hybra_include_dir()), kernels(kernels_parent_dir());
    std::string text;
    std::vector<std::filesystem::path> files{include / "hybra/ops/elementwise.hpp", include / "hybra/core/macros.hpp"};
    std::vector<std::filesystem::path> device_code;
    for (const auto& entry : std::filesystem::directory_iterator(kernels / "kernels"))
      if (entry.path().extension() == ".cuh") device_code.push_back(entry.path());
    std::sort(device_code.begin(), device_code.end());  // the directory's order is the file system's
    files.insert(files.end(), device_code.begin(), device_code.end());
    for (const auto& file : files) {
      std::ifstream in(file, std::ios::binary);
      if (!in) fail<Error>("cuda: hybra's file ", file.string(), ", which NVRTC compiles into kernels, cannot be read");
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
  const std::string key = hybra::detail::concat("nvrtc ", backend::cuda::nvrtc_identity(), "\nheaders ",
                                                kernel_headers_hash(), '\n', arch, '\n', name, '\n', source);
  return cache.get(key, [&] {
    return backend::cuda::nvrtc().compile_ptx(source, name, arch,
                                              {"-I" + hybra_include_dir(), "-I" + kernels_parent_dir()});
  });
}

// cuda_ptx for the program named `name` (unique to its source, which
// make_source() writes only the first time, unless
// backend::cuda::check_caches() has it written each time and compared), kept
// for the process: the reference stays valid, so engine ops may hold it, and
// later calls cost a lookup.
template <class MakeSource>
const std::string& program_ptx(const std::string& name, const std::string& arch, MakeSource&& make_source) {
  struct Program {
    std::string source_hash, ptx;
  };
  static std::mutex& mutex = *new std::mutex;
  static auto& compiled = *new std::map<std::string, Program>;  // ops still queued at exit may use it
  std::lock_guard g(mutex);
  const std::string key = name + '\n' + arch;
  auto it = compiled.find(key);
  if (it == compiled.end()) {
    const std::string source = make_source();
    it = compiled.emplace(key, Program{fnv1a64_hex(source), cuda_ptx(source, name + ".cu", arch)}).first;
  } else if (backend::cuda::check_caches() && fnv1a64_hex(make_source()) != it->second.source_hash) {
    fail<Error>("cuda: program ", name, " was compiled from other source than this request's: its name misses "
                "something its code depends on");
  }
  return it->second.ptx;
}

}  // namespace hybra::backend::cuda
