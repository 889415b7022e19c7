// Tensors on the engine: ops return futures, sync points wait, independent
// work runs at once on several CPU devices, failures reach every sync point
// downstream, and a large random program gives the same values as the
// synchronous (naive) engine.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <hybra/eager.hpp>
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sys/resource.h>
#include <sys/wait.h>
#include <sstream>
#include <thread>
#include <unistd.h>
#include <vector>

#include "reference.hpp"

using namespace hybra;
using engine::EngineType;

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

using test::await_flag;
using test::EngineTypeScope;

// Queues an op that writes `value` into t once `open` is set: the caller
// controls when it finishes.
void push_gate(const Tensor& t, const std::shared_ptr<std::atomic<bool>>& open, float value) {
  push_op("gate", {}, {t}, [t, open, value] {
    await_flag(*open);
    auto* p = static_cast<float*>(t.raw_data());
    for (std::int64_t i = 0; i < t.size(); ++i) p[i] = value;
  });
}

std::vector<float> values(const Tensor& t) { return t.to_vector<float>(); }

}  // namespace

TEST_CASE("async: ops return before their inputs are ready; reads wait for them") {
  EngineTypeScope threaded(EngineType::threaded);
  auto open = std::make_shared<std::atomic<bool>>(false);
  Tensor t({4});
  push_gate(t, open, 2.0f);
  // Everything below is queued behind the gate, which is still closed.
  Tensor u = relu(t * 3 - 1);
  Tensor s = sum(u);
  Tensor m = matmul(reshape(u, {1, 4}), reshape(t, {4, 1}));
  open->store(true);
  CHECK(values(u) == std::vector<float>(4, 5.0f));
  CHECK(s.item<float>() == 20.0f);
  CHECK(m.item<float>() == 40.0f);
}

TEST_CASE("async: a small kernel runs before its call returns; a large one, a long product and a user's op wait") {
  // An op on cpu(1) first: switching the engine's type forgets it, and
  // brief ops run on the calling thread again with one device in use.
  Tensor elsewhere({1}, DType::float32, cpu(1));
  eval(elsewhere + 1).wait_to_read();
  EngineTypeScope threaded(EngineType::threaded);
  auto first = [](const Tensor& t) { return *static_cast<const float*>(t.raw_data()); };  // no wait
  Tensor big = full({1 << 18}, 7.0f), product = full({64, 128}, 7.0f), mine = full({1}, 7.0f);
  big.wait_to_read();
  product.wait_to_read();
  mine.wait_to_read();
  auto open = std::make_shared<std::atomic<bool>>(false);
  Tensor held({1});
  push_gate(held, open, 0.0f);  // holds cpu(0)'s one worker: what is queued after it waits
  const Tensor s = sum(full({16, 16}, 1.0f));
  CHECK(first(s) == 256.0f);  // 2 KiB: both kernels ran on this thread
  big.assign(big * 0 + 1);    // 1 MiB read, 1 MiB written
  product.assign(matmul(full({64, 256}, 1.0f), full({256, 128}, 1.0f)));  // 896 KiB, 2^21 multiply-adds
  push_op("mine", {}, {mine}, [mine] { *static_cast<float*>(mine.raw_data()) = 1.0f; });  // 4 bytes, a user's op
  CHECK(first(big) == 7.0f);
  CHECK(first(product) == 7.0f);
  CHECK(first(mine) == 7.0f);
  // A brief op run where it is pushed starts no thread team.
  Tensor team({2}, DType::int32);
  push_op("team", {}, {team}, [team] {
    static_cast<std::int32_t*>(team.raw_data())[0] = backend::cpu::available_threads();
    static_cast<std::int32_t*>(team.raw_data())[1] = backend::cpu::share_threads();
  }, engine::OpLength::brief);
  CHECK(static_cast<const std::int32_t*>(team.raw_data())[0] == 1);
  CHECK(static_cast<const std::int32_t*>(team.raw_data())[1] == std::min(num_threads(), engine::get().device_threads(cpu(0))));
  open->store(true);
  CHECK(big.to_vector<float>() == std::vector<float>(1 << 18, 1.0f));
  CHECK(product.to_vector<float>() == std::vector<float>(64 * 128, 256.0f));
  CHECK(mine.item<float>() == 1.0f);
}

