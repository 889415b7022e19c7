// The dependency engine: ordering (RAW, WAR, WAW) against a serial run of a
// large random DAG, concurrency across devices, waking sleeping workers and
// waiters, error propagation, shutdown, lifetimes and the naive (synchronous)
// mode, and the waiting threads that help with an op's loops.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <hybra/backend/cpu/gemv.hpp>
#include <hybra/engine/engine.hpp>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "reference.hpp"

using namespace hybra;
using engine::Engine;
using engine::EngineType;
using engine::Options;
using engine::Var;

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

Options threaded(int workers = 1, int cpu_threads = 0) { return {EngineType::threaded, cpu_threads, workers}; }
Options naive() { return {EngineType::naive, 0, 1}; }

using test::await_flag;

// Spins for d: sleep_for overshoots by tens of microseconds, more than the
// engine's whole spin before a worker or waiter sleeps.
void busy_for(std::chrono::microseconds d) {
  auto end = Clock::now() + d;
  while (Clock::now() < end) {
  }
}

std::uint64_t mix(std::uint64_t h, std::uint64_t x) {
  h ^= x + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdULL;
}

// A random DAG of ops over per-var integers. Each op reads some vars, writes
// others (some in place), and sets each written value to a hash of what it
// read and its own id, so any reordering of conflicting ops changes the
// result. Every `fail_every`-th op throws.
struct RandomDag {
  struct Op {
    std::vector<int> reads, writes;  // writes that are also in reads are updated in place
    int device;
    bool throws;
  };
  int vars;
  std::vector<Op> ops;

  RandomDag(int n_ops, int n_vars, int n_devices, int fail_every, std::uint32_t seed) : vars(n_vars) {
    std::mt19937 rng(seed);
    auto var = [&] { return static_cast<int>(rng() % static_cast<unsigned>(n_vars)); };
    ops.reserve(n_ops);
    for (int i = 0; i < n_ops; ++i) {
      Op op;
      for (int r = static_cast<int>(rng() % 4); r > 0; --r) op.reads.push_back(var());
      for (int w = 1 + static_cast<int>(rng() % 2); w > 0; --w) op.writes.push_back(var());
      if (rng() % 4 == 0) op.reads.push_back(op.writes[0]);
      op.device = static_cast<int>(rng() % static_cast<unsigned>(n_devices));
      op.throws = fail_every > 0 && i % fail_every == fail_every - 1;
      ops.push_back(std::move(op));
    }
  }

  static std::uint64_t value(int id, const std::vector<int>& reads, const std::uint64_t* state) {
    std::uint64_t h = static_cast<std::uint64_t>(id);
    for (int r : reads) h = mix(h, state[r]);
    return h;
  }
  static void run(int id, const Op& op, std::uint64_t* state) {
    if (op.throws) fail<ValueError>("injected failure ", id);
    std::uint64_t h = value(id, op.reads, state);
    for (int w : op.writes) state[w] = mix(h, static_cast<std::uint64_t>(w));
  }

  // The serial reference: values, and for each failed var the id of the op
  // whose exception it carries. An op takes the failure of the first failed
  // var it reads (its vars in the engine's order: writes, then other reads).
  struct Result {
    std::vector<std::uint64_t> state;
    std::vector<int> origin;    // -1: not failed
    std::vector<int> failures;  // the ops that threw, in push order
  };
  Result serial() const {
    Result r{std::vector<std::uint64_t>(vars), std::vector<int>(vars, -1), {}};
    for (int v = 0; v < vars; ++v) r.state[v] = static_cast<std::uint64_t>(v);
    for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
      const Op& op = ops[i];
      int origin = -1;
      std::vector<int> order;
      for (int w : op.writes)
        if (std::find(order.begin(), order.end(), w) == order.end()) order.push_back(w);
      for (int v : order)
        if (origin < 0 && std::find(op.reads.begin(), op.reads.end(), v) != op.reads.end()) origin = r.origin[v];
      for (int v : op.reads)
        if (origin < 0) origin = r.origin[v];
      if (origin < 0 && op.throws) {
        origin = i;
        r.failures.push_back(i);
      }
      if (origin < 0) run(i, op, r.state.data());
      for (int w : op.writes) r.origin[w] = origin;
    }
    return r;
  }

  // Pushes every op to e and checks the outcome against serial().
  void check(Engine& e) const {
    Result want = serial();
    auto state = std::make_shared<std::vector<std::uint64_t>>(vars);
    for (int v = 0; v < vars; ++v) (*state)[v] = static_cast<std::uint64_t>(v);
    std::vector<Var> handles(vars);
    std::vector<Var> reads, writes;
    for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
      const Op& op = ops[i];
      reads.clear();
      writes.clear();
      for (int r : op.reads) reads.push_back(handles[r]);
      for (int w : op.writes) writes.push_back(handles[w]);
      e.push("stress op " + std::to_string(i), [i, &op, s = state.get()] { run(i, op, s->data()); }, reads, writes,
             cpu(op.device));
    }
    // Each waitall delivers the next failure in push order.
    std::vector<int> failures;
    for (;;) {
      try {
        e.waitall();
        break;
      } catch (const ValueError& err) {
        std::string what = err.what();
        auto at = what.find("injected failure ");
        REQUIRE(at != std::string::npos);
        failures.push_back(std::stoi(what.substr(at + 17)));
      }
    }
    CHECK(failures == want.failures);
    CHECK(*state == want.state);
    int mismatched = 0;
    for (int v = 0; v < vars; ++v) {
      std::string got = "none";
      try {
        e.wait_to_read(handles[v]);
      } catch (const ValueError& err) {
        got = err.what();
      }
      std::string expect = want.origin[v] < 0 ? "none" : "engine op 'stress op " + std::to_string(want.origin[v]) + "'";
      mismatched += got.find(expect) == std::string::npos;
    }
    CHECK(mismatched == 0);
  }
};

