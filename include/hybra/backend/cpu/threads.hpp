#pragma once
// How many cores hybra's CPU kernels (fused loops and BLAS) use, and the
// parallel loop they share. Inside an engine op the count is also capped by
// the op's share of the cores (engine/context.hpp), so that ops running at
// once on several CPU devices do not oversubscribe the machine.
//
// OpenMP is optional (CMake option HYBRA_OPENMP): without it parallel_for
// runs on the calling thread (the engine still runs independent ops at
// once), or, with HYBRA_THREAD_LOOPS, on a team of std::threads started for
// the loop. The ThreadSanitizer build uses the latter: libgomp is not
// instrumented and its barriers would look like races, while a race between
// a loop's pieces is still one to see.
#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "../../engine/context.hpp"
#include "../../engine/sync.hpp"
#include "gomp_spin.hpp"

namespace hybra {

namespace detail {
// OpenMP's default honours OMP_NUM_THREADS. Without OpenMP, every core: BLAS
// still uses this count.
inline int default_thread_count() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
#endif
}
inline std::atomic<int>& thread_count() {
  static std::atomic<int> n{default_thread_count()};
  return n;
}
}  // namespace detail

inline int num_threads() { return detail::thread_count().load(std::memory_order_relaxed); }

// Sets the threads used by fused loops and by BLAS products (n >= 1; both
// run on parallel_for's team, backend/cpu/blas.hpp).
inline void set_num_threads(int n) { detail::thread_count().store(std::max(1, n), std::memory_order_relaxed); }

namespace backend::cpu {

// The cores the calling code may keep busy: num_threads(), capped inside an
// engine op by its device's share.
inline int share_threads() { return std::min(num_threads(), engine::current_device_threads()); }

// The threads the calling code may use now for a team: its share, but one
// inside a brief op run where it was pushed (engine::may_start_team), which
// threads spinning in a wait help instead (gemv's halves).
inline int available_threads() { return engine::may_start_team() ? share_threads() : 1; }

// Below this many elements a loop runs on the calling thread: waking the
// OpenMP team costs more than it saves.
inline constexpr std::int64_t parallel_grain = 1 << 15;

namespace detail {

// parallel_for's body behind a plain function pointer: the team, its
// outlined OpenMP region and the engine context are compiled once per
// translation unit, not once per loop body (every fused expression has
// several).
using range_call = void (*)(void* body, std::int64_t begin, std::int64_t end);

inline void run_ranges(std::int64_t n, std::int64_t cost, range_call call, void* body) {
#if !defined(_OPENMP) && !defined(HYBRA_THREAD_LOOPS)
  (void)cost;
  call(body, 0, n);
#else
  int threads = static_cast<int>(std::min<std::int64_t>({available_threads(), n, n * cost / parallel_grain}));
  if (threads <= 1) {
    call(body, 0, n);
    return;
  }
  // The team's threads run as part of the caller's engine op (if any): code
  // they call must see that too (it runs sub-ops at once, never waits).
  const engine::detail::Context caller = engine::detail::context;
  auto piece = [&](std::int64_t t, std::int64_t nt) {
    engine::detail::ContextScope scope(caller.engine, caller.op, caller.threads);
    std::int64_t chunk = (n + nt - 1) / nt;
    std::int64_t begin = std::min(n, t * chunk), end = std::min(n, begin + chunk);
    call(body, begin, end);
  };
  const engine::detail::ParallelRegion region = begin_parallel_region(threads);
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
  piece(omp_get_thread_num(), omp_get_num_threads());
#else
  std::vector<std::thread> team;
  for (int t = 1; t < threads; ++t) team.emplace_back(piece, t, threads);
  piece(0, threads);
  for (auto& member : team) member.join();
#endif
#endif
}

}  // namespace detail

// Calls body(begin, end) over [0, n) split into one contiguous range per
// thread; `cost` is the number of elements each index stands for. Without
// OpenMP (and HYBRA_THREAD_LOOPS) it is one call over [0, n) on the calling
// thread.
template <class Body>
void parallel_for(std::int64_t n, std::int64_t cost, Body&& body) {
  using B = std::remove_reference_t<Body>;
  detail::run_ranges(
      n, cost, [](void* b, std::int64_t begin, std::int64_t end) { (*static_cast<B*>(b))(begin, end); },
      const_cast<std::remove_const_t<B>*>(&body));
}

}  // namespace backend::cpu
}  // namespace hybra
