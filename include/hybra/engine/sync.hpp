#pragma once
// The waiting primitives the engine is built from. An engine op usually
// finishes within a microsecond or two of being waited for, while putting a
// thread to sleep and waking it costs several microseconds, so every wait
// spins briefly before it sleeps.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <thread>

#include "context.hpp"

namespace hybra::engine::detail {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// How long a waiting thread spins before it sleeps. The first part is pure
// spinning; after it the thread yields between checks, so that on a machine
// with more busy threads than cores the thread being waited for gets the core.
// The pure part covers a batch-1 forward: a thread inside sched_yield is
// late to take the chunk the op posts for it (helping.hpp), which cost the
// hybridized MLP of bench_hybridize per call (docs/benchmarks.md, "Figures
// behind constants of the code").
inline constexpr std::chrono::microseconds spin_pure{10};
inline constexpr std::chrono::microseconds spin_limit{50};

// Marks a parallel region for its lifetime: a team of `threads`, its master
// among them, that a CPU kernel starts (backend/cpu/threads.hpp's loops,
// oneDNN's calls). A team of every core holds them while it runs, and its
// idle members may go on spinning after it ends, ready for the next region,
// for `idle_after`: what the threading runtime's settings make that spin
// (backend/cpu/gomp_spin.hpp). A thread that spins in a wait beside them (the
// caller in wait_to_read, an idle worker) then holds a core that the thread
// it waits for needs, which runs only when the scheduler preempts a spinner
// (docs/benchmarks.md, "Waits that yield to a team"). So while such a region
// runs, and until the idle spin of the last one to end is over, spin_until
// yields from its first check.
class ParallelRegion {
 public:
  ParallelRegion(int threads, std::chrono::nanoseconds idle_after) noexcept
      : every_core_(threads >= hardware_threads()), idle_after_(idle_after.count()) {
    if (every_core_) running().fetch_add(1, std::memory_order_relaxed);
  }
  ~ParallelRegion() {
    if (!every_core_) return;
    // The last region to end speaks for the team: its members are the ones spinning now.
    idle_until().store(saturating_add(now(), idle_after_), std::memory_order_relaxed);
    running().fetch_sub(1, std::memory_order_relaxed);
  }
  ParallelRegion(const ParallelRegion&) = delete;
  ParallelRegion& operator=(const ParallelRegion&) = delete;

  // Whether teams of every core run, or spin idle after one, now.
  static bool cores_taken() noexcept {
    return running().load(std::memory_order_relaxed) > 0 || now() < idle_until().load(std::memory_order_relaxed);
  }

 private:
  static std::int64_t now() noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  static std::int64_t saturating_add(std::int64_t at, std::int64_t after) noexcept {
    return after > std::numeric_limits<std::int64_t>::max() - at ? std::numeric_limits<std::int64_t>::max()
                                                                 : at + after;
  }
  static std::atomic<int>& running() noexcept {
    static std::atomic<int> regions{0};
    return regions;
  }
  static std::atomic<std::int64_t>& idle_until() noexcept {
    static std::atomic<std::int64_t> at{0};
    return at;
  }
  bool every_core_;
  std::int64_t idle_after_;
};

// Spins until ready() holds (true) or spin_limit passes (false).
template <class Ready>
bool spin_until(Ready&& ready) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  for (unsigned i = 1;; ++i) {
    if (ready()) return true;
    if (i % 32 != 0) {
      cpu_relax();
      continue;
    }
    auto waited = clock::now() - start;
    if (waited > spin_limit) return false;
    if (waited > spin_pure || ParallelRegion::cores_taken()) std::this_thread::yield();
  }
}

// Guards a var's dependency queue and the op record pool: critical sections
// are a few loads and stores, far shorter than a futex round trip.
class SpinLock {
 public:
  void lock() noexcept {
    while (locked_.exchange(true, std::memory_order_acquire)) {
      for (unsigned i = 1; locked_.load(std::memory_order_relaxed); ++i) {
        // The holder may have been preempted; give it the core back.
        if (i % 64 == 0)
          std::this_thread::yield();
        else
          cpu_relax();
      }
    }
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

}  // namespace hybra::engine::detail