#if defined(__SANITIZE_THREAD__)
constexpr int stress_ops = 20'000;  // ThreadSanitizer runs ~10x slower
#else
constexpr int stress_ops = 100'000;
#endif

}  // namespace

TEST_CASE("engine: a random DAG of 100k ops over 3 devices matches serial execution") {
  RandomDag dag(stress_ops, 300, 3, 0, 1);
  SUBCASE("one worker per device") {
    Engine e(threaded(1));
    dag.check(e);
  }
  SUBCASE("two workers per device") {
    Engine e(threaded(2));
    dag.check(e);
  }
  SUBCASE("naive engine") {
    Engine e(naive());
    dag.check(e);
  }
}

TEST_CASE("engine: failures in a random DAG reach exactly the vars downstream of them") {
  RandomDag dag(stress_ops / 5, 200, 2, 997, 2);
  Engine e(threaded(2));
  dag.check(e);
  Engine n(naive());
  dag.check(n);
}

TEST_CASE("engine: pushes from several threads at once") {
  Engine e(threaded(1));
  Var shared;
  auto base = std::make_shared<std::int64_t>(0);
  e.push("init", [base] { *base = 7; }, {}, {shared}, cpu(1));
  constexpr int threads = 4, per_thread = 3000;
  std::vector<std::int64_t> totals(threads, 0);
  std::vector<Var> vars(threads);
  std::vector<std::thread> pushers;
  for (int t = 0; t < threads; ++t)
    pushers.emplace_back([&, t] {
      for (int i = 0; i < per_thread; ++i)
        e.push("accumulate", [&totals, base, t, i] { totals[t] = totals[t] * 3 % 1000003 + *base + i; }, {shared},
               {vars[t]}, cpu(t % 2));
    });
  for (auto& p : pushers) p.join();
  e.waitall();
  std::int64_t want = 0;
  for (int i = 0; i < per_thread; ++i) want = want * 3 % 1000003 + 7 + i;
  for (int t = 0; t < threads; ++t) CHECK(totals[t] == want);
}

TEST_CASE("engine: a read waits for the earlier write (RAW)") {
  Engine e(threaded());
  Var v;
  int x = 0, seen = -1;
  Clock::time_point write_end, read_start;
  e.push("write", [&] { std::this_thread::sleep_for(20ms); x = 1; write_end = Clock::now(); }, {}, {v}, cpu(0));
  e.push("read", [&] { read_start = Clock::now(); seen = x; }, {v}, {}, cpu(1));
  e.wait_to_read(v);
  CHECK(x == 1);
  e.waitall();
  CHECK(seen == 1);
  CHECK(read_start >= write_end);
}

TEST_CASE("engine: a write waits for the earlier reads (WAR)") {
  Engine e(threaded());
  Var v;
  int x = 0, seen_a = -1, seen_b = -1;
  e.push("read a", [&] { std::this_thread::sleep_for(20ms); seen_a = x; }, {v}, {}, cpu(0));
  e.push("read b", [&] { std::this_thread::sleep_for(20ms); seen_b = x; }, {v}, {}, cpu(1));
  e.push("write", [&] { x = 2; }, {}, {v}, cpu(2));
  e.wait_to_write(v);  // every read and write done
  CHECK(seen_a == 0);
  CHECK(seen_b == 0);
  CHECK(x == 2);
}

TEST_CASE("engine: writes happen in push order (WAW)") {
  Engine e(threaded());
  Var v;
  std::vector<int> order;
  for (int i = 0; i < 6; ++i)
    e.push("write", [&order, i] {
      if (i % 2 == 0) std::this_thread::sleep_for(5ms);
      order.push_back(i);
    }, {}, {v}, cpu(i % 3));
  e.wait_to_read(v);
  CHECK(order == std::vector<int>{0, 1, 2, 3, 4, 5});
}

