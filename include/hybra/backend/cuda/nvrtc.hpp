#pragma once
// NVRTC, CUDA's run-time compiler, loaded at run time (library.hpp): CUDA
// C++ source in, PTX out. It needs no GPU, so every kernel hybra generates
// is compiled and checked on machines without one.
//
// HYBRA_DEBUG=3 (core/debug.hpp) prints each program's source to stderr
// before it is compiled. A failed compile throws CompileError with NVRTC's log and the
// source, its lines numbered as the log refers to them.
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "../../core/debug.hpp"
#include "library.hpp"

namespace hybra::backend::cuda {

// Where the toolkit's headers are (CCCL for Thrust/CUB and libcu++, then the
// CUDA headers), under cuda_home().
inline std::vector<std::string> cuda_include_dirs() {
  const std::string home = cuda_home();
  return {home + "/include/cccl", home + "/include"};
}

inline constexpr std::initializer_list<const char*> nvrtc_sonames = {"libnvrtc.so.13", "libnvrtc.so.12"};

class Nvrtc {
 public:
  Nvrtc()
      : lib_(cuda_library_candidates(nvrtc_sonames)) {
    if (!lib_.loaded()) return;
    version_ = lib_.function<int (*)(int*, int*)>("nvrtcVersion");
    create_ = lib_.function<int (*)(void**, const char*, const char*, int, const char* const*, const char* const*)>(
        "nvrtcCreateProgram");
    compile_ = lib_.function<int (*)(void*, int, const char* const*)>("nvrtcCompileProgram");
    log_size_ = lib_.function<int (*)(void*, std::size_t*)>("nvrtcGetProgramLogSize");
    log_ = lib_.function<int (*)(void*, char*)>("nvrtcGetProgramLog");
    ptx_size_ = lib_.function<int (*)(void*, std::size_t*)>("nvrtcGetPTXSize");
    ptx_ = lib_.function<int (*)(void*, char*)>("nvrtcGetPTX");
    destroy_ = lib_.function<int (*)(void**)>("nvrtcDestroyProgram");
    error_string_ = lib_.function<const char* (*)(int)>("nvrtcGetErrorString");
  }

  bool loaded() const { return lib_.loaded(); }
  // Why NVRTC is not loaded (each library name tried, and what failed).
  const std::string& problem() const { return lib_.error(); }

  // "13.0": part of every cache key, since another NVRTC may compile the same
  // source to other code.
  std::string version() const {
    require("nvrtcVersion");
    int major = 0, minor = 0;
    version_(&major, &minor);
    return hybra::detail::concat(major, '.', minor);
  }

  // PTX for a virtual architecture such as "compute_90", which the driver
  // finishes for the GPU at load time.
  std::string compile_ptx(std::string_view source, const std::string& name, const std::string& arch,
                          const std::vector<std::string>& extra_options = {}) const {
    require(name);
    const std::string text(source);
    if (debug::at(debug::code)) debug::print("NVRTC program ", name, " for ", arch, '\n', text);
    // Unannotated functions are device code: hybra's headers compiled into a
    // kernel (the op table) mark theirs only for nvcc.
    std::vector<std::string> options{"--gpu-architecture=" + arch, "-std=c++20", "-default-device"};
    for (const auto& dir : cuda_include_dirs()) options.push_back("-I" + dir);
    options.insert(options.end(), extra_options.begin(), extra_options.end());
    std::vector<const char*> argv;
    for (const auto& o : options) argv.push_back(o.c_str());

    void* program = nullptr;
    check(create_(&program, text.c_str(), name.c_str(), 0, nullptr, nullptr), "nvrtcCreateProgram", name);
    struct Destroy {
      const Nvrtc& n;
      void*& p;
      ~Destroy() { n.destroy_(&p); }
    } destroy{*this, program};
    const int compiled = compile_(program, static_cast<int>(argv.size()), argv.data());
    if (compiled != 0) {
      std::size_t size = 0;
      log_size_(program, &size);
      std::string log(size, '\0');
      if (size) log_(program, log.data());
      while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
      fail<CompileError>("NVRTC could not compile ", name, " for ", arch, " (", error_string_(compiled), "):\n", log,
                         "\n--- ", name, " ---\n", numbered(text));
    }
    std::size_t size = 0;
    check(ptx_size_(program, &size), "nvrtcGetPTXSize", name);
    std::string ptx(size, '\0');
    check(ptx_(program, ptx.data()), "nvrtcGetPTX", name);
    while (!ptx.empty() && ptx.back() == '\0') ptx.pop_back();
    return ptx;
  }

 private:
  void require(std::string_view what) const {
    if (!lib_.loaded()) fail<DeviceError>("CUDA: NVRTC is needed for ", what, " but could not be loaded: ", problem());
  }
  void check(int result, const char* call, const std::string& name) const {
    if (result != 0) fail<CompileError>("NVRTC: ", call, " failed for ", name, ": ", error_string_(result));
  }
  static std::string numbered(const std::string& text) {
    std::ostringstream os;
    std::istringstream in(text);
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) os << n << ": " << line << '\n';
    return os.str();
  }

  SharedLibrary lib_;
  int (*version_)(int*, int*) = nullptr;
  int (*create_)(void**, const char*, const char*, int, const char* const*, const char* const*) = nullptr;
  int (*compile_)(void*, int, const char* const*) = nullptr;
  int (*log_size_)(void*, std::size_t*) = nullptr;
  int (*log_)(void*, char*) = nullptr;
  int (*ptx_size_)(void*, std::size_t*) = nullptr;
  int (*ptx_)(void*, char*) = nullptr;
  int (*destroy_)(void**) = nullptr;
  const char* (*error_string_)(int) = nullptr;
};

// The process's NVRTC, loaded on first use (milliseconds: the kernel cache
// keys entries by nvrtc_identity() so that hits do not load it).
inline const Nvrtc& nvrtc() {
  static const Nvrtc n;
  return n;
}

// Which NVRTC a compile would use, for the kernel cache's keys, named
// without loading it where a path finds it: the first candidate path that
// exists, by its name and its file's size ("libnvrtc.so.13, 109338064
// bytes": one build of NVRTC, whatever the packaging calls the file the
// soname points to); else, for an NVRTC only the dynamic loader finds, its
// nvrtcVersion ("13.0").
inline const std::string& nvrtc_identity() {
  static const std::string identity = [] {
    for (const auto& candidate : cuda_library_candidates(nvrtc_sonames)) {
      const std::filesystem::path path(candidate);
      if (!path.has_parent_path()) break;
      std::error_code ec;
      const auto bytes = std::filesystem::file_size(path, ec);  // follows the soname's link
      if (!ec) return hybra::detail::concat(path.filename().string(), ", ", bytes, " bytes");
    }
    return nvrtc().version();
  }();
  return identity;
}

}  // namespace hybra::backend::cuda
