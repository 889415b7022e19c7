#pragma once
// A shared library opened at run time. hybra reaches CUDA this way (the
// driver, NVRTC), so a program built with plain g++ and no CUDA at link time
// runs on machines with or without a GPU, and linking the driver's stub
// library (which breaks loading where no driver is installed) never happens.
#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../../core/error.hpp"

namespace hybra::backend::cuda {

// The CUDA toolkit's root, for its headers (NVRTC's include path) and its
// libraries: $HYBRA_CUDA_HOME, else $CUDA_HOME, else /usr/local/cuda.
inline std::string cuda_home() {
  for (const char* var : {"HYBRA_CUDA_HOME", "CUDA_HOME"})
    if (const char* v = std::getenv(var); v && *v) return v;
  return "/usr/local/cuda";
}

// The files a CUDA library of one of `sonames` (newest first) may be, in
// the order they are tried: in $HYBRA_CUDA_LIB_DIR (a toolkit's libraries
// somewhere of their own), then in the toolkit's lib64 (cuda_home(), whose
// headers NVRTC compiles with), then wherever the dynamic loader finds the
// soname. An installed or moved program thus finds NVRTC and cuBLAS without
// LD_LIBRARY_PATH, and NVRTC comes from the toolkit whose headers it reads.
inline std::vector<std::string> cuda_library_candidates(std::initializer_list<const char*> sonames) {
  std::vector<std::string> names;
  if (const char* dir = std::getenv("HYBRA_CUDA_LIB_DIR"); dir && *dir)
    for (const char* soname : sonames) names.push_back(std::string(dir) + '/' + soname);
  for (const char* soname : sonames) names.push_back(cuda_home() + "/lib64/" + soname);
  names.insert(names.end(), sonames.begin(), sonames.end());
  return names;
}

// What must run at exit before the CUDA libraries tear down what they made:
// the engine's pending GPU work, which may still call them (the engine sets
// it while it exists: engine/engine.hpp). Exit handlers run in the reverse
// order of their registration, and a library registers its own as it loads
// and as it makes handles, so finish_gpu_work_first() registers the drain
// again after each of those: it runs before all of them.
inline std::atomic<void (*)()>& exit_drain() {
  static std::atomic<void (*)()> drain{nullptr};
  return drain;
}
inline void finish_gpu_work_first() {
  std::atexit([] {
    if (void (*drain)() = exit_drain().load()) drain();
  });
}

// HYBRA_CUDA_CHECK_CACHES=1: each cache of compiled GPU code by name
// (programs, an eager expression's kernels) checks at
// every hit that what it holds is what the request would compile, so that a
// key missing something the code depends on is an error rather than a wrong
// kernel. It regenerates source at each use: for the tests.
inline bool check_caches() {
  static const bool on = [] {
    const char* v = std::getenv("HYBRA_CUDA_CHECK_CACHES");
    return v && std::string_view(v) == "1";
  }();
  return on;
}

class SharedLibrary {
 public:
  SharedLibrary() = default;
  // Opens the first of `names` that loads; if none does, the library stays
  // closed and error() says why for each. RTLD_NODELETE: CUDA's libraries
  // are never unmapped (they keep process-wide state, such as the C++
  // runtime's exception pool NVRTC carries, which would otherwise dangle).
  explicit SharedLibrary(const std::vector<std::string>& names) {
    for (const auto& name : names) {
      if ((handle_ = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE))) {
        name_ = name;
        finish_gpu_work_first();
        return;
      }
      const char* why = ::dlerror();
      error_ += hybra::detail::concat(error_.empty() ? "" : "; ", why ? std::string_view(why) : name);
    }
  }
  explicit SharedLibrary(std::initializer_list<const char*> names)
      : SharedLibrary(std::vector<std::string>(names.begin(), names.end())) {}
  SharedLibrary(const SharedLibrary&) = delete;
  SharedLibrary& operator=(const SharedLibrary&) = delete;
  SharedLibrary(SharedLibrary&& o) noexcept
      : handle_(std::exchange(o.handle_, nullptr)), name_(std::move(o.name_)), error_(std::move(o.error_)) {}
  SharedLibrary& operator=(SharedLibrary&& o) noexcept {
    std::swap(handle_, o.handle_);
    std::swap(name_, o.name_);
    std::swap(error_, o.error_);
    return *this;
  }
  ~SharedLibrary() {
    if (handle_) ::dlclose(handle_);
  }

  bool loaded() const { return handle_ != nullptr; }
  const std::string& name() const { return name_; }
  const std::string& error() const { return error_; }

  // The function `symbol` as a pointer of type F; throws naming the library
  // and the symbol when it is missing (an older library than hybra expects).
  template <class F>
  F function(const char* symbol) const {
    void* p = handle_ ? ::dlsym(handle_, symbol) : nullptr;
    if (!p) fail<DeviceError>("CUDA: ", name_.empty() ? std::string_view("a library that is not loaded") : name_,
                              " has no function ", symbol);
    return reinterpret_cast<F>(p);
  }

 private:
  void* handle_ = nullptr;
  std::string name_;
  std::string error_;
};

}  // namespace hybra::backend::cuda