TEST_CASE("engine: independent ops on two devices run at the same time") {
  Engine e(threaded());
  Var a, b;
  std::atomic<bool> a_started{false}, b_started{false};
  Clock::time_point a_start, a_end, b_start, b_end;
  // Each op waits (up to 2 s) for the other to start: if the engine ran them
  // one after the other, the intervals would not overlap.
  e.push("long a", [&] { a_start = Clock::now(); a_started = true; await_flag(b_started); a_end = Clock::now(); }, {},
         {a}, cpu(0));
  e.push("long b", [&] { b_start = Clock::now(); b_started = true; await_flag(a_started); b_end = Clock::now(); }, {},
         {b}, cpu(1));
  e.waitall();
  CHECK(a_start < b_end);
  CHECK(b_start < a_end);
}

TEST_CASE("engine: a chain of dependent ops does not starve other ops on its device") {
  Engine e(threaded());
  Var chain, other;
  std::atomic<int> chain_done{0};
  int chain_done_when_other_ran = -1;
  constexpr int links = 50;
  for (int i = 0; i < links; ++i)
    e.push("link", [&] {
      std::this_thread::sleep_for(2ms);
      chain_done.fetch_add(1);
    }, {chain}, {chain}, cpu(0));
  e.push("other", [&] { chain_done_when_other_ran = chain_done.load(); }, {}, {other}, cpu(0));
  e.waitall();
  CHECK(chain_done_when_other_ran >= 0);
  CHECK(chain_done_when_other_ran < links / 2);  // it ran soon after being pushed, not after the chain
}

TEST_CASE("engine: work that arrives just as workers and waiters fall asleep still wakes them") {
  // Idle workers and waiting threads spin for about 50 us, then sleep. Each
  // round lets them idle, or makes them wait, for a random 0-120 us first, so
  // the wake-ups race the going to sleep on every path; a lost wake-up hangs
  // here. Bounded by time, not rounds, to stay short under the sanitizers.
  Engine e(threaded(2));
  Var a, b;
  std::atomic<int> ran{0};
  int want = 0;
  std::mt19937 rng(7);
  auto random_us = [&] { return std::chrono::microseconds(rng() % 120); };
  auto end = Clock::now() + 1s;
  for (int round = 0; Clock::now() < end; ++round) {
    switch (round % 4) {
      case 0: {  // into an idle device, then waitall as the op finishes
        busy_for(random_us());
        e.push("one", [&ran, d = random_us()] { busy_for(d); ran.fetch_add(1); }, {}, {a}, cpu(0));
        want += 1;
        e.waitall();
        break;
      }
      case 1:  // two ops at once for the two sleeping workers of one device
        busy_for(random_us());
        e.push("left", [&ran] { ran.fetch_add(1); }, {}, {}, cpu(0));
        e.push("right", [&ran] { ran.fetch_add(1); }, {}, {}, cpu(0));
        want += 2;
        e.waitall();
        break;
      case 2: {  // a wait from a thread that exits as soon as it is woken
        e.push("slow", [&ran, d = random_us()] { busy_for(d); ran.fetch_add(1); }, {}, {b}, cpu(1));
        want += 1;
        std::thread([&] { e.wait_to_read(b); }).join();
        break;
      }
      case 3:  // a chain its worker keeps to itself, then an op beside it
        for (int i = 0; i < 8; ++i) e.push("link", [&ran] { ran.fetch_add(1); }, {a}, {a}, cpu(0));
        busy_for(random_us());
        e.push("beside", [&ran] { ran.fetch_add(1); }, {}, {b}, cpu(0));
        want += 9;
        e.waitall();
        break;
    }
  }
  CHECK(ran.load() == want);
}

TEST_CASE("engine: an op pushed from inside an op can start on another worker of the device") {
  // The pushing op waits for the pushed one: held back for the pushing worker
  // to run next, it could not start until the wait gave up.
  Engine e(threaded(2));
  Var v;
  std::atomic<bool> inner_ran{false};
  bool saw_inner = false;
  e.push("outer", [&] {
    e.push("inner", [&] { inner_ran = true; }, {}, {}, cpu(0));
    saw_inner = await_flag(inner_ran);
  }, {}, {v}, cpu(0));
  e.waitall();
  CHECK(saw_inner);
}

TEST_CASE("engine: readers of one var run at the same time") {
  Engine e(threaded());
  Var v;
  std::atomic<bool> one{false}, two{false};
  bool saw_two = false, saw_one = false;
  e.push("reader 1", [&] { one = true; saw_two = await_flag(two); }, {v}, {}, cpu(0));
  e.push("reader 2", [&] { two = true; saw_one = await_flag(one); }, {v}, {}, cpu(1));
  e.waitall();
  CHECK(saw_one);
  CHECK(saw_two);
}

