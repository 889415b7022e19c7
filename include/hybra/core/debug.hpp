#pragma once
// Graded diagnostics on stderr, as tinygrad's DEBUG: HYBRA_DEBUG=1 prints
// each compiled plan's summary when it is built (its steps by kind, its
// memory, whether it is brief and replays a CUDA graph) and each change of
// libgomp's spins under contention (backend/cpu/gomp_spin.hpp); 2 also each
// plan call's time per step; 3 also the code generated for it (the optimised
// graph of each plan, each NVRTC program's source). The level is read from
// the environment at the first use; set_level changes it for the process.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "error.hpp"

namespace hybra::debug {

enum Level : int { off = 0, plans = 1, timings = 2, code = 3 };

namespace detail {
inline std::atomic<int>& current() {
  static std::atomic<int> level = [] {
    const char* v = std::getenv("HYBRA_DEBUG");
    return v && *v ? std::atoi(v) : 0;
  }();
  return level;
}
}  // namespace detail

inline int level() { return detail::current().load(std::memory_order_relaxed); }
inline void set_level(int level) { detail::current().store(level, std::memory_order_relaxed); }
inline bool at(Level wanted) { return level() >= wanted; }

// One line (or block) on stderr, written whole.
template <class... Parts>
void print(const Parts&... parts) {
  const std::string text = hybra::detail::concat("hybra: ", parts..., '\n');
  std::fwrite(text.data(), 1, text.size(), stderr);
}

}  // namespace hybra::debug
