#pragma once
// The CUDA driver API, loaded at run time (never linked: see library.hpp):
// the functions hybra calls, looked up once, and what a process learns from
// them once: whether the driver loads and initialises, and the GPUs it sees;
// with no driver or no GPU, why not.
//
// The library is libcuda.so.1, or the file $HYBRA_CUDA_DRIVER names (the
// tests point it at a stand-in driver, tests/fake_cuda).
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "library.hpp"

namespace hybra::backend::cuda {

// The driver's handle types, spelled as cuda.h does but declared here, so
// that hybra needs no CUDA header to build.
namespace handle {
struct CUctx_st;
struct CUstream_st;
struct CUevent_st;
struct CUmod_st;
struct CUfunc_st;
struct CUgraph_st;
struct CUgraphExec_st;
}  // namespace handle
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = handle::CUctx_st*;
using CUstream = handle::CUstream_st*;
using CUevent = handle::CUevent_st*;
using CUmodule = handle::CUmod_st*;
using CUfunction = handle::CUfunc_st*;
using CUgraph = handle::CUgraph_st*;
using CUgraphExec = handle::CUgraphExec_st*;

// The values of cuda.h's enums that hybra uses.
namespace constant {
inline constexpr CUresult success = 0, out_of_memory = 2;
inline constexpr int attribute_multiprocessors = 16, attribute_major = 75, attribute_minor = 76;
inline constexpr unsigned stream_non_blocking = 1, event_disable_timing = 2;
// Pinned host memory every context may use, that kernels read and write in place.
inline constexpr unsigned host_alloc_mapped = 0x01 | 0x02;
inline constexpr int capture_mode_thread_local = 1;
}  // namespace constant

class Driver {
 public:
  // Opens `file` and looks up every function below; throws DeviceError
  // naming the file, or the function an older driver lacks.
  explicit Driver(const char* file) : library_({file}) {
    if (!library_.loaded()) fail<DeviceError>("the CUDA driver (", file, ") could not be loaded: ", library_.error());
    load(cuInit, "cuInit");
    load(cuDriverGetVersion, "cuDriverGetVersion");
    load(cuGetErrorName, "cuGetErrorName");
    load(cuGetErrorString, "cuGetErrorString");
    load(cuDeviceGetCount, "cuDeviceGetCount");
    load(cuDeviceGet, "cuDeviceGet");
    load(cuDeviceGetName, "cuDeviceGetName");
    load(cuDeviceGetAttribute, "cuDeviceGetAttribute");
    load(cuDeviceTotalMem, "cuDeviceTotalMem_v2");
    load(cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer");
    load(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    load(cuCtxSetCurrent, "cuCtxSetCurrent");
    load(cuCtxEnablePeerAccess, "cuCtxEnablePeerAccess");
    load(cuMemAlloc, "cuMemAlloc_v2");
    load(cuMemFree, "cuMemFree_v2");
    load(cuMemGetInfo, "cuMemGetInfo_v2");
    load(cuMemHostAlloc, "cuMemHostAlloc");
    load(cuMemFreeHost, "cuMemFreeHost");
    load(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
    load(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
    load(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2");
    load(cuMemcpyPeerAsync, "cuMemcpyPeerAsync");
    load(cuMemsetD8Async, "cuMemsetD8Async");
    load(cuMemsetD16Async, "cuMemsetD16Async");
    load(cuMemsetD32Async, "cuMemsetD32Async");
    load(cuStreamCreate, "cuStreamCreate");
    load(cuStreamSynchronize, "cuStreamSynchronize");
    load(cuEventCreate, "cuEventCreate");
    load(cuEventRecord, "cuEventRecord");
    load(cuEventSynchronize, "cuEventSynchronize");
    load(cuStreamWaitEvent, "cuStreamWaitEvent");
    load(cuModuleLoadData, "cuModuleLoadData");
    load(cuModuleGetFunction, "cuModuleGetFunction");
    load(cuLaunchKernel, "cuLaunchKernel");
    load(cuStreamBeginCapture, "cuStreamBeginCapture_v2");
    load(cuStreamEndCapture, "cuStreamEndCapture");
    load(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags");
    load(cuGraphLaunch, "cuGraphLaunch");
    load(cuGraphExecDestroy, "cuGraphExecDestroy");
    load(cuGraphDestroy, "cuGraphDestroy");
  }

  const std::string& file() const { return library_.name(); }

  // "CUDA_ERROR_OUT_OF_MEMORY (2): out of memory", from the driver itself.
  std::string describe(CUresult r) const {
    const char *name = nullptr, *text = nullptr;
    cuGetErrorName(r, &name);
    cuGetErrorString(r, &text);
    return hybra::detail::concat(name ? name : "an unknown CUDA error", " (", r, ")", text ? ": " : "",
                                 text ? text : "");
  }

  // Throws unless r is success: OutOfMemory for the driver's out-of-memory,
  // DeviceError otherwise, naming the call and the error.
  void check(CUresult r, std::string_view call) const {
    if (r == constant::success) return;
    if (r == constant::out_of_memory) fail<OutOfMemory>("CUDA: ", call, " failed: ", describe(r));
    fail<DeviceError>("CUDA: ", call, " failed: ", describe(r));
  }

  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuDriverGetVersion)(int*) = nullptr;
  CUresult (*cuGetErrorName)(CUresult, const char**) = nullptr;
  CUresult (*cuGetErrorString)(CUresult, const char**) = nullptr;
  CUresult (*cuDeviceGetCount)(int*) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuDeviceGetName)(char*, int, CUdevice) = nullptr;
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice) = nullptr;
  CUresult (*cuDeviceTotalMem)(std::size_t*, CUdevice) = nullptr;
  CUresult (*cuDeviceCanAccessPeer)(int*, CUdevice, CUdevice) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*cuCtxEnablePeerAccess)(CUcontext, unsigned) = nullptr;
  CUresult (*cuMemAlloc)(CUdeviceptr*, std::size_t) = nullptr;
  CUresult (*cuMemFree)(CUdeviceptr) = nullptr;
  CUresult (*cuMemGetInfo)(std::size_t*, std::size_t*) = nullptr;
  CUresult (*cuMemHostAlloc)(void**, std::size_t, unsigned) = nullptr;
  CUresult (*cuMemFreeHost)(void*) = nullptr;
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, std::size_t, CUstream) = nullptr;
  CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, std::size_t, CUstream) = nullptr;
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, std::size_t, CUstream) = nullptr;
  CUresult (*cuMemcpyPeerAsync)(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, std::size_t, CUstream) = nullptr;
  CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, std::size_t, CUstream) = nullptr;
  CUresult (*cuMemsetD16Async)(CUdeviceptr, unsigned short, std::size_t, CUstream) = nullptr;
  CUresult (*cuMemsetD32Async)(CUdeviceptr, unsigned, std::size_t, CUstream) = nullptr;
  CUresult (*cuStreamCreate)(CUstream*, unsigned) = nullptr;
  CUresult (*cuStreamSynchronize)(CUstream) = nullptr;
  CUresult (*cuEventCreate)(CUevent*, unsigned) = nullptr;
  CUresult (*cuEventRecord)(CUevent, CUstream) = nullptr;
  CUresult (*cuEventSynchronize)(CUevent) = nullptr;
  CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned) = nullptr;
  CUresult (*cuModuleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void**, void**) = nullptr;
  CUresult (*cuStreamBeginCapture)(CUstream, int) = nullptr;
  CUresult (*cuStreamEndCapture)(CUstream, CUgraph*) = nullptr;
  CUresult (*cuGraphInstantiateWithFlags)(CUgraphExec*, CUgraph, unsigned long long) = nullptr;
  CUresult (*cuGraphLaunch)(CUgraphExec, CUstream) = nullptr;
  CUresult (*cuGraphExecDestroy)(CUgraphExec) = nullptr;
  CUresult (*cuGraphDestroy)(CUgraph) = nullptr;

 private:
  template <class F>
  void load(F& f, const char* symbol) {
    f = library_.function<F>(symbol);
  }

  SharedLibrary library_;
};

