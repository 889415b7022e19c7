#pragma once
// How many cores hybra's CPU kernels (fused loops and BLAS) use, and the
// parallel loop they share.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

extern "C" void openblas_set_num_threads(int);

namespace hybra {

namespace detail {
inline std::atomic<int>& thread_count() {
  static std::atomic<int> n{omp_get_max_threads()};
  return n;
}
}  // namespace detail

inline int num_threads() { return detail::thread_count().load(std::memory_order_relaxed); }

// Sets the threads used by fused loops and by OpenBLAS (n >= 1).
inline void set_num_threads(int n) {
  n = std::max(1, n);
  detail::thread_count().store(n, std::memory_order_relaxed);
  openblas_set_num_threads(n);
}

namespace backend::cpu {

// Below this many elements a loop runs on the calling thread: waking the
// OpenMP team costs more than it saves.
inline constexpr std::int64_t parallel_grain = 1 << 15;

// Calls body(begin, end) over [0, n) split into one contiguous range per
// thread; `cost` is the number of elements each index stands for.
template <class Body>
void parallel_for(std::int64_t n, std::int64_t cost, Body&& body) {
  int threads = static_cast<int>(std::min<std::int64_t>({num_threads(), n, n * cost / parallel_grain}));
  if (threads <= 1) {
    body(std::int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    std::int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    std::int64_t chunk = (n + nt - 1) / nt;
    std::int64_t begin = std::min(n, t * chunk), end = std::min(n, begin + chunk);
    body(begin, end);
  }
}

}  // namespace backend::cpu
}  // namespace hybra
