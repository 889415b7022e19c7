// Asynchronous computation (D2L 13.2): every eager op returns a Tensor that
// is a future. The calling thread (the front end) validates the op, allocates
// its result and queues it on the dependency engine, whose worker thread (the
// back end) computes it later; only a sync point (wait_to_read, waitall,
// to_vector, item, printing) makes the front end wait.
//
//  (a) A chain of 10 matrix products: the loop that queues them returns long
//      before the products are done.
//  (b) 1000 ops y = x + 1 on a 512x512 tensor. In D2L's terms each costs t1
//      (the front end checks it, allocates its result and queues it) + t2
//      (the back end, the engine's worker, runs it) + t3 (the result is
//      handed back to a waiting caller). Waiting after every op pays all
//      three, in series, 1000 times; with one waitall() at the end the front
//      end runs ahead while the worker computes, every queued op's result
//      alive meanwhile. NaiveEngine (every op run on the calling thread, no
//      queue) is the baseline without an engine.
//  (c) The same 1000 ops on an 8x8 tensor. A kernel this small is brief: it
//      runs on the calling thread before its call returns, as a hand-off to
//      the worker and back would cost more than the add, so waiting after
//      every op costs no more than one waitall().
//
//   async           n = 2000 float32 matrices (median of 3 runs), 1000 ops of
//                   each size (median of 5 runs)
//   async --smoke   n = 128, 100 ops of each size, one run; checks the
//                   asynchronous results against a synchronous (NaiveEngine)
//                   recomputation
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <hybra/hybra.hpp>
#include <vector>

#include "../common/command_line.hpp"

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// y = x^k y for k = 1..steps, each product queued as soon as the previous
// one is (it depends on it through y's storage). Returns the last y.
hybra::Tensor matmul_chain(const hybra::Tensor& x, hybra::Tensor y, int steps) {
  for (int i = 0; i < steps; ++i) y = hybra::matmul(x, y);
  return y;
}

double max_abs_diff(const hybra::Tensor& a, const hybra::Tensor& b) {
  auto u = a.to_vector<double>(), v = b.to_vector<double>();
  double worst = u.size() == v.size() ? 0 : INFINITY;
  for (std::size_t i = 0; i < std::min(u.size(), v.size()); ++i) worst = std::max(worst, std::abs(u[i] - v[i]));
  return worst;
}

