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
//
// How long the idle members spin after a region, under those settings and
// the throttle, is what the engine's waits need to know to stay out of their
// way (engine/sync.hpp's ParallelRegion): every region hybra starts begins
// with begin_parallel_region, which marks it with that time.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "../../core/debug.hpp"
#include "../../core/setting.hpp"
#include "../../engine/sync.hpp"
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

// The pauses libgomp's idle threads spin for before they sleep: after a
// region (`spin`), and while libgomp manages more threads than there are
// cores (`throttled`). libgomp reads them once at start-up, from
// OMP_WAIT_POLICY (active: 30,000,000,000 and 1,000; passive: none; unset:
// 300,000 and 100) and GOMP_SPINCOUNT (a count, with a k, M, G or T suffix,
// or `infinite`), which overrides the policy's spin and caps the throttled
// one; a value libgomp rejects leaves its default (its manual, and env.c).
struct GompSpins {
  std::uint64_t spin;
  std::uint64_t throttled;
};

namespace detail {

inline std::string_view trimmed(std::string_view text) {
  const auto first = text.find_first_not_of(" \t\n\v\f\r");
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(" \t\n\v\f\r") - first + 1);
}

inline bool equal_ignoring_case(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if ((a[i] | 0x20) != (b[i] | 0x20)) return false;
  return true;
}

inline std::optional<std::uint64_t> parse_gomp_spincount(std::string_view text) {
  constexpr std::uint64_t infinite = std::numeric_limits<std::uint64_t>::max();
  text = trimmed(text);
  if (equal_ignoring_case(text, "infinite") || equal_ignoring_case(text, "infinity")) return infinite;
  std::size_t digits = 0;
  std::uint64_t count = 0;
  for (; digits < text.size() && text[digits] >= '0' && text[digits] <= '9'; ++digits) {
    const std::uint64_t digit = static_cast<std::uint64_t>(text[digits] - '0');
    if (count > (infinite - digit) / 10) return std::nullopt;
    count = count * 10 + digit;
  }
  if (digits == 0) return std::nullopt;
  const std::string_view suffix = trimmed(text.substr(digits));
  if (suffix.empty()) return count;
  if (suffix.size() != 1) return std::nullopt;
  std::uint64_t scale = 0;
  switch (suffix[0] | 0x20) {
    case 'k': scale = 1'000; break;
    case 'm': scale = 1'000'000; break;
    case 'g': scale = 1'000'000'000; break;
    case 't': scale = 1'000'000'000'000; break;
    default: return std::nullopt;
  }
  return count > infinite / scale ? infinite : count * scale;
}

}  // namespace detail

// The settings' spins; either variable may be null (unset).
inline GompSpins parse_gomp_spins(const char* wait_policy, const char* spincount) {
  const std::string_view policy = detail::trimmed(wait_policy ? wait_policy : "");
  const bool active = detail::equal_ignoring_case(policy, "active");
  const bool passive = detail::equal_ignoring_case(policy, "passive");
  GompSpins spins = active ? GompSpins{30'000'000'000, 1'000} : passive ? GompSpins{0, 0} : GompSpins{300'000, 100};
  if (const auto count = spincount ? detail::parse_gomp_spincount(spincount) : std::nullopt) spins.spin = *count;
  spins.throttled = std::min(spins.throttled, spins.spin);
  return spins;
}

// What one of libgomp's spins costs on this machine, in nanoseconds: a load
// and a pause, as its loop has them, timed once (the fastest of a few runs,
// so that a preemption inflates none of them).
inline double spin_nanoseconds() {
  static const double each = [] {
    constexpr int pauses = 1024;
    static std::atomic<int> never_set{0};
    double fastest = std::numeric_limits<double>::infinity();
    for (int run = 0; run < 3; ++run) {
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < pauses && never_set.load(std::memory_order_relaxed) == 0; ++i) engine::detail::cpu_relax();
      const std::chrono::duration<double, std::nano> took = std::chrono::steady_clock::now() - start;
      fastest = std::min(fastest, took.count());
    }
    return fastest / pauses;
  }();
  return each;
}

// `spins` of spin_nanoseconds(), saturating at a day (libgomp's active wait
// is minutes; infinite is forever).
inline std::chrono::nanoseconds spin_time(std::uint64_t spins, double spin_ns) {
  constexpr double day_ns = 86'400e9;
  return std::chrono::nanoseconds(static_cast<std::int64_t>(std::min(day_ns, static_cast<double>(spins) * spin_ns)));
}

inline const GompSpins& gomp_spins() {
  static const GompSpins settings = parse_gomp_spins(std::getenv("OMP_WAIT_POLICY"), std::getenv("GOMP_SPINCOUNT"));
  return settings;
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
      contention_watch().sample(threads);
      return;
  }
}

}  // namespace detail

// How long libgomp's idle members will spin after a region: the throttled
// spin while the idle team is held. libgomp throttles too where other
// threads' teams make it manage more threads than cores, which is not seen
// here: the mark then outlasts the spin, and waits yield for nothing, which
// costs them little.
inline std::chrono::nanoseconds idle_spin_after_region() {
  const GompSpins& spins = gomp_spins();
  return spin_time(idle_team().held() ? spins.throttled : spins.spin, spin_nanoseconds());
}

// Called by the thread about to start a parallel region of `threads`
// threads (parallel_for's team, oneDNN's calls): the region's mark, which it
// holds while the region runs.
inline engine::detail::ParallelRegion begin_parallel_region(int threads) {
  if (threads <= 1) return engine::detail::ParallelRegion(threads, std::chrono::nanoseconds{0});
  detail::note_parallel_region(threads);
  return engine::detail::ParallelRegion(threads, idle_spin_after_region());
}

#else

// Without OpenMP a loop's threads end with its region: none spins after it.
inline std::chrono::nanoseconds idle_spin_after_region() { return std::chrono::nanoseconds{0}; }

inline engine::detail::ParallelRegion begin_parallel_region(int threads) {
  return engine::detail::ParallelRegion(threads, idle_spin_after_region());
}

#endif

}  // namespace hybra::backend::cpu