TEST_CASE("engine: an op's exception reaches the ops downstream and every wait") {
  Engine e(threaded());
  Var a, b, c, unrelated;
  bool downstream_ran = false, unrelated_ran = false;
  e.push("bad matmul", [] { fail<ShapeError>("shapes (2, 3) and (4, 5) do not match"); }, {}, {a}, cpu(0));
  e.push("uses a", [&] { downstream_ran = true; }, {a}, {b}, cpu(1));
  e.push("uses b in place", [&] { downstream_ran = true; }, {b}, {b, c}, cpu(0));
  e.push("fine", [&] { unrelated_ran = true; }, {}, {unrelated}, cpu(1));

  for (const Var* v : {&a, &b, &c}) {
    CHECK_THROWS_WITH_AS(e.wait_to_read(*v),
                         doctest::Contains("engine op 'bad matmul' on cpu(0) failed: shapes (2, 3) and (4, 5) do not match"),
                         ShapeError);
  }
  CHECK_THROWS_AS(e.wait_to_write(a), ShapeError);
  CHECK_FALSE(downstream_ran);  // the waits above covered both downstream ops
  e.waitall();                  // the failure was delivered by the waits above
  CHECK(unrelated_ran);

  SUBCASE("waitall delivers a failure nobody waited for, once") {
    e.push("bad op", [] { throw std::runtime_error("not a hybra error"); }, {}, {}, cpu(0));
    CHECK_THROWS_WITH_AS(e.waitall(), doctest::Contains("engine op 'bad op' on cpu(0) failed: not a hybra error"),
                         Error);
    e.waitall();
  }
  SUBCASE("two failures are delivered by two waitalls, in push order") {
    // "first" fails last: push order, not the order of failing, decides.
    e.push("first", [] {
      std::this_thread::sleep_for(20ms);
      throw 42;
    }, {}, {}, cpu(0));
    e.push("second", [] { fail<ValueError>("bad value"); }, {}, {}, cpu(1));
    CHECK_THROWS_WITH_AS(e.waitall(), doctest::Contains("engine op 'first' on cpu(0) failed: an exception that is not"),
                         Error);
    CHECK_THROWS_WITH_AS(e.waitall(), doctest::Contains("'second'"), ValueError);
    e.waitall();
  }
  SUBCASE("the engine keeps working and a fresh write clears the failure") {
    int x = 0;
    e.push("overwrite a", [&] { x = 5; }, {}, {a}, cpu(1));
    e.wait_to_read(a);
    CHECK(x == 5);
    e.push("read a", [&] { x += 1; }, {a}, {b}, cpu(0));
    e.wait_to_read(b);
    CHECK(x == 6);
    // c was written in place by a failed op; updating it in place keeps the failure.
    e.push("update c in place", [&] { x = 100; }, {c}, {c}, cpu(0));
    CHECK_THROWS_WITH_AS(e.wait_to_read(c), doctest::Contains("'bad matmul'"), ShapeError);
    CHECK(x == 6);
  }
}

TEST_CASE("engine: a failure cleared by a fresh write stops propagating, even in naive mode") {
  Engine e(naive());
  Var a, b;
  e.push("bad", [] { fail<ValueError>("boom"); }, {}, {a});
  CHECK_THROWS_WITH_AS(e.wait_to_read(a), doctest::Contains("engine op 'bad' on cpu(0) failed: boom"), ValueError);
  int x = 0;
  e.push("fresh", [&] { x = 1; }, {}, {a});
  e.push("reader", [&] { x += 1; }, {a}, {b});
  CHECK(x == 2);  // naive: each push ran before returning
  e.wait_to_read(b);
  e.waitall();
}

TEST_CASE("engine: waiting inside an op is refused, and the refusal is delivered like any failure") {
  Engine e(threaded());
  Var a, b;
  e.push("waits", [&] { e.wait_to_read(a); }, {}, {b}, cpu(0));
  CHECK_THROWS_WITH_AS(e.wait_to_read(b), doctest::Contains("wait_to_read: called inside engine op 'waits'"), Error);
  e.push("waits for all", [&] { e.waitall(); }, {}, {b}, cpu(0));
  CHECK_THROWS_WITH_AS(e.wait_to_read(b), doctest::Contains("waitall: called inside engine op 'waits for all'"), Error);
}

TEST_CASE("engine: shutdown with work pending runs it all, without deadlock") {
  std::atomic<int> ran{0};
  Var keep;
  {
    Engine e(threaded(2));
    Var chain;
    for (int i = 0; i < 2000; ++i)
      e.push("pending", [&ran, i] {
        if (i % 500 == 0) std::this_thread::sleep_for(10ms);
        ran.fetch_add(1);
      }, {}, {i % 2 ? chain : keep}, cpu(i % 3));
    // An op running during the drain may still push: that is pending work too.
    e.push("pushes more", [&] { e.push("pushed while draining", [&ran] { ran.fetch_add(1); }, {}, {keep}, cpu(1)); },
           {}, {chain}, cpu(0));
  }  // ~Engine
  CHECK(ran.load() == 2001);
}