TEST_CASE("async: data, printing and wait_to_read wait for pending writes") {
  EngineTypeScope threaded(EngineType::threaded);
  for (int kind = 0; kind < 3; ++kind) {
    auto open = std::make_shared<std::atomic<bool>>(false);
    Tensor t({2});
    push_gate(t, open, 7.0f);
    std::thread opener([open] {
      std::this_thread::sleep_for(20ms);
      open->store(true);
    });
    if (kind == 0) {
      CHECK(t.data<float>()[1] == 7.0f);
    } else if (kind == 1) {
      std::ostringstream os;
      os << t;
      CHECK(os.str().rfind("[7. 7.]", 0) == 0);
    } else {
      t.wait_to_read();
      CHECK(static_cast<const float*>(t.raw_data())[0] == 7.0f);
    }
    opener.join();
  }
}

TEST_CASE("async: a write waits for earlier reads and writes of the same storage") {
  EngineTypeScope threaded(EngineType::threaded);
  auto open = std::make_shared<std::atomic<bool>>(false);
  Tensor t = full({3}, 1.0f);
  Tensor gate({3});
  push_gate(gate, open, 10.0f);
  Tensor before = t + gate;  // reads t (after the gate)
  t.assign(t * 2);           // must not overwrite t before `before` has read it
  Tensor after = t + 0;
  slice(t, 0, 0, 1).assign(full({1}, 5.0f));  // a partial write, after the whole one
  open->store(true);
  CHECK(values(before) == std::vector<float>(3, 11.0f));
  CHECK(values(after) == std::vector<float>(3, 2.0f));
  CHECK(values(t) == std::vector<float>{5.0f, 2.0f, 2.0f});
}

TEST_CASE("async: dropping tensors whose ops are pending is safe") {
  EngineTypeScope threaded(EngineType::threaded);
  auto open = std::make_shared<std::atomic<bool>>(false);
  Tensor result;
  {
    Tensor t({1000});
    push_gate(t, open, 1.5f);
    Tensor u = exp(t * 0);  // all of t, u and the expression go out of scope while pending
    result = u + t;
  }
  open->store(true);
  CHECK(values(result) == std::vector<float>(1000, 2.5f));
}

TEST_CASE("async: independent work on cpu(0) and cpu(1) runs at the same time") {
  EngineTypeScope threaded(EngineType::threaded);
  auto first = std::make_shared<std::atomic<bool>>(false), second = std::make_shared<std::atomic<bool>>(false);
  Tensor a({1}, DType::float32, cpu(0)), b({1}, DType::float32, cpu(1));
  // Each op waits for the other to start: both finish only if they overlap.
  push_op("meet0", {}, {a}, [a, first, second] {
    first->store(true);
    *static_cast<float*>(a.raw_data()) = await_flag(*second) ? 1.0f : 0.0f;
  });
  push_op("meet1", {}, {b}, [b, first, second] {
    second->store(true);
    *static_cast<float*>(b.raw_data()) = await_flag(*first) ? 1.0f : 0.0f;
  });
  CHECK(a.item<float>() == 1.0f);
  CHECK(b.item<float>() == 1.0f);
}

