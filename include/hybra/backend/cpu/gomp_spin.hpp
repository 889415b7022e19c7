#pragma once
// libgomp's idle threads spin before they sleep, after every parallel region
// and at every barrier: 300,000 pauses unless OMP_WAIT_POLICY or
// GOMP_SPINCOUNT says otherwise, milliseconds on the machines measured. On a
// quiet machine that spin is why the next region starts at once; beside other
// work it holds a core that the thread being waited for needs, and a call
// takes several times its share (docs/benchmarks.md, "Under a competing
// load"). libgomp reads its settings once, before any of the program's code
// runs, and has no call to change them; but while it manages more threads
// than the process has cores it shortens every spin to 100 pauses, its
// documented rule for oversubscription (GOMP_SPINCOUNT in its manual). So
// while the threads that start hybra's parallel regions wait for cores that
// other work holds (contention.hpp), a parked thread owns an idle team of one
// thread more than there are cores, which makes every team of the process
// spin briefly, oneDNN's included; when the contention ends, the team is
// released. A quiet machine never sees it: there hybra's own threads, which
// at moments outnumber the cores, want libgomp's long spins.
//
// HYBRA_SPIN_THROTTLE, read once: `auto` (or unset) as above; 0 never; 1
// always, from the first parallel region on. `auto` leaves libgomp alone
// where OMP_WAIT_POLICY or GOMP_SPINCOUNT is set: whoever set it chose its
// waits.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "../../core/debug.hpp"
#include "../../core/setting.hpp"
#include "contention.hpp"

namespace hybra::backend::cpu {

enum class SpinThrottle { automatic, never, always };

inline SpinThrottle parse_spin_throttle(std::string_view value) {
  return parse_setting<SpinThrottle>(
      "threads", "HYBRA_SPIN_THROTTLE", value,
      {{"auto", SpinThrottle::automatic}, {"0", SpinThrottle::never}, {"1", SpinThrottle::always}});
}

inline SpinThrottle spin_throttle_setting() {
  static const SpinThrottle setting = [] {
    const char* value = std::getenv("HYBRA_SPIN_THROTTLE");
    const SpinThrottle chosen = parse_spin_throttle(value ? value : "");
    const bool user_set_waits = std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT");
    return chosen == SpinThrottle::automatic && user_set_waits ? SpinThrottle::never : chosen;
  }();
  return setting;
}

#ifdef _OPENMP

// The parked thread and its idle team. libgomp keeps a thread's team until
// the thread ends (its pthread key's destructor frees it), so releasing the
// team is ending the thread. Both ways the change is made when hold returns:
// it waits for the team to form, or for the thread to end.
class IdleTeam {
 public:
  void hold(bool on) {
    std::lock_guard control(control_);
    {
      std::lock_guard lock(mutex_);
      if (on == held_) return;
      held_ = on;
    }
    if (on) {
      parked_ = std::thread([this] { park(); });
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return formed_; });
    } else {
      changed_.notify_all();
      parked_.join();
      formed_ = false;
    }
  }

  bool held() {
    std::lock_guard lock(mutex_);
    return held_;
  }

  // Threads that joined the last team formed: cores + 1, unless libgomp's
  // thread limit cut it.
  int last_team_size() const { return joined_.load(std::memory_order_relaxed); }

 private:
  void park() {
    const int size = omp_get_num_procs() + 1;
    std::atomic<int> joined{0};
#pragma omp parallel num_threads(size)
    joined.fetch_add(1, std::memory_order_relaxed);
    joined_.store(joined.load(), std::memory_order_relaxed);
    std::unique_lock lock(mutex_);
    formed_ = true;
    changed_.notify_all();
    changed_.wait(lock, [&] { return !held_; });
  }

  std::mutex control_;  // one hold at a time, for as long as it waits
  std::mutex mutex_;
  std::condition_variable changed_;
  bool held_ = false;
  bool formed_ = false;
  std::thread parked_;
  std::atomic<int> joined_{0};
};

