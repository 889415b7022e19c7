#pragma once
// A GPU's caching allocator: cuMemAlloc and cuMemFree synchronise with the
// device and cost tens of microseconds, so a freed block is kept and handed
// to the next request it fits (core/block_cache.hpp), as
// PyTorch's and MXNet's GPU pools do. When the device runs out, the cache is
// returned to the driver and the request retried once; if it still fails,
// OutOfMemory says how much was asked for, how much hybra holds and what the
// device has left.
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

#include "../../core/block_cache.hpp"
#include "../../core/device.hpp"
#include "driver.hpp"

namespace hybra::backend::cuda {

struct MemoryStats {
  std::size_t in_use = 0;  // bytes handed out and not yet released
  std::size_t cached = 0;  // bytes released to the cache, still held from the driver
  std::int64_t driver_allocations = 0;  // cuMemAlloc calls that succeeded
};

class CachingAllocator {
 public:
  static constexpr std::size_t granule = 512;  // every block is a multiple of it

  CachingAllocator(const Driver& cu, CUcontext context, CUstream stream, Device device)
      : cu_(cu), context_(context), stream_(stream), device_(device) {}
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  static std::size_t block_size(std::size_t bytes) {
    return bytes == 0 ? granule : (bytes + granule - 1) / granule * granule;
  }

  CUdeviceptr allocate(std::size_t bytes) {
    if (bytes > SIZE_MAX - granule)
      fail<OutOfMemory>("allocate: ", bytes, " bytes overflow the address space on ", device_);
    const std::size_t size = block_size(bytes);
    std::lock_guard g(mutex_);
    if (auto b = cache_.take(size)) {
      stats_.cached -= b->bytes;
      stats_.in_use += b->bytes;
      sizes_[b->pointer] = b->bytes;
      return b->pointer;
    }
    cu_.check(cu_.cuCtxSetCurrent(context_), "cuCtxSetCurrent");
    CUdeviceptr p = 0;
    CUresult r = cu_.cuMemAlloc(&p, size);
    if (r == constant::out_of_memory && !cache_.empty()) {
      return_cache_locked();
      r = cu_.cuMemAlloc(&p, size);
    }
    if (r != constant::success) {
      // A request larger than the device's free memory is out of memory,
      // whichever error the driver gives it (out of memory, or an invalid
      // value for more than the device has at all).
      std::size_t free = 0, total = 0;
      const bool known = cu_.cuMemGetInfo(&free, &total) == constant::success;
      if (r == constant::out_of_memory || (known && size > free))
        fail<OutOfMemory>("allocate: out of memory on ", device_, ": ", bytes, " bytes requested, ", stats_.in_use,
                          " bytes held by hybra's tensors, ", free, " bytes free of ", total, " (",
                          cu_.describe(r), ")");
    }
    cu_.check(r, "cuMemAlloc");
    ++stats_.driver_allocations;
    stats_.in_use += size;
    sizes_[p] = size;
    return p;
  }

  // Keeps the block for a later request. Work queued on the GPU's stream may
  // still use it: whatever it is handed to next is queued on the same stream,
  // after that work. Work of other GPUs that used it must be waited for
  // first (Storage does).
  void release(CUdeviceptr p) noexcept {
    std::lock_guard g(mutex_);
    auto it = sizes_.find(p);
    if (it == sizes_.end()) return;
    stats_.in_use -= it->second;
    stats_.cached += it->second;
    cache_.keep(p, it->second);
    sizes_.erase(it);
  }

  // Gives every cached block back to the driver.
  void empty_cache() {
    std::lock_guard g(mutex_);
    return_cache_locked();
  }

  MemoryStats stats() const {
    std::lock_guard g(mutex_);
    return stats_;
  }

 private:
  void return_cache_locked() {
    cu_.check(cu_.cuCtxSetCurrent(context_), "cuCtxSetCurrent");
    cu_.cuStreamSynchronize(stream_);  // a cached block may be in use by work still queued (release)
    while (auto b = cache_.take_largest()) {
      cu_.cuMemFree(b->pointer);
      stats_.cached -= b->bytes;
    }
  }

  const Driver& cu_;
  CUcontext context_;
  CUstream stream_;
  Device device_;
  mutable std::mutex mutex_;
  BlockCache<CUdeviceptr> cache_;                   // free blocks
  std::map<CUdeviceptr, std::size_t> sizes_;        // blocks in use
  MemoryStats stats_;
};

}  // namespace hybra::backend::cuda