TEST_CASE("engine: push after shutdown throws; waits still answer") {
  for (Options o : {threaded(), naive()}) {
    Engine e(o);
    Var v;
    int x = 0;
    e.push("before", [&] { x = 1; }, {}, {v}, cpu(0));
    e.shutdown();
    CHECK(x == 1);
    CHECK_THROWS_WITH_AS(e.push("after", [&] { x = 2; }, {}, {v}, cpu(0)),
                         doctest::Contains("engine: op 'after' pushed after the engine was shut down"), Error);
    e.wait_to_read(v);
    e.waitall();
    e.shutdown();  // twice is harmless
    CHECK(x == 1);
  }
}

TEST_CASE("engine: vars and captures outlive their handles while ops are pending") {
  Engine e(threaded());
  std::weak_ptr<std::vector<int>> watch;
  std::atomic<bool> release{false};
  std::vector<int> out;
  Var result;
  {
    Var a, b;  // the only user handles, released below while the ops still wait
    auto data = std::make_shared<std::vector<int>>(1000, 1);
    watch = data;
    e.push("slow", [&release] { await_flag(release); }, {}, {a}, cpu(0));
    e.push("scale", [data] { for (int& x : *data) x *= 3; }, {a}, {b}, cpu(1));
    e.push("copy", [data, &out] { out = *data; }, {b}, {result}, cpu(0));
  }
  CHECK_FALSE(watch.expired());  // the pending ops hold it
  Var alias = result;
  CHECK(alias == result);  // copies name the same state
  CHECK_FALSE(alias == Var());
  release = true;
  e.wait_to_read(result);
  CHECK(out == std::vector<int>(1000, 3));
  e.waitall();
  CHECK(watch.expired());  // released once the ops finished
}

TEST_CASE("engine: a closure too big for the op record still runs and is freed") {
  Engine e(threaded());
  Var v;
  auto token = std::make_shared<int>(0);
  std::array<std::int64_t, engine::detail::Task::inline_size / sizeof(std::int64_t) + 1> big{};
  big.back() = 41;
  std::int64_t got = 0;
  e.push("big closure", [big, token, &got] { got = big.back() + 1; }, {}, {v}, cpu(0));
  e.wait_to_read(v);
  e.waitall();
  CHECK(got == 42);
  CHECK(token.use_count() == 1);
}

TEST_CASE("engine: naive mode runs each op on the pushing thread before push returns") {
  Engine e(naive());
  CHECK(e.type() == EngineType::naive);
  Var v;
  std::thread::id ran_on;
  int x = 0;
  e.push("here", [&] { ran_on = std::this_thread::get_id(); x = 3; }, {}, {v}, cpu(1));
  CHECK(x == 3);
  CHECK(ran_on == std::this_thread::get_id());
  e.set_type(EngineType::threaded);
  e.push("there", [&] { ran_on = std::this_thread::get_id(); x = 4; }, {v}, {v}, cpu(1));
  e.wait_to_read(v);
  CHECK(x == 4);
  CHECK(ran_on != std::this_thread::get_id());
}

TEST_CASE("engine: a brief op runs on the pushing thread when nothing it needs is pending, else on a worker") {
  using engine::OpLength;
  Engine e(threaded());
  const auto here = std::this_thread::get_id();
  Var a, b;
  std::thread::id ran_on;
  int x = 0;
  e.push("brief", [&] { ran_on = std::this_thread::get_id(); x = 1; }, {}, {a}, cpu(0), OpLength::brief);
  CHECK(x == 1);  // before push returned
  CHECK(ran_on == here);

  // Behind a pending write: queued, and run by the worker.
  std::atomic<bool> go{false};
  e.push("slow", [&] { await_flag(go); }, {}, {b}, cpu(0));
  e.push("brief after slow", [&] { ran_on = std::this_thread::get_id(); x = 2; }, {b}, {a}, cpu(0), OpLength::brief);
  CHECK(x == 1);
  go = true;
  e.wait_to_read(a);
  CHECK(x == 2);
  CHECK(ran_on != here);

  // A failure is kept on the var and delivered by the wait, as for any op.
  e.push("brief failure", [] { throw ValueError("no"); }, {}, {a}, cpu(0), OpLength::brief);
  CHECK_THROWS_WITH_AS(e.wait_to_read(a), "engine op 'brief failure' on cpu(0) failed: no", ValueError);

  // With a second CPU device in use, every op stays on its device's worker.
  e.push("on cpu(1)", [] {}, {}, {b}, cpu(1));
  e.push("brief, two devices", [&] { ran_on = std::this_thread::get_id(); x = 3; }, {}, {a}, cpu(0), OpLength::brief);
  e.wait_to_read(a);
  CHECK(x == 3);
  CHECK(ran_on != here);
}