TEST_CASE("async: an op's threads are its device's share of the cores") {
  EngineTypeScope threaded(EngineType::threaded);
  // An op's share is fixed when it starts: both devices have had an op before the two that read theirs, or the
  // first could start while it is the only device in use.
  for (const Device d : {cpu(0), cpu(1)}) {
    Tensor mark({1}, DType::int32, d);
    push_op("mark", {}, {mark}, [] {});
    mark.wait_to_read();
  }
  Tensor on0({1}, DType::int32, cpu(0)), on1({1}, DType::int32, cpu(1));
  for (const Tensor& t : {on0, on1})
    push_op("threads", {}, {t}, [t] { *static_cast<std::int32_t*>(t.raw_data()) = backend::cpu::available_threads(); });
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // cpu(0) and cpu(1) are both in use: together they get the machine, each
  // at least one thread and neither more than its share.
  const int t0 = on0.item<int>(), t1 = on1.item<int>();
  CHECK(t0 == std::min(num_threads(), engine::get().device_threads(cpu(0))));
  CHECK(t1 == std::min(num_threads(), engine::get().device_threads(cpu(1))));
  CHECK(t0 >= 1);
  CHECK(t1 >= 1);
  CHECK(engine::get().device_threads(cpu(0)) + engine::get().device_threads(cpu(1)) <= std::max(hw, 2));
  CHECK(backend::cpu::available_threads() == std::min(num_threads(), hw));  // outside an op
}

TEST_CASE("async: a parallel loop's pieces run on threads of their own, with OpenMP or HYBRA_THREAD_LOOPS") {
  const int saved = num_threads();
  set_num_threads(2);
  std::mutex m;
  std::set<std::thread::id> threads;
  std::int64_t covered = 0;
  backend::cpu::parallel_for(1 << 20, 1, [&](std::int64_t begin, std::int64_t end) {
    std::lock_guard lock(m);
    threads.insert(std::this_thread::get_id());
    covered += end - begin;
  });
  set_num_threads(saved);
  CHECK(covered == 1 << 20);
#if defined(_OPENMP) || defined(HYBRA_THREAD_LOOPS)
  CHECK(threads.size() == 2);
#else
  CHECK(threads.size() == 1);
#endif
}

TEST_CASE("async: the contention meter turns on after a window that waited for cores held elsewhere") {
  using Meter = backend::cpu::ContentionMeter;
  constexpr std::int64_t ms = 1'000'000;
  Meter meter;
  // Half the time waited, but under a window of demand: not yet full.
  CHECK_FALSE(meter.add(9 * ms, 9 * ms));
  CHECK(meter.add(2 * ms, 2 * ms));
  // Waits while the cores were free are hybra's own threads': no verdict.
  CHECK_FALSE(meter.close_window(false));
  CHECK_FALSE(meter.contended());
  CHECK(meter.add(10 * ms, 10 * ms));
  CHECK(meter.close_window(true));  // 50% waited, the cores held elsewhere
  CHECK(meter.contended());
  CHECK(meter.last_share() == doctest::Approx(0.5));
  for (int w = 1; w < Meter::quiet_windows; ++w) {
    CHECK(meter.add(20 * ms, 0));
    CHECK_FALSE(meter.close_window(true));
    CHECK(meter.contended());
  }
  // A window between the two shares ends the quiet streak...
  CHECK(meter.add(19 * ms, ms));
  CHECK_FALSE(meter.close_window(true));
  for (int w = 1; w < Meter::quiet_windows; ++w) {
    CHECK(meter.add(19 * ms, ms));
    CHECK_FALSE(meter.close_window(false));  // ...and windows with the cores free count as quiet
  }
  CHECK(meter.contended());
  CHECK(meter.add(20 * ms, 0));
  CHECK(meter.close_window(true));  // ...so it takes a full streak after it
  CHECK_FALSE(meter.contended());
  // Waits under the on share leave a quiet meter quiet.
  CHECK(meter.add(19 * ms, ms + ms / 2));
  CHECK_FALSE(meter.close_window(true));
  CHECK_FALSE(meter.contended());
}

