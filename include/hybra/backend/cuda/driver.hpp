#pragma once
// The CUDA driver, loaded at run time from libcuda.so.1 (never linked: see
// library.hpp). What a process learns once: whether the driver loads and
// initialises, and the GPUs it sees; with no driver or no GPU, why not.
#include <string>
#include <vector>

#include "library.hpp"

namespace hybra::backend::cuda {

struct Gpu {
  std::string name;
  int major = 0, minor = 0;  // compute capability
};

struct DriverStatus {
  std::string library;  // the file that loaded, if one did
  std::string problem;  // why no GPU is usable; empty when some is
  int version = 0;      // the driver's CUDA version, as 13000 for 13.0
  std::vector<Gpu> gpus;
};

namespace detail {
using CUresult = int;
inline constexpr int attribute_major = 75, attribute_minor = 76;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_*

inline DriverStatus probe_driver() {
  DriverStatus s;
  SharedLibrary lib({"libcuda.so.1"});
  if (!lib.loaded()) {
    s.problem = "the CUDA driver (libcuda.so.1) could not be loaded: " + lib.error();
    return s;
  }
  s.library = lib.name();
  try {
    auto init = lib.function<CUresult (*)(unsigned)>("cuInit");
    auto error_name = lib.function<CUresult (*)(CUresult, const char**)>("cuGetErrorName");
    auto check = [&](CUresult r, const char* call) {
      if (r == 0) return true;
      const char* name = nullptr;
      error_name(r, &name);
      s.problem = hybra::detail::concat("the CUDA driver's ", call, " failed: ", name ? name : "an unknown error",
                                        " (", r, ")");
      return false;
    };
    if (!check(init(0), "cuInit")) return s;
    lib.function<CUresult (*)(int*)>("cuDriverGetVersion")(&s.version);
    int count = 0;
    if (!check(lib.function<CUresult (*)(int*)>("cuDeviceGetCount")(&count), "cuDeviceGetCount")) return s;
    auto get = lib.function<CUresult (*)(int*, int)>("cuDeviceGet");
    auto name = lib.function<CUresult (*)(char*, int, int)>("cuDeviceGetName");
    auto attribute = lib.function<CUresult (*)(int*, int, int)>("cuDeviceGetAttribute");
    for (int i = 0; i < count; ++i) {
      int device = 0;
      char text[256] = {};
      Gpu g;
      if (!check(get(&device, i), "cuDeviceGet") || !check(name(text, sizeof text, device), "cuDeviceGetName") ||
          !check(attribute(&g.major, attribute_major, device), "cuDeviceGetAttribute") ||
          !check(attribute(&g.minor, attribute_minor, device), "cuDeviceGetAttribute"))
        return s;
      g.name = text;
      s.gpus.push_back(std::move(g));
    }
    if (s.gpus.empty()) s.problem = "the CUDA driver loaded but sees no GPU";
  } catch (const Error& e) {
    s.problem = e.what();
  }
  return s;
}
}  // namespace detail

// Probed once, on first use.
inline const DriverStatus& driver_status() {
  static const DriverStatus status = detail::probe_driver();
  return status;
}

}  // namespace hybra::backend::cuda