// Never destroyed: the parked thread may outlive the program's statics.
inline IdleTeam& idle_team() {
  static IdleTeam* team = new IdleTeam;
  return *team;
}

namespace detail {

// Samples the calling thread's scheduler counters at most every few
// milliseconds (reading /proc costs microseconds: docs/benchmarks.md, "Under
// a competing load") into one meter for the process, reads /proc/stat once
// a window, and holds the idle team while the meter says contended.
class ContentionWatch {
 public:
  static constexpr std::chrono::milliseconds sample_every{5};
  // /proc/stat counts clock ticks (10 ms here): its readings are compared
  // only this far apart.
  static constexpr double machine_every_s = 0.1;

  void sample(int threads) {
    thread_local std::chrono::steady_clock::time_point next{};
    thread_local std::optional<SchedTimes> last;
    const auto now = std::chrono::steady_clock::now();
    if (now < next) return;
    next = now + sample_every;
    const std::optional<SchedTimes> times = own_sched_times();
    if (!times) return;
    if (last) {
      std::lock_guard lock(mutex_);
      if (meter_.add(times->ran - last->ran, times->waited - last->waited)) {
        const bool held_elsewhere = cores_held_elsewhere(threads);
        if (meter_.close_window(held_elsewhere) && debug::at(debug::plans))
          debug::print("threads: ", meter_.contended() ? "waiting for cores" : "cores free again", " (",
                       static_cast<int>(meter_.last_share() * 100 + 0.5), "% of a window waited, ",
                       static_cast<int>(elsewhere_ * 100 + 0.5) / 100.0,
                       " cores busy elsewhere): libgomp's spins ", meter_.contended() ? "shortened" : "as configured");
      }
      // At every sample, not only at a change: a hold or release made
      // elsewhere (a test's) lasts until the next sample.
      idle_team().hold(meter_.contended());
    }
    last = times;
  }

 private:
  // Whether other processes, over the last readings of /proc/stat, kept
  // busy more cores than a team of `threads` leaves free. Busy processes
  // that crowd the team get a share of the cores, not all they want: beside
  // a team of T on C cores the fewest that crowd it, C - T + 1, get
  // (C - T + 1) C / (C + 1) of them. The threshold, (C - T) C / (C + 1)
  // plus a quarter of a core, is at least a quarter of a core under that
  // and, where the team takes every core, above what a quiet machine's
  // daemons use.
  bool cores_held_elsewhere(int threads) {
    const std::optional<MachineTimes> now = machine_times();
    if (!now) return false;
    if (!machine_) {
      machine_ = now;
      return false;
    }
    if (now->wall - machine_->wall >= machine_every_s) {
      elsewhere_ = cores_used_elsewhere(*machine_, *now);
      machine_ = now;
    }
    const double cores = omp_get_num_procs(), free_for_team = std::max(0.0, cores - threads);
    return elsewhere_ > free_for_team * cores / (cores + 1) + 0.25;
  }

  std::mutex mutex_;
  ContentionMeter meter_;
  std::optional<MachineTimes> machine_;
  double elsewhere_ = 0;
};

inline ContentionWatch& contention_watch() {
  static ContentionWatch* watch = new ContentionWatch;
  return *watch;
}

}  // namespace detail

// Called by the thread about to start a parallel region of `threads`
// threads, two or more (parallel_for, oneDNN's calls).
inline void note_parallel_region(int threads) {
  switch (spin_throttle_setting()) {
    case SpinThrottle::never:
      return;
    case SpinThrottle::always: {
      static const bool held = (idle_team().hold(true), true);
      (void)held;
      return;
    }
    case SpinThrottle::automatic:
      detail::contention_watch().sample(threads);
      return;
  }
}

#else

inline void note_parallel_region(int) {}

#endif

}  // namespace hybra::backend::cpu
