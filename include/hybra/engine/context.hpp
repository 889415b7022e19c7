#pragma once
// Which engine op the calling thread is running, if any. Kept apart from the
// engine so that the CPU kernels (backend/cpu) can ask how many threads their
// op may use without depending on the engine itself.
#include <algorithm>
#include <thread>

namespace hybra::engine {

class Engine;

namespace detail {

struct OpRecord;

// Cached: glibc's hardware_concurrency() reads /sys on every call, and every
// parallel loop and BLAS call asks.
inline int hardware_threads() noexcept {
  static const int n = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return n;
}

// What the calling thread is running, for current_device_threads() and to
// refuse waits from inside an op (the op would wait for itself).
struct Context {
  const Engine* engine = nullptr;
  const OpRecord* op = nullptr;
  int threads = 0;
  bool team = true;  // see may_start_team
};
inline thread_local Context context;

class ContextScope {
 public:
  ContextScope(const Engine* e, const OpRecord* op, int threads, bool team = true) noexcept : saved_(context) {
    context = {e, op, threads, team};
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;
  ~ContextScope() { context = saved_; }

 private:
  Context saved_;
};

}  // namespace detail

// The threads an op may use for its own parallel loops and BLAS calls: its
// device's share of the cores (all of them with one CPU device in use).
// Outside an op, every core.
inline int current_device_threads() noexcept {
  return detail::context.op ? detail::context.threads : detail::hardware_threads();
}

// Whether the code running may start a thread team (OpenMP's, oneDNN's) for
// its loops: not inside a brief op run on the thread that pushed it
// (engine.hpp, "Brief ops"). Waking a team costs more than such an op, and a
// second team beside the one the workers' ops start keeps more threads
// runnable than there are cores, so libgomp shortens its spins and the
// workers' own loops slow down (docs/benchmarks.md, "Small eager ops on the
// calling thread"). Threads already spinning in a wait still help it
// (helping.hpp), as they ask for no team.
inline bool may_start_team() noexcept { return detail::context.team; }

// True on a thread that is running an engine op (its work is already
// ordered by the engine, so it neither waits nor pushes).
inline bool inside_op() noexcept { return detail::context.op != nullptr; }

}  // namespace hybra::engine