TEST_CASE("engine: a sleeping worker is woken by a brief op run on the pushing thread, and helps the next") {
  using engine::OpLength;
  Engine e(threaded());
  Var v;
  e.push("start the device", [] {}, {}, {v}, cpu(0));
  e.waitall();
  std::this_thread::sleep_for(20ms);  // far past the worker's spin: it sleeps
  const auto here = std::this_thread::get_id();
  bool helped = false;
  // Each round wakes the worker with one brief op, then posts two chunks from
  // another; the first chunk holds on for a while for a helper to start the
  // second. A worker never woken (nothing is queued) would never help.
  for (int round = 0; round < 100 && !helped; ++round) {
    e.push("wake", [] {}, {}, {v}, cpu(0), OpLength::brief);
    std::array<std::thread::id, 2> ran_on{};
    std::atomic<int> started{0};
    auto chunk = [&](int c) {
      ran_on[static_cast<std::size_t>(c)] = std::this_thread::get_id();
      if (++started == 1) {
        const auto end = Clock::now() + 20ms;
        while (started.load() < 2 && Clock::now() < end) std::this_thread::yield();
      }
    };
    e.push("post", [&] { engine::detail::help_board().run(2, chunk); }, {}, {v}, cpu(0), OpLength::brief);
    helped = ran_on[0] != here || ran_on[1] != here;
  }
  CHECK(helped);
}

TEST_CASE("engine: HYBRA_ENGINE_TYPE chooses the engine type") {
  const char* saved = std::getenv("HYBRA_ENGINE_TYPE");
  std::string restore = saved ? saved : "";
  ::setenv("HYBRA_ENGINE_TYPE", "NaiveEngine", 1);
  CHECK(Options::from_env().type == EngineType::naive);
  CHECK(Engine().type() == EngineType::naive);
  ::setenv("HYBRA_ENGINE_TYPE", "ThreadedEnginePerDevice", 1);
  CHECK(Options::from_env().type == EngineType::threaded);
  ::setenv("HYBRA_ENGINE_TYPE", "Fast", 1);
  CHECK_THROWS_WITH_AS(Options::from_env(), doctest::Contains("HYBRA_ENGINE_TYPE=Fast is not an engine type"),
                       ValueError);
  if (saved)
    ::setenv("HYBRA_ENGINE_TYPE", restore.c_str(), 1);
  else
    ::unsetenv("HYBRA_ENGINE_TYPE");
}

TEST_CASE("engine: each CPU device in use gets its share of the cores") {
  for (Options o : {threaded(1, 8), naive()}) {
    o.cpu_threads = 8;
    Engine e(o);
    Var v;
    std::vector<int> seen;
    auto record = [&](Device d) {  // the share is taken when the op runs
      e.push("threads", [&seen] { seen.push_back(engine::current_device_threads()); }, {v}, {v}, d);
      e.wait_to_read(v);
    };
    record(cpu(0));  // alone: every core
    record(cpu(2));  // two devices: half each
    record(cpu(0));
    record(cpu(5));  // three: 3, 3, 2
    record(cpu(0));
    record(cpu(2));
    record(cpu(5));
    CHECK(seen == std::vector<int>{8, 4, 4, 2, 3, 3, 2});
    CHECK(e.device_threads(cpu(7)) == 2);  // a fourth device would get 2 of 8
  }
  Engine two_workers(threaded(2, 8));
  Var v;
  int seen = 0;
  two_workers.push("threads", [&] { seen = engine::current_device_threads(); }, {}, {v}, cpu(0));
  two_workers.wait_to_read(v);
  CHECK(seen == 4);  // the device's 8 split between its 2 workers
  CHECK(engine::current_device_threads() >= 1);
}

TEST_CASE("engine: bad pushes are refused with the op's name") {
  Engine e(threaded());
  Var v, moved;
  Var taken = std::move(moved);
  CHECK_THROWS_WITH_AS(e.push("gemm", [] {}, {}, {v}, cuda(0)),
                       doctest::Contains("engine: op 'gemm' pushed to cuda(0)"), DeviceError);
  CHECK_THROWS_WITH_AS(e.push("gemm", [] {}, {}, {v}, cpu(64)), doctest::Contains("cpu(0) to cpu(63)"), DeviceError);
  CHECK_THROWS_WITH_AS(e.push("gemm", [] {}, {moved}, {v}), doctest::Contains("op 'gemm' was given an empty"),
                       ValueError);
  CHECK_THROWS_AS(e.wait_to_read(moved), ValueError);
  int x = 0;
  e.push("still fine", [&] { x = 1; }, {v, v, taken}, {v, v});  // duplicates are one read-write access
  e.wait_to_read(v);
  CHECK(x == 1);
  e.waitall();
}

