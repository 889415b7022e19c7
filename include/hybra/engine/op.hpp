#pragma once
// What the engine keeps per op: the record a push fills in and the pool that
// recycles records.
#include <atomic>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../core/device.hpp"
#include "context.hpp"
#include "sync.hpp"
#include "task.hpp"
#include "var.hpp"

namespace hybra::engine::detail {

class DeviceQueue;

// The fields a worker reads come first, and the Deps of an op with up to
// inline_deps vars live in the record itself: their addresses follow from
// the record's, so a worker fetches them all at once rather than one after
// another.
struct OpRecord {
  std::atomic<int> unmet{0};  // Deps not yet granted, plus one while push appends them
  int n_deps = 0;
  Engine* engine = nullptr;
  DeviceQueue* queue = nullptr;  // null: naive, run by whichever thread makes it ready
  Device device;
  OpRecord* next = nullptr;  // the device's ready queue
  OpRecord* pool_next = nullptr;
  std::int64_t seq = 0;  // place in push order
  bool large = false;  // the Deps are in large_deps
  static constexpr int inline_deps = 4;
  Dep small_deps[inline_deps];
  Task fn;
  std::vector<Dep> large_deps;
  std::string name;

  std::span<Dep> deps() noexcept { return {large ? large_deps.data() : small_deps, static_cast<std::size_t>(n_deps)}; }
  // Makes room for up to n Deps, dropping the current ones.
  void reserve_deps(std::size_t n) {
    n_deps = 0;
    large = false;
    if (n > inline_deps && large_deps.size() < n) large_deps.resize(n);
    large = n > inline_deps;
  }
  // Within the room reserve_deps made.
  Dep& add_dep(Dep d) noexcept {
    Dep& slot = (large ? large_deps.data() : small_deps)[n_deps++];
    slot = std::move(d);
    return slot;
  }
};

// Recycles op records so that steady pushing does not allocate. Records come
// back from the workers in batches onto a lock-free stack; a pushing thread
// takes the whole stack when its own list runs dry, so the two sides share a
// cache line once per batch instead of on every op.
class RecordPool {
 public:
  RecordPool() = default;
  RecordPool(const RecordPool&) = delete;
  RecordPool& operator=(const RecordPool&) = delete;
  ~RecordPool() {
    free_list(local_);
    free_list(returned_.exchange(nullptr));
  }

  OpRecord* acquire() {
    {
      std::lock_guard g(local_lock_);
      if (!local_) local_ = returned_.exchange(nullptr, std::memory_order_acquire);
      if (local_) return std::exchange(local_, local_->pool_next);
    }
    auto* r = new OpRecord;
    records_.fetch_add(1, std::memory_order_relaxed);
    return r;
  }

  // Keeps at most max_records alive: a burst of pending ops gives its extra
  // records back as they finish.
  static constexpr int max_records = 4096;
  void recycle(OpRecord* r) noexcept {
    if (records_.load(std::memory_order_relaxed) > max_records) {
      records_.fetch_sub(1, std::memory_order_relaxed);
      delete r;
      return;
    }
    give_back(r, r);
  }

  // Returns the records first .. last, chained through pool_next.
  void give_back(OpRecord* first, OpRecord* last) noexcept {
    last->pool_next = returned_.load(std::memory_order_relaxed);
    while (!returned_.compare_exchange_weak(last->pool_next, first, std::memory_order_release,
                                            std::memory_order_relaxed)) {
    }
  }

  // A worker's records on their way back, given back batch at a time.
  class Batch {
   public:
    static constexpr int size = 32;
    explicit Batch(RecordPool& pool) : pool_(pool) {}
    Batch(const Batch&) = delete;
    Batch& operator=(const Batch&) = delete;
    ~Batch() { flush(); }

    RecordPool& pool() const { return pool_; }
    void add(OpRecord* r) noexcept {
      if (pool_.records_.load(std::memory_order_relaxed) > max_records) return pool_.recycle(r);
      r->pool_next = first_;
      first_ = r;
      if (!last_) last_ = r;
      if (++n_ == size) flush();
    }
    void flush() noexcept {
      if (first_) pool_.give_back(first_, last_);
      first_ = last_ = nullptr;
      n_ = 0;
    }

   private:
    RecordPool& pool_;
    OpRecord* first_ = nullptr;
    OpRecord* last_ = nullptr;
    int n_ = 0;
  };

 private:
  static void free_list(OpRecord* r) {
    while (r) delete std::exchange(r, r->pool_next);
  }

  SpinLock local_lock_;
  OpRecord* local_ = nullptr;
  std::atomic<OpRecord*> returned_{nullptr};
  std::atomic<int> records_{0};
};

}  // namespace hybra::engine::detail
