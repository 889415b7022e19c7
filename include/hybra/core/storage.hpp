#pragma once
// A reference-counted buffer on one device, with the engine var that orders
// the ops reading and writing it (engine/var.hpp, which needs nothing from
// core but its errors): 64-byte aligned host memory for cpu(i) (large
// blocks kept for reuse: backend/cpu/host_memory.hpp), a block of
// the GPU's caching allocator for cuda(i) (backend/cuda/memory.hpp), or
// host memory someone else allocated (a user's buffer wrapped without a
// copy, from_blob), handed back to its release function. A meta storage
// allocates nothing. It keeps what kernels derive from its bytes while they
// stay unchanged (derived_forms.hpp).
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <new>

#include "../backend/cpu/host_memory.hpp"
#include "../backend/cuda/gpu.hpp"
#include "../engine/var.hpp"
#include "derived_forms.hpp"
#include "device.hpp"
#include "error.hpp"

namespace hybra {

class Storage {
 public:
  static constexpr std::size_t alignment = backend::cpu::HostMemory::alignment;

  Storage(std::size_t bytes, Device device) : bytes_(bytes), device_(device) {
    if (device == meta()) return;
    if (device.kind == DeviceKind::cuda) {
      auto& memory = backend::cuda::gpu(device.id).memory();
      data_ = reinterpret_cast<void*>(memory.allocate(bytes));
      gpu_memory_ = &memory;
      return;
    }
    if (device.id < 0 || device.id >= max_cpu_devices)
      fail<DeviceError>("allocate: there is no device ", device, "; CPU devices are cpu(0) to cpu(", max_cpu_devices - 1, ")");
    std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
    if (rounded < bytes) fail<OutOfMemory>("allocate: ", bytes, " bytes overflow the address space on ", device);
    const auto block = backend::cpu::HostMemory::instance().allocate(rounded ? rounded : alignment);
    data_ = block.pointer;
    host_bytes_ = block.bytes;
    if (!data_) fail<OutOfMemory>("allocate: out of memory allocating ", bytes, " bytes on ", device);
  }
  // `bytes` at `data`, host memory of a CPU device that hybra did not
  // allocate: release(data), if given, runs when the last tensor over it is
  // gone, which is after every op that used it (ops hold their tensors).
  Storage(void* data, std::size_t bytes, Device device, std::function<void(void*)> release)
      : data_(data), bytes_(bytes), device_(device), release_(std::move(release)), external_(true) {
    if (device.kind != DeviceKind::cpu || device.id < 0 || device.id >= max_cpu_devices)
      fail<DeviceError>("from_blob: ", device, " is not a CPU device; it wraps host memory (copy to a GPU with .to())");
  }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage() {
    if (external_) {
      if (release_) release_(data_);
      return;
    }
    if (gpu_memory_) {
      // Work of this GPU that may still use the block runs before whatever
      // the block is handed to next (CachingAllocator::release); another
      // GPU's (a copy from the block, queued on that GPU's stream) must be done first.
      for (const auto& f : var_.gpu_fences()) {
        if (f.gpu == device_.id) continue;
        try {
          f.fence->wait();
        } catch (const Error&) {
          return;  // the block is kept from reuse: that work's end is unknown (its waits report the error)
        }
      }
      gpu_memory_->release(reinterpret_cast<backend::cuda::CUdeviceptr>(data_));
    } else if (data_) {
      backend::cpu::HostMemory::instance().release(data_, host_bytes_);
    }
  }

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  const engine::Var& var() const { return var_; }

  // The form derived from the bytes that matches(form) picks, made at the
  // var's current write count, or made now by make() (derived_forms.hpp).
  template <class Form, class Matches, class Make>
  std::shared_ptr<const Form> derived(Matches&& matches, Make&& make) {
    if (external_ || untracked_.load(std::memory_order_relaxed)) return std::shared_ptr<const Form>(make());
    return derived_.get<Form>(var_.writes(), matches, make);
  }
  // From now on the bytes may be written where hybra cannot count the writes
  // (a pointer handed to the user): they keep no derived form.
  void untrack() { untracked_.store(true, std::memory_order_relaxed); }

 private:
  void* data_ = nullptr;
  backend::cuda::CachingAllocator* gpu_memory_ = nullptr;  // set for cuda(i)
  std::size_t bytes_, host_bytes_ = 0;
  Device device_;
  std::function<void(void*)> release_;  // of external memory
  bool external_ = false;
  std::atomic<bool> untracked_{false};
  engine::Var var_;
  DerivedForms derived_;
};

}  // namespace hybra
