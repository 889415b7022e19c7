#pragma once
// Whether other work holds the cores that hybra's threads wait for. Two
// readings, both needed: the threads that start hybra's parallel regions
// wait for a core (the kernel's per-thread scheduler statistics,
// /proc/thread-self/schedstat: time run, and time runnable but waiting), and
// other processes keep so many cores busy that hybra's team does not fit in
// the rest (/proc/stat's busy time less this process's own). Waits alone are
// not enough: hybra's own threads outnumber the cores at moments (an engine
// caller spinning in its wait beside a team), and a short training step's
// windows waited up to half their time on a quiet machine.
//
// The verdict has hysteresis: one window of waiting on a machine that other
// work holds turns it on, several windows in a row that did not wait or
// where the cores were free turn it off, so that a call descheduled once
// does not flip it and a steady load does not make it flap. Time asleep
// counts for nothing, so a program idle between calls keeps its verdict.
// The window and shares are chosen, not tuned: a steady competing load makes
// a thread wait a third or more of its time (docs/benchmarks.md, "Under a
// competing load").
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <optional>

#if defined(__linux__)
#include <fcntl.h>
#include <unistd.h>
#endif

namespace hybra::backend::cpu {

namespace detail {

#if defined(__linux__)
// A /proc file kept open by the thread that reads it; pread at offset 0 has
// the kernel write it afresh.
class ProcFile {
 public:
  explicit ProcFile(const char* path) : fd_(::open(path, O_RDONLY | O_CLOEXEC)) {}
  ~ProcFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  ProcFile(const ProcFile&) = delete;
  ProcFile& operator=(const ProcFile&) = delete;

  // The file's first `size - 1` bytes at most, NUL-terminated; false when it
  // cannot be read.
  bool read(char* text, std::size_t size) const {
    if (fd_ < 0) return false;
    const ssize_t n = ::pread(fd_, text, size - 1, 0);
    if (n <= 0) return false;
    text[n] = '\0';
    return true;
  }

 private:
  int fd_;
};
#endif

inline double clock_seconds(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

}  // namespace detail

// A thread's scheduler counters, in nanoseconds since it started.
struct SchedTimes {
  std::int64_t ran = 0;
  std::int64_t waited = 0;
};

// The calling thread's counters, or nothing where the kernel does not keep
// them (not Linux, no schedstat, /proc not mounted).
inline std::optional<SchedTimes> own_sched_times() {
#if defined(__linux__)
  thread_local const detail::ProcFile file("/proc/thread-self/schedstat");
  char text[96];
  long long ran = 0, waited = 0;
  if (!file.read(text, sizeof text) || std::sscanf(text, "%lld %lld", &ran, &waited) != 2) return std::nullopt;
  return SchedTimes{ran, waited};
#else
  return std::nullopt;
#endif
}

// CPU time since boot, in seconds: what every process on the machine used
// (user, nice, system and interrupts, not steal) and what this one did, with
// the wall clock they were read at.
struct MachineTimes {
  double busy = 0;
  double own = 0;
  double wall = 0;
};

inline std::optional<MachineTimes> machine_times() {
#if defined(__linux__)
  thread_local const detail::ProcFile file("/proc/stat");
  char text[256];
  unsigned long long user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0;
  if (!file.read(text, sizeof text) ||
      std::sscanf(text, "cpu %llu %llu %llu %llu %llu %llu %llu", &user, &nice, &system, &idle, &iowait, &irq,
                  &softirq) != 7)
    return std::nullopt;
  static const double tick = 1.0 / static_cast<double>(sysconf(_SC_CLK_TCK));
  return MachineTimes{static_cast<double>(user + nice + system + irq + softirq) * tick,
                      detail::clock_seconds(CLOCK_PROCESS_CPUTIME_ID), detail::clock_seconds(CLOCK_MONOTONIC)};
#else
  return std::nullopt;
#endif
}

// The cores other processes kept busy between two readings, on average.
inline double cores_used_elsewhere(const MachineTimes& before, const MachineTimes& after) {
  const double wall = after.wall - before.wall;
  if (wall <= 0) return 0;
  return ((after.busy - before.busy) - (after.own - before.own)) / wall;
}

// Turns the waits of windows of demand (time run plus time waited) into a
// verdict: contended from a window that waited at least `on_share` of its
// demand on a machine whose cores other work holds, until `quiet_windows`
// windows in a row wait less than `off_share` or find the cores free.
class ContentionMeter {
 public:
  static constexpr std::int64_t window_ns = 20'000'000;
  static constexpr double on_share = 0.10;
  static constexpr double off_share = 0.03;
  static constexpr int quiet_windows = 5;

  // Adds a thread's run and wait time since its previous sample; true when
  // a window is full, to be closed with close_window.
  bool add(std::int64_t ran, std::int64_t waited) {
    ran_ += ran;
    waited_ += waited;
    return ran_ + waited_ >= window_ns;
  }

  // Ends the window, told whether other work held the cores meanwhile; true
  // when the verdict changed.
  bool close_window(bool cores_held_elsewhere) {
    const std::int64_t demand = ran_ + waited_;
    last_share_ = demand > 0 ? static_cast<double>(waited_) / static_cast<double>(demand) : 0;
    ran_ = waited_ = 0;
    const bool was = contended_;
    if (last_share_ >= on_share && cores_held_elsewhere) {
      contended_ = true;
      quiet_ = 0;
    } else if (last_share_ < off_share || !cores_held_elsewhere) {
      if (contended_ && ++quiet_ >= quiet_windows) contended_ = false;
    } else {
      quiet_ = 0;
    }
    return contended_ != was;
  }

  bool contended() const { return contended_; }
  // The wait share of the last window closed, for diagnostics.
  double last_share() const { return last_share_; }

 private:
  std::int64_t ran_ = 0, waited_ = 0;
  bool contended_ = false;
  int quiet_ = 0;
  double last_share_ = 0;
};

}  // namespace hybra::backend::cpu