namespace {
// A GPU side that runs each op at once and notes what the engine asked of it.
struct NotingFence final : engine::Fence {
  NotingFence(int id, std::atomic<int>& waits) : id(id), waits(waits) {}
  int gpu() const override { return id; }
  void wait() const override { ++waits; }
  int id;
  std::atomic<int>& waits;
};
struct NotingGpuWork final : engine::GpuWork {
  void require(int id) override {
    if (id != 0) fail<DeviceError>("only cuda(0) here");
  }
  engine::FencePtr run(int id, std::string_view op, std::span<const engine::FencePtr> after,
                       engine::detail::Task& fn) override {
    fn();
    std::lock_guard g(mutex);
    ran.emplace_back(op);
    waited_on_stream += static_cast<int>(after.size());
    return std::make_shared<NotingFence>(id, waits);
  }
  void drain_at_exit(void (*)()) override {}
  std::mutex mutex;
  std::vector<std::string> ran;
  int waited_on_stream = 0;
  std::atomic<int> waits{0};
};
}  // namespace

TEST_CASE("engine: GPU ops go through the engine's own interface to the GPUs, and without one are refused") {
  engine::GpuWork* const registered = engine::gpu_work();
  NotingGpuWork gpus;
  engine::gpu_work_slot().store(&gpus);
  {
    Engine e(threaded());
    Var v;
    int x = 0;
    e.push("on the gpu", [&] { x = 1; }, {}, {v}, cuda(0));
    e.push("after it", [&] { x += 1; }, {v}, {v}, cuda(0));
    e.wait_to_read(v);  // the host waits for the fence of the last op
    CHECK(x == 2);
    CHECK(gpus.ran == std::vector<std::string>{"on the gpu", "after it"});
    CHECK(gpus.waited_on_stream == 1);  // the second op was handed the first's fence
    CHECK(gpus.waits.load() >= 1);
    CHECK_THROWS_WITH_AS(e.push("far away", [] {}, {}, {v}, cuda(1)),
                         doctest::Contains("engine: op 'far away' pushed to cuda(1): only cuda(0) here"), DeviceError);
    e.waitall();
  }
  engine::gpu_work_slot().store(nullptr);
  {
    Engine e(threaded());
    Var v;
    CHECK_THROWS_WITH_AS(e.push("lost", [] {}, {}, {v}, cuda(0)),
                         doctest::Contains("op 'lost' pushed to cuda(0): this program has no GPU backend"), DeviceError);
  }
  engine::gpu_work_slot().store(registered);
}

TEST_CASE("engine: the global engine") {
  Engine& e = engine::get();
  CHECK(&e == &engine::get());
  Var v;
  int x = 0;
  e.push("global", [&] { x = 9; }, {}, {v});
  e.wait_to_read(v);
  CHECK(x == 9);
}

TEST_CASE("engine: a thread spinning in help() takes the chunks a post leaves") {
  engine::detail::HelpBoard board;
  std::atomic<bool> stop{false};
  std::thread helper([&] {
    while (!stop.load()) board.help();
  });
  std::array<std::thread::id, 2> ran_on{};
  std::array<std::atomic<int>, 2> runs{};
  std::atomic<int> started{0};
  auto body = [&](int c) {
    ran_on[static_cast<std::size_t>(c)] = std::this_thread::get_id();
    ++runs[static_cast<std::size_t>(c)];
    // The first chunk to start holds on until the other has started, which
    // only another thread can do (if none helps, the wait gives up and the
    // poster runs the other chunk itself: the checks below then fail).
    if (++started == 1) {
      const auto end = Clock::now() + 5s;
      while (started.load() < 2 && Clock::now() < end) std::this_thread::yield();
    }
  };
  board.run(2, body);
  stop = true;
  const std::thread::id helper_id = helper.get_id();
  helper.join();
  CHECK(runs[0] == 1);
  CHECK(runs[1] == 1);
  CHECK(ran_on[0] != ran_on[1]);
  for (const auto& id : ran_on) CHECK((id == std::this_thread::get_id() || id == helper_id));
}

TEST_CASE("engine: every chunk runs once, with or without helpers and with posts from several threads") {
  engine::detail::HelpBoard board;
  {
    std::array<std::atomic<int>, 5> runs{};
    auto body = [&](int c) { ++runs[static_cast<std::size_t>(c)]; };
    board.run(5, body);  // no helper: all on the poster
    for (auto& r : runs) CHECK(r == 1);
  }
  std::atomic<bool> stop{false};
  std::thread helper([&] {
    while (!stop.load()) board.help();
  });
  constexpr int posts = 2000, chunks = 4;
  std::vector<std::atomic<int>> runs(2 * posts * chunks);
  auto poster = [&](int first) {
    for (int p = 0; p < posts; ++p) {
      auto body = [&, p](int c) { ++runs[static_cast<std::size_t>(((first + p) * chunks) + c)]; };
      board.run(chunks, body);  // a post made while the other thread's is in progress runs alone
    }
  };
  std::thread other(poster, posts);
  poster(0);
  other.join();
  stop = true;
  helper.join();
  CHECK(std::all_of(runs.begin(), runs.end(), [](const std::atomic<int>& r) { return r.load() == 1; }));
}

