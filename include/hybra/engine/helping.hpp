#pragma once
// Threads that spin in a wait lend a hand. A batch-1 forward on two cores has
// one thread running the op and one spinning until it is done (the caller in
// wait_to_read, or an idle worker); a loop the op posts here is split with
// that thread, where an OpenMP team would cost more to wake than it saves
// (backend/cpu/gemv.hpp). Nothing waits for a helper: the poster runs every
// chunk no thread has taken, so a post never costs more than the loop run
// alone plus a few atomic operations.
#include <atomic>
#include <cstdint>
#include <thread>

#include "context.hpp"
#include "sync.hpp"

namespace hybra::engine::detail {

class HelpBoard {
 public:
  // Runs body(c) for every chunk c in [0, chunks) and returns when all have
  // run. The calling thread runs chunk 0, then the rest are claimed in order
  // by it and by threads in help(). While another post is in progress (or with
  // more than max_chunks), runs them all on the calling thread. body must not
  // throw.
  static constexpr int max_chunks = 0xffff;
  template <class Body>
  void run(int chunks, Body& body) noexcept {
    if (chunks <= 1 || chunks > max_chunks || busy_.exchange(true, std::memory_order_acquire)) {
      for (int c = 0; c < chunks; ++c) body(c);
      return;
    }
    job_ = {[](void* b, int c) { (*static_cast<Body*>(b))(c); }, &body, context};
    finished_.store(0, std::memory_order_relaxed);
    generation_ = (generation_ + 1) & 0xffffffffu;
    // Posted with the first chunk already claimed by the poster: a helper
    // that arrives at once then finds the line as the post left it, rather
    // than losing a compare-exchange to the poster's.
    claim_.store(pack(generation_, chunks, 1), std::memory_order_release);
    body(0);
    finished_.fetch_add(1, std::memory_order_relaxed);
    while (take(true)) {
    }
    // Only chunks a helper is running are left: no wait here outlasts one,
    // though a helper the OS has descheduled may take a while.
    while (!spin_until([&] { return finished_.load(std::memory_order_acquire) == chunks; })) std::this_thread::yield();
    busy_.store(false, std::memory_order_release);
  }

  // Runs one chunk of the posted loop, if one is left; returns whether it did.
  bool help() noexcept { return take(false); }

 private:
  struct Job {
    void (*run)(void* body, int chunk) = nullptr;
    void* body = nullptr;
    Context context;  // the poster's: the chunk runs as part of its op
  };
  static_assert(sizeof(std::atomic<std::uint64_t>) + sizeof(Job) <= 64, "the claim word and the job share a cache line");

  // The claim word: generation (32 bits) | chunks (16) | next chunk (16). The
  // generation makes a helper's compare-exchange on a word it read during an
  // earlier post fail.
  static std::uint64_t pack(std::uint64_t generation, std::uint64_t chunks, std::uint64_t next) noexcept {
    return generation << 32 | chunks << 16 | next;
  }

  bool take(bool poster) noexcept {
    std::uint64_t word = claim_.load(std::memory_order_acquire);
    for (;;) {
      const int chunks = static_cast<int>(word >> 16 & 0xffff), next = static_cast<int>(word & 0xffff);
      if (next >= chunks) return false;
      if (claim_.compare_exchange_weak(word, word + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
        // The post cannot end before this chunk is counted finished, so its
        // job is still the one the claimed word belongs to.
        if (poster) {
          job_.run(job_.body, next);
        } else {
          ContextScope scope(job_.context.engine, job_.context.op, job_.context.threads);
          job_.run(job_.body, next);
        }
        finished_.fetch_add(1, std::memory_order_release);
        return true;
      }
    }
  }

  // The claim word and the job share a line: a helper's first look at a
  // post brings both to its core at once.
  alignas(64) std::atomic<std::uint64_t> claim_{0};
  Job job_;
  alignas(64) std::atomic<int> finished_{0};
  // The poster's own: written only between busy_'s acquire and release.
  alignas(64) std::atomic<bool> busy_{false};
  std::uint64_t generation_ = 0;
};

// The process's board: any engine's waiting threads may help any op.
inline HelpBoard& help_board() noexcept {
  static HelpBoard board;
  return board;
}

// spin_until(ready), running posted chunks while it spins. Each chunk run
// starts the spin over: a thread that has just helped is likely to be asked
// again soon (the next call of a batch-1 forward), and waking it from sleep
// would take longer than the chunk.
template <class Ready>
bool spin_helping_until(Ready&& ready) {
  for (;;) {
    bool helped = false;
    if (!spin_until([&] { return ready() || (helped = help_board().help()); })) return false;
    if (!helped) return true;
  }
}

}  // namespace hybra::engine::detail
