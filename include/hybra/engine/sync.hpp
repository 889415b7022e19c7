#pragma once
// The waiting primitives the engine is built from. An engine op usually
// finishes within a microsecond or two of being waited for, while putting a
// thread to sleep and waking it costs several microseconds, so every wait
// spins briefly before it sleeps.
#include <atomic>
#include <chrono>
#include <thread>

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
    if (waited > spin_pure) std::this_thread::yield();
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
