#pragma once
// Freed memory blocks kept by size for the next request they fit, the logic
// the host's and each GPU's caching allocators share
// (backend/cpu/host_memory.hpp, backend/cuda/memory.hpp). A request takes
// the smallest kept block at least its size, unless that wastes more than an
// eighth of the request. Not locked: its allocator is.
#include <cstddef>
#include <iterator>
#include <map>
#include <optional>
#include <utility>

namespace hybra {

template <class Pointer>
class BlockCache {
 public:
  struct Block {
    Pointer pointer;
    std::size_t bytes;
  };

  // The kept block a request of `bytes` takes, no longer kept, if any fits.
  std::optional<Block> take(std::size_t bytes) {
    auto it = blocks_.lower_bound(bytes);
    if (it == blocks_.end() || it->first - bytes > bytes / 8) return std::nullopt;
    Block b{it->second, it->first};
    bytes_ -= b.bytes;
    blocks_.erase(it);
    return b;
  }
  void keep(Pointer p, std::size_t bytes) {
    blocks_.emplace(bytes, p);
    bytes_ += bytes;
  }
  // The largest kept block, no longer kept (nullopt when none is).
  std::optional<Block> take_largest() {
    if (blocks_.empty()) return std::nullopt;
    auto it = std::prev(blocks_.end());
    Block b{it->second, it->first};
    bytes_ -= b.bytes;
    blocks_.erase(it);
    return b;
  }
  std::size_t bytes() const { return bytes_; }
  bool empty() const { return blocks_.empty(); }

 private:
  std::multimap<std::size_t, Pointer> blocks_;
  std::size_t bytes_ = 0;
};

}  // namespace hybra