int main(int argc, char** argv) {
  const bool smoke = example::smoke_run(argc, argv,
      "async: asynchronous computation (D2L 13.2). A chain of 10 products of 2000x2000 float32 matrices\n"
      "(median of 3 runs) and 1000 adds on a 512x512 and on an 8x8 tensor (median of 5 runs), waiting after each\n"
      "op and once at the end, on the engine and on NaiveEngine.",
      "n = 128, 100 adds of each size, one run; checks the asynchronous results against NaiveEngine's");
  const std::int64_t n = smoke ? 128 : 2000;
  const int steps = 10, ops = smoke ? 100 : 1000, runs = smoke ? 1 : 5, big_runs = smoke ? 1 : 3;
  auto& engine = hybra::engine::get();
  const bool naive_env = engine.type() == hybra::engine::EngineType::naive;
  std::printf("engine: %s, %d cores\n", naive_env ? "NaiveEngine (synchronous)" : "ThreadedEnginePerDevice",
              hybra::engine::current_device_threads());

  // ---- (a) queueing vs finishing ------------------------------------------
  // N(0, 1/n) entries keep the chain's values near 1 in size.
  hybra::Tensor x = hybra::random_normal({n, n}, 0, 1 / std::sqrt(double(n)));
  hybra::Tensor y0 = hybra::random_normal({n, n});
  hybra::waitall();
  matmul_chain(x, y0, 1).wait_to_read();  // warm-up: OpenBLAS's threads, page faults

  std::vector<double> queued_ms, done_ms;
  hybra::Tensor y;
  for (int r = 0; r < big_runs; ++r) {
    auto start = Clock::now();
    y = matmul_chain(x, y0, steps);
    queued_ms.push_back(ms_since(start));
    y.wait_to_read();  // the last product depends on all the others
    done_ms.push_back(ms_since(start));
  }
  const double queued = median(queued_ms), done = median(done_ms);
  std::printf("\n(a) %d chained matmuls of %lldx%lld float32\n", steps, static_cast<long long>(n),
              static_cast<long long>(n));
  std::printf("    loop returned after   %9.3f ms\n", queued);
  std::printf("    wait_to_read returned %9.3f ms   (%.0fx the time to queue)\n", done, done / queued);

  // ---- (b), (c): 1000 adds, waiting after each or once ---------------------
  struct PerOp {
    double wait_each, one_waitall, front_end, naive;  // us per op
  };
  auto time_adds = [&](const hybra::Tensor& x) {
    hybra::Tensor out;
    auto per_op_us = [&](auto&& loop) {
      std::vector<double> us;
      for (int r = 0; r < runs; ++r) {
        hybra::waitall();
        auto start = Clock::now();
        loop();
        us.push_back(ms_since(start) * 1000 / ops);
      }
      return median(us);
    };
    PerOp t{};
    t.wait_each = per_op_us([&] {
      for (int i = 0; i < ops; ++i) {
        out = x + 1;
        out.wait_to_read();
      }
    });
    std::vector<double> front_us;
    t.one_waitall = per_op_us([&] {
      auto start = Clock::now();
      for (int i = 0; i < ops; ++i) out = x + 1;
      front_us.push_back(ms_since(start) * 1000 / ops);
      hybra::waitall();
    });
    t.front_end = median(front_us);
    const auto type = engine.type();
    engine.set_type(hybra::engine::EngineType::naive);
    t.naive = per_op_us([&] {
      for (int i = 0; i < ops; ++i) out = x + 1;
    });
    engine.set_type(type);
    return t;
  };
  const hybra::Tensor large = hybra::ones({512, 512}), small = hybra::ones({8, 8});
  const PerOp b = time_adds(large), c = time_adds(small);

  std::printf("\n(b) %d ops y = x + 1 on a 512x512 float32 tensor (1 MiB each way: queued), us per op\n", ops);
  std::printf("    wait_to_read after every op          %8.2f us   queue, compute, hand back, in series\n", b.wait_each);
  std::printf("    one waitall() at the end             %8.2f us\n", b.one_waitall);
  std::printf("      the loop alone (front end)         %8.2f us   the caller ran ahead of the worker\n", b.front_end);
  std::printf("    NaiveEngine (on the calling thread)  %8.2f us   no queue, no worker\n", b.naive);
  std::printf("\n(c) %d ops y = x + 1 on an 8x8 float32 tensor (256 bytes each way: brief), us per op\n", ops);
  std::printf("    wait_to_read after every op          %8.2f us   each ran before its call returned\n", c.wait_each);
  std::printf("    one waitall() at the end             %8.2f us\n", c.one_waitall);
  std::printf("    NaiveEngine (on the calling thread)  %8.2f us\n", c.naive);

  // ---- check: the same work done synchronously gives the same values --------
  // (set_type waits for pending work, then runs every op on this thread.)
  hybra::Tensor y_sync = matmul_chain(x, y0, steps);
  hybra::Tensor chain_sync = small;
  for (int i = 0; i < ops; ++i) chain_sync = chain_sync + 1;
  engine.set_type(naive_env ? hybra::engine::EngineType::naive : hybra::engine::EngineType::threaded);
  hybra::Tensor chain = small;
  for (int i = 0; i < ops; ++i) chain = chain + 1;  // 1000 dependent ops
  const double diff_mm = max_abs_diff(y, y_sync), diff_chain = max_abs_diff(chain, chain_sync);
  const bool ok = diff_mm <= 1e-4 && diff_chain == 0 && chain.to_vector<float>()[0] == 1 + ops;

  std::printf("\nasync vs synchronous results: matmul chain max |diff| %.1e, %d-op chain max |diff| %.1e: %s\n",
              diff_mm, ops, diff_chain, ok ? "agree" : "DIFFER");
  if (naive_env) {
    std::printf("\n(NaiveEngine: every op ran before its call returned, so the rows above all measure\n"
                "synchronous execution; run without HYBRA_ENGINE_TYPE to see the asynchronous engine.)\n");
  } else if (!smoke) {
    std::printf(
        "\nWhat this shows:\n"
        "(a) Queuing ten products took %.2f ms of the caller's time; the caller was free for the\n"
        "    other %.0f ms while the engine's worker multiplied. Only wait_to_read() waited.\n"
        "(b) With one waitall() the caller queued each 1 MiB add in %.2f us while the worker took\n"
        "    about %.0f us to compute it: the caller was free for the rest, up to %d results ahead.\n"
        "    Waiting after every op took %.1f us/op: at this size the round trip is lost in the op's time.\n"
        "(c) An 8x8 add is brief: it ran on the calling thread, so waiting after each (%.2f us/op) cost\n"
        "    no round trip, against NaiveEngine's %.2f us/op.\n",
        queued, done - queued, b.front_end, b.one_waitall, ops, b.wait_each, c.wait_each, c.naive);
  }
  return ok ? 0 : 1;
}