TEST_CASE("engine: a thread in an engine wait's spin runs posted chunks; a split GEMV gives single-thread bits") {
  // 256 x 512 floats: big enough that gemv posts its second half.
  constexpr std::int64_t N = 256, K = 512;
  static_assert(N * K * sizeof(float) >= backend::cpu::gemv_help_bytes);
  std::vector<float> w(N * K), x(K), alone(N), split(N);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i % 13) * 0.25f - 1.5f;
  for (std::size_t k = 0; k < x.size(); ++k) x[k] = static_cast<float>(k % 7) * 0.5f - 1;
  backend::cpu::gemv_rows(w.data(), K, x.data(), alone.data(), N, K, 1, 0, N);

  // The spin every engine wait uses (Waiter::wait, an idle worker, waitall).
  std::atomic<bool> done{false};
  std::thread waiter([&] {
    while (!engine::detail::spin_helping_until([&] { return done.load(); })) {
    }
  });
  const std::thread::id waiter_id = waiter.get_id();
  std::array<std::thread::id, 2> ran_on{};
  std::atomic<int> started{0};
  auto half = [&](int c) {
    ran_on[static_cast<std::size_t>(c)] = std::this_thread::get_id();
    backend::cpu::gemv_rows(w.data(), K, x.data(), split.data(), N, K, 1, c == 0 ? 0 : N / 2, c == 0 ? N / 2 : N);
    if (++started == 1) {  // hold on until another thread has the other half
      const auto end = Clock::now() + 5s;
      while (started.load() < 2 && Clock::now() < end) std::this_thread::yield();
    }
  };
  engine::detail::help_board().run(2, half);
  done = true;
  waiter.join();
  CHECK((ran_on[0] == waiter_id || ran_on[1] == waiter_id));
  CHECK(split == alone);

  // gemv inside an op, split whenever a waiting caller takes the half.
  Engine e(threaded());
  Var v;
  for (int round = 0; round < 50; ++round) {
    std::fill(split.begin(), split.end(), 0.0f);
    e.push("gemv", [&] { backend::cpu::gemv(w.data(), K, x.data(), split.data(), N, K); }, {}, {v});
    e.wait_to_read(v);
    CHECK(split == alone);
  }
}

TEST_CASE("engine: a parallel region of every core, and its team's idle spin after it, make waits yield at once") {
  using engine::detail::ParallelRegion;
  const int cores = engine::detail::hardware_threads();
  constexpr std::chrono::milliseconds idle{5};
  const auto settings_idle = backend::cpu::idle_spin_after_region();
  if (settings_idle > 1s) {
    MESSAGE("OMP_WAIT_POLICY or GOMP_SPINCOUNT makes libgomp's idle threads spin for ", settings_idle.count(), " ns");
    return;
  }
  // Every region before this case, and the team's spin after it, is over.
  auto quiet = [&] { std::this_thread::sleep_for(2 * std::max<std::chrono::nanoseconds>(idle, settings_idle)); };
  quiet();
  CHECK_FALSE(ParallelRegion::cores_taken());
  {
    const ParallelRegion fewer(cores - 1, idle);  // leaves a core to a spinner (none at all on one core)
    CHECK_FALSE(ParallelRegion::cores_taken());
  }
  CHECK_FALSE(ParallelRegion::cores_taken());
  std::optional<ParallelRegion> every(std::in_place, cores, idle);
  CHECK(ParallelRegion::cores_taken());
  const auto before_end = Clock::now();
  every.reset();
  const bool idle_spin_seen = ParallelRegion::cores_taken();
  // Its members spin idle a while after it: within `idle` of its end (a descheduled test thread may miss it).
  if (Clock::now() - before_end < idle) CHECK(idle_spin_seen);
  quiet();
  CHECK_FALSE(ParallelRegion::cores_taken());
  {
    // A team that sleeps as soon as its region ends (OMP_WAIT_POLICY=passive) leaves the cores to waits at once.
    const ParallelRegion sleeps_after(cores, std::chrono::nanoseconds{0});
    CHECK(ParallelRegion::cores_taken());
  }
  CHECK_FALSE(ParallelRegion::cores_taken());
  // parallel_for marks its team: every range sees the mark where there is a team (a range a thread).
  std::atomic<int> ranges{0}, marked{0};
  backend::cpu::parallel_for(cores, backend::cpu::parallel_grain, [&](std::int64_t, std::int64_t) {
    ++ranges;
    if (ParallelRegion::cores_taken()) ++marked;
  });
  CHECK(marked.load() == (ranges.load() > 1 ? ranges.load() : 0));
  if (ranges.load() > 1) CHECK(ranges.load() == cores);
}