TEST_CASE("async: HYBRA_SPIN_THROTTLE's settings, and a bad one named") {
  using backend::cpu::SpinThrottle;
  CHECK(backend::cpu::parse_spin_throttle("") == SpinThrottle::automatic);
  CHECK(backend::cpu::parse_spin_throttle("auto") == SpinThrottle::automatic);
  CHECK(backend::cpu::parse_spin_throttle("0") == SpinThrottle::never);
  CHECK(backend::cpu::parse_spin_throttle("1") == SpinThrottle::always);
  CHECK_THROWS_WITH_AS(backend::cpu::parse_spin_throttle("yes"),
                       doctest::Contains("HYBRA_SPIN_THROTTLE=yes is not a setting; use auto, 0 or 1"), ValueError);
}

TEST_CASE("async: libgomp's idle spins, as OMP_WAIT_POLICY and GOMP_SPINCOUNT set them") {
  using backend::cpu::parse_gomp_spins;
  constexpr std::uint64_t infinite = std::numeric_limits<std::uint64_t>::max();
  auto spins = [](const char* policy, const char* count) {
    const backend::cpu::GompSpins s = parse_gomp_spins(policy, count);
    return std::pair(s.spin, s.throttled);
  };
  using P = std::pair<std::uint64_t, std::uint64_t>;
  CHECK(spins(nullptr, nullptr) == P(300'000, 100));
  CHECK(spins("active", nullptr) == P(30'000'000'000, 1'000));
  CHECK(spins(" PASSIVE ", nullptr) == P(0, 0));
  CHECK(spins("sometimes", nullptr) == P(300'000, 100));  // rejected: libgomp's default
  CHECK(spins(nullptr, "1000") == P(1'000, 100));
  CHECK(spins(nullptr, "50") == P(50, 50));  // caps the throttled spin
  CHECK(spins("active", "10k") == P(10'000, 1'000));
  CHECK(spins(nullptr, " 2 M ") == P(2'000'000, 100));
  CHECK(spins("passive", "1000") == P(1'000, 0));
  CHECK(spins(nullptr, "Infinity") == P(infinite, 100));
  CHECK(spins(nullptr, "20000000T") == P(infinite, 100));  // saturates
  CHECK(spins(nullptr, "99999999999999999999") == P(300'000, 100));  // overflows: rejected
  CHECK(spins(nullptr, "12x") == P(300'000, 100));
  CHECK(spins(nullptr, "") == P(300'000, 100));
  CHECK(backend::cpu::spin_time(300'000, 25.0) == std::chrono::microseconds(7'500));
  CHECK(backend::cpu::spin_time(infinite, 25.0) == std::chrono::hours(24));
  const double each = backend::cpu::spin_nanoseconds();
  CHECK(each > 0.05);
  CHECK(each < 2'000);
}

namespace {

// Processes that keep a core busy each until they go out of scope.
class BusyProcesses {
 public:
  explicit BusyProcesses(unsigned count) {
    for (unsigned p = 0; p < count; ++p) {
      const pid_t pid = fork();
      REQUIRE(pid >= 0);
      if (pid == 0)
        for (;;) {
        }
      children_.push_back(pid);
    }
  }
  ~BusyProcesses() {
    for (pid_t pid : children_) kill(pid, SIGKILL);
    for (pid_t pid : children_) waitpid(pid, nullptr, 0);
  }
  BusyProcesses(const BusyProcesses&) = delete;
  BusyProcesses& operator=(const BusyProcesses&) = delete;

 private:
  std::vector<pid_t> children_;
};

unsigned cores() { return std::max(1u, std::thread::hardware_concurrency()); }

}  // namespace

TEST_CASE("async: a thread's scheduler counters show the time it waited for a core") {
  const auto before = backend::cpu::own_sched_times();
  if (!before) {
    MESSAGE("this kernel keeps no per-thread scheduler statistics: nothing to check");
    return;
  }
  // More busy threads than cores: this one waits for a core while it works.
  std::atomic<bool> stop{false};
  std::vector<std::thread> busy;
  for (unsigned t = 0; t < 2 * cores(); ++t)
    busy.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed)) {
      }
    });
  const auto until = Clock::now() + 200ms;
  while (Clock::now() < until) {
  }
  const auto after = backend::cpu::own_sched_times();
  stop = true;
  for (auto& t : busy) t.join();
  REQUIRE(after);
  const double ran = static_cast<double>(after->ran - before->ran);
  const double waited = static_cast<double>(after->waited - before->waited);
  CHECK(ran > 0);
  CHECK(waited / (ran + waited) > 0.1);
}

TEST_CASE("async: the machine's counters show the cores other processes keep busy") {
  const auto before = backend::cpu::machine_times();
  if (!before) {
    MESSAGE("no /proc/stat: nothing to check");
    return;
  }
  std::optional<backend::cpu::MachineTimes> after;
  {
    BusyProcesses busy(1);
    std::this_thread::sleep_for(300ms);
    after = backend::cpu::machine_times();
  }
  REQUIRE(after);
  // One busy process, this one asleep; the clock ticks (10 ms) and other
  // work on the machine blur it.
  const double elsewhere = backend::cpu::cores_used_elsewhere(*before, *after);
  CHECK(elsewhere > 0.6);
  CHECK(elsewhere < cores() + 0.1);
}

#ifdef _OPENMP
namespace {

double process_cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

// The CPU time the process spends while a fresh thread runs five short
// two-thread regions, each followed by 20 ms asleep: libgomp's idle team
// thread spins through most of it unless its spins are short. Regions of its
// own, not parallel_for's, so that the contention watch stays out of it.
double cpu_seconds_around_idle_regions() {
  std::this_thread::sleep_for(50ms);  // spins started before end first
  double used = 0;
  std::thread([&] {
    const double start = process_cpu_seconds();
    for (int r = 0; r < 5; ++r) {
      std::atomic<int> joined{0};
#pragma omp parallel num_threads(2)
      joined.fetch_add(1);
      CHECK(joined.load() == 2);
      std::this_thread::sleep_for(20ms);
    }
    used = process_cpu_seconds() - start;
  }).join();
  return used;
}

}  // namespace

// In a process of its own, by ctest's `unit_gomp_spin` (hybra_tests --no-skip
// -ts="libgomp alone"): libgomp shortens its spins for good once a process has
// had more team threads than cores, which the other cases' engines and loops
// leave behind.
TEST_SUITE("libgomp alone") {
  TEST_CASE("async: while the idle team is held, libgomp's idle threads stop spinning at once" * doctest::skip()) {
    if (std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT") || omp_get_num_procs() < 2) {
      MESSAGE("libgomp's waits are set from the environment, or one core: its spins are short already");
      return;
    }
    auto& team = backend::cpu::idle_team();
    const bool was_held = team.held();
    team.hold(false);
    const double spinning = cpu_seconds_around_idle_regions();
    team.hold(true);
    CHECK(team.last_team_size() == omp_get_num_procs() + 1);
    const double held = cpu_seconds_around_idle_regions();
    team.hold(false);
    // Released, the spins are long again.
    const double released = cpu_seconds_around_idle_regions();
    team.hold(was_held);
    INFO("CPU seconds over five idle gaps: ", spinning, " with libgomp's spins, ", held,
         " with the idle team held, ", released, " released");
    CHECK(held < spinning / 2);
    CHECK(held < released / 2);
  }
}

TEST_CASE("async: parallel loops that wait for cores other processes hold, hold the idle team") {
  if (backend::cpu::spin_throttle_setting() != backend::cpu::SpinThrottle::automatic ||
      !backend::cpu::own_sched_times()) {
    MESSAGE("HYBRA_SPIN_THROTTLE, OMP_WAIT_POLICY or GOMP_SPINCOUNT is set, or no scheduler statistics");
    return;
  }
  auto& team = backend::cpu::idle_team();
  team.hold(false);
  const int saved = num_threads();
  set_num_threads(2);
  std::atomic<std::int64_t> covered{0};
  const auto loop = [&] {
    backend::cpu::parallel_for(1 << 17, 1, [&](std::int64_t begin, std::int64_t end) { covered += end - begin; });
  };
  bool held = false;
  {
    // A core busy elsewhere for each core: a team of two waits.
    BusyProcesses busy(cores());
    held = test::await(
        [&] {
          loop();
          return team.held();
        },
        10s);
  }
  set_num_threads(saved);
  CHECK(held);
  CHECK(covered.load() % (1 << 17) == 0);
}
#endif

// A parallel loop whose pieces race, on purpose: ctest's tsan_sees_loop_races
// runs it in the ThreadSanitizer build, which must report the race
// (HYBRA_THREAD_LOOPS puts the pieces on threads it watches; libgomp's would
// be invisible to it).
TEST_SUITE("loop race") {
  TEST_CASE("a parallel loop's pieces all add to one variable unguarded" * doctest::skip()) {
    const int saved = num_threads();
    set_num_threads(2);
    std::int64_t covered = 0;
    backend::cpu::parallel_for(1 << 20, 1, [&](std::int64_t begin, std::int64_t end) { covered += end - begin; });
    set_num_threads(saved);
    CHECK(covered > 0);
  }
}

TEST_CASE("async: copies between devices") {
  Tensor a = arange(0, 6).astype(DType::float64);
  CHECK(a.to(cpu(0)).storage() == a.storage());
  Tensor b = a.to(cpu(1));
  CHECK(b.device() == cpu(1));
  CHECK(b.storage() != a.storage());
  CHECK(b.to_vector<double>() == a.to_vector<double>());
  Tensor c = zeros({6}, DType::int32, cpu(2));
  b.copy_to(c);
  CHECK(c.to_vector<int>() == std::vector<int>{0, 1, 2, 3, 4, 5});
  Tensor row = zeros({2, 3}, DType::float32, cpu(1));
  slice(reshape(a, {2, 3}), 0, 1, 2).copy_to(slice(row, 0, 0, 1));
  CHECK(values(row) == std::vector<float>{3, 4, 5, 0, 0, 0});
  CHECK_THROWS_WITH_AS(a.copy_to(zeros({5})), doctest::Contains("copy_to: source of shape (6,) does not match"),
                       ShapeError);
}

TEST_CASE("async: device errors are thrown by the call") {
  const auto& gpus = backend::cuda::driver_status().gpus;
  CHECK(devices().size() == 1 + gpus.size());
  if (gpus.empty())
    CHECK_THROWS_WITH_AS(zeros({2}, DType::float32, cuda(0)), doctest::Contains("cuda(0) is not available"), DeviceError);
  CHECK_THROWS_WITH_AS(zeros({2}, DType::float32, cuda(static_cast<int>(gpus.size()))),
                       doctest::Contains(gpus.empty() ? "is not available" : "there is no cuda("), DeviceError);
  CHECK_THROWS_WITH_AS(zeros({2}, DType::float32, cpu(max_cpu_devices)), doctest::Contains("cpu(0) to cpu(63)"),
                       DeviceError);
  CHECK_THROWS_WITH_AS(zeros({2}, DType::float32, cpu(-1)), doctest::Contains("there is no device cpu(-1)"), DeviceError);
  Tensor a = ones({2}), b = ones({2}, DType::float32, cpu(1));
  CHECK_THROWS_WITH_AS(Tensor(a + b), doctest::Contains("operands live on cpu(0) and cpu(1)"), DeviceError);
  CHECK_THROWS_WITH_AS(matmul(a, b), doctest::Contains("matmul: operands live on cpu(0) and cpu(1)"), DeviceError);
  CHECK_THROWS_WITH_AS(b.assign(a * 2), doctest::Contains("assign: the value is computed on cpu(0)"), DeviceError);
  b.assign(a);  // a plain tensor is copied across
  CHECK(values(b) == std::vector<float>{1, 1});
}

TEST_CASE("async: shape errors are thrown by the call, not at the next sync point") {
  Tensor a = ones({2, 3}), b = ones({4});
  CHECK_THROWS_AS(Tensor(a + b), ShapeError);
  CHECK_THROWS_AS(matmul(a, a), ShapeError);
  CHECK_THROWS_AS(sum(a, 2), AxisError);
  waitall();  // nothing failed asynchronously
}

TEST_CASE("async: a failed op's error reaches the tensors downstream, every wait and waitall") {
  for (EngineType type : {EngineType::threaded, EngineType::naive}) {
    EngineTypeScope scope(type);
    Tensor bad({3});
    push_op("explode", {}, {bad}, [] { fail<ValueError>("the detonator was pressed"); });
    Tensor down = sum(bad * 2);  // does not run: bad has no value
    Tensor fine = ones({3}) + 1;
    const char* message = "engine op 'explode' on cpu(0) failed: the detonator was pressed";
    CHECK_THROWS_WITH_AS(down.item<float>(), doctest::Contains(message), ValueError);
    CHECK_THROWS_WITH_AS(bad.wait_to_read(), doctest::Contains(message), ValueError);
    CHECK_THROWS_WITH_AS((void)bad.to_vector<float>(), doctest::Contains(message), ValueError);
    std::ostringstream os;
    CHECK_THROWS_AS(os << down, ValueError);
    CHECK(values(fine) == std::vector<float>(3, 2.0f));
    waitall();  // every failure was delivered by a wait already

    Tensor lost({1});
    push_op("unwatched", {}, {lost}, [] { throw std::runtime_error("nobody waits for me"); });
    CHECK_THROWS_WITH_AS(waitall(), doctest::Contains("engine op 'unwatched' on cpu(0) failed: nobody waits for me"),
                         Error);
    waitall();  // delivered once

    // A whole overwrite gives the tensor a value again; a partial one cannot.
    bad.assign(full({3}, 4.0f));
    CHECK(values(bad) == std::vector<float>(3, 4.0f));
    Tensor half({4});
    push_op("explode", {}, {half}, [] { fail<ValueError>("again"); });
    slice(half, 0, 0, 2).assign(zeros({2}));
    CHECK_THROWS_AS(half.wait_to_read(), ValueError);
    CHECK(sum(arange(0, 5)).item<float>() == 10.0f);  // the engine goes on working
  }
}

TEST_CASE("async: code inside an op runs sub-ops at once and reads without waiting") {
  EngineTypeScope threaded(EngineType::threaded);
  Tensor in = arange(0, 4), out({4});
  std::atomic<bool> same_thread{false};
  push_op("composite", {in}, {out}, [in, out, &same_thread]() mutable {
    const auto me = std::this_thread::get_id();
    Tensor twice = in * 2;           // runs here and now, not queued behind this op
    out.assign(exp(twice * 0) + twice);
    same_thread = std::this_thread::get_id() == me && twice.to_vector<float>()[3] == 6.0f;
  });
  CHECK(values(out) == std::vector<float>{1, 3, 5, 7});
  CHECK(same_thread.load());
}

TEST_CASE("async: running out of memory inside an op is an OutOfMemory at the sync point") {
  Tensor t({1});
  push_op("hungry", {}, {t}, [] { throw std::bad_alloc(); });
  CHECK_THROWS_WITH_AS(t.wait_to_read(), doctest::Contains("engine op 'hungry' on cpu(0) failed: out of memory"),
                       OutOfMemory);
}

TEST_CASE("async: assigning another view of the same storage reads it before overwriting it") {
  Tensor m = arange(0, 9).astype(DType::int32);
  m = reshape(m, {3, 3});
  m.assign(transpose(m, {1, 0}));
  CHECK(m.to_vector<int>() == std::vector<int>{0, 3, 6, 1, 4, 7, 2, 5, 8});
}

TEST_CASE("async: the naive engine runs each op on the calling thread before the call returns") {
  EngineTypeScope naive(EngineType::naive);
  Tensor t({1});
  std::thread::id ran_on;
  push_op("where", {}, {t}, [&ran_on] { ran_on = std::this_thread::get_id(); });
  CHECK(ran_on == std::this_thread::get_id());
}

namespace {

// A random program over a few hundred small tensors spread over two CPU
// devices: fused expressions, in-place and partial writes, copies within and
// across devices, matmul, reductions, softmax and handles dropped while
// pending. Returns every tensor's final values.
std::vector<std::vector<float>> random_program(int ops, unsigned seed) {
  constexpr int n_tensors = 256;
  std::mt19937 rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  Generator gen(seed);
  std::vector<Tensor> slots;
  for (int i = 0; i < n_tensors; ++i)
    slots.push_back(random_uniform({4, 4}, -1, 1, DType::float32, cpu(i % 2), gen));
  // An operand for slot i's device: another slot, moved there first when needed.
  auto on = [&](int j, Device d) { return slots[static_cast<std::size_t>(j)].to(d); };
  for (int step = 0; step < ops; ++step) {
    const int i = pick(n_tensors), j = pick(n_tensors), k = pick(n_tensors);
    Tensor& dst = slots[static_cast<std::size_t>(i)];
    const Device d = dst.device();
    switch (pick(8)) {
      case 0: dst = tanh(on(j, d) * on(k, d) + 0.5f); break;
      case 1: dst.assign(dst - on(j, d) * 0.25f); break;
      case 2: slice(dst, 0, 1, 3).assign(slice(on(j, d), 0, 0, 2) * -1); break;
      case 3: dst = on(j, cpu(1 - d.id)); break;
      case 4: slots[static_cast<std::size_t>(j)].copy_to(dst); break;
      case 5: dst = tanh(matmul(on(j, d), on(k, d))); break;
      case 6: dst = on(j, d) - mean(on(j, d), 1, true); break;
      default: dst = softmax(on(j, d), pick(2)); break;
    }
  }
  std::vector<std::vector<float>> result;
  for (const auto& t : slots) result.push_back(values(t));
  return result;
}

}  // namespace

TEST_CASE("async: a random program of 100k ops on two devices matches the naive engine") {
  std::vector<std::vector<float>> threaded_result, naive_result;
  {
    EngineTypeScope threaded(EngineType::threaded);
    threaded_result = random_program(100000, 7);
  }
  {
    EngineTypeScope naive(EngineType::naive);
    naive_result = random_program(100000, 7);
  }
  REQUIRE(threaded_result.size() == naive_result.size());
  int differing = 0;
  for (std::size_t t = 0; t < threaded_result.size(); ++t) differing += threaded_result[t] != naive_result[t];
  CHECK(differing == 0);
}

// Shutting the global engine down ends hybra for the rest of the process, so
// this case is skipped in the main run and run alone, in a process of its
// own, by ctest's `unit_shutdown` (hybra_tests --no-skip -ts="own process").
TEST_SUITE("own process") {
  TEST_CASE("async: shutdown runs the pending work, then ops throw and waits still answer" * doctest::skip()) {
    EngineTypeScope threaded(EngineType::threaded);
    auto open = std::make_shared<std::atomic<bool>>(false);
    Tensor t({8});
    push_gate(t, open, 1.0f);
    Tensor acc = zeros({8}, DType::float32, cpu(1));
    for (int i = 0; i < 1000; ++i) acc.assign(acc + t.to(cpu(1)));
    std::thread opener([open] {
      std::this_thread::sleep_for(20ms);
      open->store(true);
    });
    engine::shutdown();  // returns once all of the above has run
    opener.join();
    CHECK(values(acc) == std::vector<float>(8, 1000.0f));
    CHECK_THROWS_WITH(ones({2}), doctest::Contains("op 'full' pushed after the engine was shut down"));
    acc.wait_to_write();
    waitall();
  }
}
