#pragma once
// The host's caching allocator for CPU tensors of at least `cached_from`
// bytes. glibc serves such blocks with fresh mmap'd pages (from the worker
// threads' arenas, and beyond 32 MiB always), so an op that writes a new
// large tensor first faults its pages in and has the kernel zero them: ~37 MB
// a step in a hybridized ResNet-18 training step, its plans' outputs
// (docs/benchmarks.md, "Large host blocks kept"). A freed block is kept
// (core/block_cache.hpp: up to `cap` bytes, the largest given back first) and
// handed to the next request it fits. Smaller blocks go to malloc as before.
// Under AddressSanitizer nothing is kept, so that a use after free stays
// visible.
#include <cstdlib>
#include <mutex>

#include "../../core/block_cache.hpp"

namespace hybra::backend::cpu {

class HostMemory {
 public:
  static constexpr std::size_t alignment = 64, cached_from = std::size_t{1} << 20;
  static constexpr std::size_t cap = std::size_t{2} << 30;

  // The process's: never destroyed, as tensors freed by work still running at exit release into it.
  static HostMemory& instance() {
    static HostMemory* const memory = new HostMemory;
    return *memory;
  }

  using Block = BlockCache<void*>::Block;

  // At least `bytes` (a multiple of alignment), aligned to 64 bytes: a kept
  // block may be larger. A null pointer when the host is out of memory.
  Block allocate(std::size_t bytes) {
    if (keeps(bytes)) {
      std::lock_guard g(mutex_);
      if (auto b = cache_.take(bytes)) return *b;
    }
    void* p = std::aligned_alloc(alignment, bytes);
    if (!p && keeps(bytes)) {
      empty();
      p = std::aligned_alloc(alignment, bytes);
    }
    return {p, bytes};
  }
  // A block allocate returned, with its size.
  void release(void* p, std::size_t bytes) noexcept {
    if (!keeps(bytes)) return std::free(p);
    std::lock_guard g(mutex_);
    cache_.keep(p, bytes);
    while (cache_.bytes() > cap)
      if (auto b = cache_.take_largest()) std::free(b->pointer);
  }
  // Gives every kept block back to the system.
  void empty() {
    std::lock_guard g(mutex_);
    while (auto b = cache_.take_largest()) std::free(b->pointer);
  }
  std::size_t kept_bytes() const {
    std::lock_guard g(mutex_);
    return cache_.bytes();
  }

 private:
  static bool keeps(std::size_t bytes) {
#if defined(__SANITIZE_ADDRESS__)
    return false;
#else
    return bytes >= cached_from;
#endif
  }
  HostMemory() = default;
  mutable std::mutex mutex_;
  BlockCache<void*> cache_;
};

}  // namespace hybra::backend::cpu
