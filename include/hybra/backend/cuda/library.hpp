#pragma once
// A shared library opened at run time. hybra reaches CUDA this way (the
// driver, NVRTC), so a program built with plain g++ and no CUDA at link time
// runs on machines with or without a GPU, and linking the driver's stub
// library (which breaks loading where no driver is installed) never happens.
#include <dlfcn.h>

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "../../core/error.hpp"

namespace hybra::backend::cuda {

class SharedLibrary {
 public:
  SharedLibrary() = default;
  // Opens the first of `names` that loads; if none does, the library stays
  // closed and error() says why for each. RTLD_NODELETE: CUDA's libraries
  // are never unmapped (they keep process-wide state, such as the C++
  // runtime's exception pool NVRTC carries, which would otherwise dangle).
  explicit SharedLibrary(std::initializer_list<const char*> names) {
    for (const char* name : names) {
      if ((handle_ = ::dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE))) {
        name_ = name;
        return;
      }
      const char* why = ::dlerror();
      error_ += hybra::detail::concat(error_.empty() ? "" : "; ", why ? why : name);
    }
  }
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