// What the driver says of one GPU.
struct GpuInfo {
  std::string name;
  int major = 0, minor = 0;  // compute capability
  int multiprocessors = 0;
  std::size_t memory = 0;  // bytes
};

struct DriverStatus {
  std::string library;  // the file that loaded, if one did
  std::string problem;  // why no GPU is usable; empty when some is
  int version = 0;      // the driver's CUDA version, as 13000 for 13.0
  std::vector<GpuInfo> gpus;
};

namespace detail {

inline const char* driver_file() {
  const char* file = std::getenv("HYBRA_CUDA_DRIVER");
  return file && *file ? file : "libcuda.so.1";
}

struct LoadedDriver {
  std::unique_ptr<Driver> driver;  // null when the library or a function is missing
  DriverStatus status;
};

inline LoadedDriver load_driver() {
  LoadedDriver d;
  DriverStatus& s = d.status;
  try {
    d.driver = std::make_unique<Driver>(driver_file());
    const Driver& cu = *d.driver;
    s.library = cu.file();
    cu.check(cu.cuInit(0), "cuInit");
    cu.check(cu.cuDriverGetVersion(&s.version), "cuDriverGetVersion");
    int count = 0;
    cu.check(cu.cuDeviceGetCount(&count), "cuDeviceGetCount");
    for (int i = 0; i < count; ++i) {
      CUdevice device = 0;
      char text[256] = {};
      GpuInfo g;
      cu.check(cu.cuDeviceGet(&device, i), "cuDeviceGet");
      cu.check(cu.cuDeviceGetName(text, sizeof text, device), "cuDeviceGetName");
      cu.check(cu.cuDeviceGetAttribute(&g.major, constant::attribute_major, device), "cuDeviceGetAttribute");
      cu.check(cu.cuDeviceGetAttribute(&g.minor, constant::attribute_minor, device), "cuDeviceGetAttribute");
      cu.check(cu.cuDeviceGetAttribute(&g.multiprocessors, constant::attribute_multiprocessors, device),
               "cuDeviceGetAttribute");
      cu.check(cu.cuDeviceTotalMem(&g.memory, device), "cuDeviceTotalMem");
      g.name = text;
      s.gpus.push_back(std::move(g));
    }
    if (s.gpus.empty()) s.problem = "the CUDA driver loaded but sees no GPU";
  } catch (const Error& e) {
    s.problem = e.what();
    s.gpus.clear();
  }
  return d;
}

// Never destroyed: GPU ops still queued when the program ends run after
// function-local statics are gone.
inline const LoadedDriver& loaded_driver() {
  static const LoadedDriver& d = *new LoadedDriver(load_driver());
  return d;
}

}  // namespace detail

// Probed once, on first use.
inline const DriverStatus& driver_status() { return detail::loaded_driver().status; }

// The driver, for a process that has a usable GPU; otherwise throws
// DeviceError saying why there is none.
inline const Driver& driver() {
  const auto& d = detail::loaded_driver();
  if (!d.status.problem.empty()) fail<DeviceError>("CUDA is not available: ", d.status.problem);
  return *d.driver;
}

}  // namespace hybra::backend::cuda
