// Asynchronous computation (D2L 13.2): every eager op returns a Tensor that
// is a future. The calling thread (the front end) validates the op, allocates
// its result and queues it on the dependency engine, whose worker thread (the
// back end) computes it later; only a sync point (wait_to_read, waitall,
// to_vector, item, printing) makes the front end wait.
//
//  (a) A chain of 10 matrix products: the loop that queues them returns long
//      before the products are done.
//  (b) 1000 tiny ops, y = x + 1. In D2L's terms each costs t1 (the front end
//      checks it, allocates its result and queues it) + t2 (the back end, the
//      engine's worker, runs it) + t3 (the result is handed back to a waiting
//      caller). Waiting after every op pays all three, in series, 1000 times;
//      with one waitall() at the end the front end runs ahead while the worker
//      computes: t1 + 1000 t2 + t3 when t2 > t1. NaiveEngine (every op run on
//      the calling thread, no queue) is the baseline without an engine.
//
//   async           n = 2000 float32 matrices (median of 3 runs), 1000 tiny ops
//                   (median of 5 runs)
//   async --smoke   n = 128, 100 tiny ops, one run; checks the asynchronous
//                   results against a synchronous (NaiveEngine) recomputation
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
      "(median of 3 runs) and 1000 tiny ops (median of 5 runs), waiting after each op and once at the end, on the\n"
      "engine and on NaiveEngine.",
      "n = 128, 100 tiny ops, one run; checks the asynchronous results against NaiveEngine's");
  const std::int64_t n = smoke ? 128 : 2000;
  const int steps = 10, tiny_ops = smoke ? 100 : 1000, runs = smoke ? 1 : 5, big_runs = smoke ? 1 : 3;
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

  // ---- (b) t1 + t2 + t3, 1000 times ---------------------------------------
  hybra::Tensor small = hybra::ones({8, 8});
  hybra::Tensor out;
  auto per_op_us = [&](auto&& loop) {
    std::vector<double> us;
    for (int r = 0; r < runs; ++r) {
      hybra::waitall();
      auto start = Clock::now();
      loop();
      us.push_back(ms_since(start) * 1000 / tiny_ops);
    }
    return median(us);
  };
  const double sync_each = per_op_us([&] {
    for (int i = 0; i < tiny_ops; ++i) {
      out = small + 1;
      out.wait_to_read();
    }
  });
  std::vector<double> front_us;
  const double async_all = per_op_us([&] {
    auto start = Clock::now();
    for (int i = 0; i < tiny_ops; ++i) out = small + 1;
    front_us.push_back(ms_since(start) * 1000 / tiny_ops);
    hybra::waitall();
  });
  const double front_only = median(front_us);
  engine.set_type(hybra::engine::EngineType::naive);
  const double naive = per_op_us([&] {
    for (int i = 0; i < tiny_ops; ++i) out = small + 1;
  });

  // D2L's notation: t1 = the front end queues the op, t2 = the back end runs
  // it, t3 = the result is handed back (the waiting caller is woken).
  const double t1 = front_only, t2 = std::max(async_all, t1), t3 = std::max(0.0, sync_each - t1 - t2);
  std::printf("\n(b) %d ops y = x + 1 on an 8x8 float32 tensor, us per op\n", tiny_ops);
  std::printf("    wait_to_read after every op          %7.2f us   t1 + t2 + t3, in series\n", sync_each);
  std::printf("    one waitall() at the end             %7.2f us   about max(t1, t2): they overlap\n", async_all);
  std::printf("      the loop alone (front end)         %7.2f us   t1\n", t1);
  if (async_all > 1.2 * t1)
    std::printf("      so the back end per op             %7.2f us   t2: the worker set the pace\n", t2);
  else
    std::printf("      so the back end per op            <=%6.2f us   t2: the front end set the pace\n", t2);
  std::printf("    left for the wake-ups                %7.2f us   t3 = wait-every-op - t1 - t2: the idle\n"
              "                                                    worker's, then the waiting caller's\n", t3);
  std::printf("    NaiveEngine (on the calling thread)  %7.2f us   no queue, no worker\n", naive);
  std::printf("    engine overhead per op: %.2f us of latency (wait-every-op - NaiveEngine),\n", sync_each - naive);
  std::printf("                            %.2f us of throughput (one-waitall - NaiveEngine)\n", async_all - naive);

  // ---- check: the same work done synchronously gives the same values --------
  // (set_type waits for pending work, then runs every op on this thread.)
  hybra::Tensor y_sync = matmul_chain(x, y0, steps);
  hybra::Tensor chain_sync = small;
  for (int i = 0; i < tiny_ops; ++i) chain_sync = chain_sync + 1;
  engine.set_type(naive_env ? hybra::engine::EngineType::naive : hybra::engine::EngineType::threaded);
  hybra::Tensor chain = small;
  for (int i = 0; i < tiny_ops; ++i) chain = chain + 1;  // 1000 dependent ops, queued at once
  const double diff_mm = max_abs_diff(y, y_sync), diff_chain = max_abs_diff(chain, chain_sync);
  const bool ok = diff_mm <= 1e-4 && diff_chain == 0 && chain.to_vector<float>()[0] == 1 + tiny_ops;

  std::printf("\nasync vs synchronous results: matmul chain max |diff| %.1e, %d-op chain max |diff| %.1e: %s\n",
              diff_mm, tiny_ops, diff_chain, ok ? "agree" : "DIFFER");
  if (naive_env) {
    std::printf("\n(NaiveEngine: every op ran before its call returned, so the rows above all measure\n"
                "synchronous execution; run without HYBRA_ENGINE_TYPE to see the asynchronous engine.)\n");
  } else if (!smoke) {
    std::printf(
        "\nWhat this shows:\n"
        "(a) Queuing ten products took %.2f ms of the caller's time; the caller was free for the\n"
        "    other %.0f ms while the engine's worker multiplied. Only wait_to_read() waited.\n"
        "(b) Waiting after every tiny op cost %.1f us/op, %.1f us more than running it on the calling\n"
        "    thread: the engine's round trip (wake the worker, then wake the caller), paid %d times\n"
        "    in series. With one waitall() at the end the caller queued at %.1f us/op while the worker\n"
        "    computed, and the loop cost %.1f us/op, %.1fx less than waiting every time.\n",
        queued, done - queued, sync_each, sync_each - naive, tiny_ops, front_only, async_all, sync_each / async_all);
    if (async_all > naive)
      std::printf(
          "    NaiveEngine is faster still for ops this small (%.1f us/op): the engine adds %.1f us/op\n"
          "    of bookkeeping, more than an 8x8 add costs, and %s sets the pace.\n"
          "    Asynchrony pays when ops cost more than that, or when the caller has other work to do\n"
          "    meanwhile, as in (a).\n",
          naive, async_all - naive, async_all > 1.2 * front_only ? "the worker, not the caller," : "the caller");
    else
      std::printf("    That is no slower than NaiveEngine (%.1f us/op): the engine's bookkeeping is hidden.\n", naive);
  }
  return ok ? 0 : 1;
}
