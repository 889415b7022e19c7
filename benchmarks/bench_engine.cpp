// bench_engine: what the dependency engine costs per op, and what two CPU
// devices buy. Figures in docs/benchmarks.md.
//
// Cases:
//   BM_push_overhead/<engine>/wait_each  push a 1-element in-place op (x += 1
//                                        on one var), then wait_to_read it:
//                                        the full round trip of one op
//   BM_push_overhead/<engine>/waitall    the same op pushed 1000 times, then
//                                        one waitall: the throughput of a
//                                        dependent chain
//   <engine> is hybra (threaded, one worker per device) or naive
//                                        (HYBRA_ENGINE_TYPE=NaiveEngine: the
//                                        bookkeeping without any thread handoff)
//   BM_two_workloads/serial              two independent 512x512 sgemm-like
//                                        loops, both pushed to cpu(0)
//   BM_two_workloads/parallel            the same two loops on cpu(0) and cpu(1)
//   BM_fused_2_24/engine                 relu(a * b + c) * d + 1 over 2^24 floats
//                                        as a Tensor assign: pushed to the
//                                        engine, then waited for
//   BM_fused_2_24/direct                 the same fused kernel called on the
//                                        calling thread, no engine
//   BM_eager_add/<n>                     an eager a + b over n floats, then
//                                        wait_to_read: from a brief op on the
//                                        caller (n = 2^16) to the worker's
//                                        team of every core, the caller
//                                        waiting beside it
//   BM_eager_add_sporadic/<ms>           the same over 2^17 floats, one call
//                                        every <ms> milliseconds: after the
//                                        team's idle spin (6 ms, libgomp's
//                                        default) or long after it (20 ms)
// Times are wall-clock per iteration (one op for BM_push_overhead and
// BM_eager_add, both loops for BM_two_workloads, one pass for BM_fused_2_24);
// BM_eager_add_sporadic times the call alone, not the sleep before it.
#include <benchmark/benchmark.h>

#include <hybra/hybra.hpp>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

namespace {

using hybra::cpu;
using hybra::engine::Engine;
using hybra::engine::EngineType;
using hybra::engine::Options;
using hybra::engine::Var;

void push_wait_each(benchmark::State& state, EngineType type) {
  Engine e(Options{type});
  Var v;
  float x = 0;
  for (auto _ : state) {
    e.push("increment", [&x] { x += 1; }, {v}, {v}, cpu(0));
    e.wait_to_read(v);
  }
  benchmark::DoNotOptimize(x);
  state.SetItemsProcessed(state.iterations());
}

void push_waitall(benchmark::State& state, EngineType type) {
  constexpr int batch = 1000;
  Engine e(Options{type});
  Var v;
  float x = 0;
  int pushed = 0;
  for (auto _ : state) {
    e.push("increment", [&x] { x += 1; }, {v}, {v}, cpu(0));
    if (++pushed == batch) {
      e.waitall();
      pushed = 0;
    }
  }
  e.waitall();
  benchmark::DoNotOptimize(x);
  state.SetItemsProcessed(state.iterations());
}

constexpr int n = 512;

// c = a * b, row by row with the k loop outside the j loop so the inner loop
// vectorises: about 0.27 GFLOP of plain compute per call.
struct Sgemm {
  std::vector<float> a = std::vector<float>(n * n, 0.5f), b = std::vector<float>(n * n, 0.25f),
                     c = std::vector<float>(n * n);
  void operator()() {
    for (int i = 0; i < n; ++i) {
      float* ci = c.data() + i * n;
      for (int j = 0; j < n; ++j) ci[j] = 0;
      for (int k = 0; k < n; ++k) {
        float aik = a[i * n + k];
        const float* bk = b.data() + k * n;
        for (int j = 0; j < n; ++j) ci[j] += aik * bk[j];
      }
    }
    benchmark::DoNotOptimize(c.data());
  }
};

void two_workloads(benchmark::State& state, bool parallel) {
  Engine e(Options{EngineType::threaded});
  auto first = std::make_shared<Sgemm>(), second = std::make_shared<Sgemm>();
  Var out1, out2;
  for (auto _ : state) {
    e.push("sgemm 1", [first] { (*first)(); }, {}, {out1}, cpu(0));
    e.push("sgemm 2", [second] { (*second)(); }, {}, {out2}, cpu(parallel ? 1 : 0));
    e.waitall();
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(4.0 * n * n * n * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}


// The engine's cost on real work: one fused pass over 2^24 floats pushed
// through the engine (and waited for), against the same kernel called on the
// calling thread. Both use every core.
constexpr std::int64_t fused_n = std::int64_t{1} << 24;

struct FusedBuffers {
  hybra::Tensor a = hybra::random_uniform({fused_n}, -2, 2), b = hybra::random_uniform({fused_n}, -2, 2),
                c = hybra::random_uniform({fused_n}, -2, 2), d = hybra::random_uniform({fused_n}, -2, 2),
                out = hybra::zeros({fused_n});
};

FusedBuffers& fused_buffers() {
  static FusedBuffers bufs;
  bufs.out.wait_to_write();
  return bufs;
}

void fused_pass(benchmark::State& state, bool through_engine) {
  FusedBuffers& B = fused_buffers();
  auto e = hybra::relu(B.a * B.b + B.c) * B.d + 1;
  const auto leaves = hybra::detail::tensor_leaves(e);
  auto pass = [&] {
    if (through_engine) {
      B.out.assign(e);
      B.out.wait_to_read();
    } else {
      hybra::detail::run_fused<float, float>(e, leaves, B.out);
    }
  };
  pass();  // warm up: page in, wake the thread team
  for (auto _ : state) pass();
  state.SetBytesProcessed(state.iterations() * 5 * fused_n * static_cast<std::int64_t>(sizeof(float)));
}

void eager_add(benchmark::State& state) {
  const hybra::Tensor a = hybra::random_normal({state.range(0)}), b = hybra::random_normal({state.range(0)});
  hybra::Tensor warm = a + b;  // the team woken, the result's memory kept
  warm.wait_to_read();
  for (auto _ : state) {
    hybra::Tensor sum = a + b;
    sum.wait_to_read();
  }
}

void eager_add_sporadic(benchmark::State& state) {
  const hybra::Tensor a = hybra::random_normal({1 << 17}), b = hybra::random_normal({1 << 17});
  hybra::Tensor warm = a + b;
  warm.wait_to_read();
  for (auto _ : state) {
    std::this_thread::sleep_for(std::chrono::milliseconds(state.range(0)));
    const auto start = std::chrono::steady_clock::now();
    hybra::Tensor sum = a + b;
    sum.wait_to_read();
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
}

}  // namespace

BENCHMARK_CAPTURE(push_wait_each, hybra, EngineType::threaded)->Name("BM_push_overhead/hybra/wait_each")->UseRealTime();
BENCHMARK_CAPTURE(push_waitall, hybra, EngineType::threaded)->Name("BM_push_overhead/hybra/waitall")->UseRealTime();
BENCHMARK_CAPTURE(push_wait_each, naive, EngineType::naive)->Name("BM_push_overhead/naive/wait_each")->UseRealTime();
BENCHMARK_CAPTURE(push_waitall, naive, EngineType::naive)->Name("BM_push_overhead/naive/waitall")->UseRealTime();
BENCHMARK_CAPTURE(two_workloads, serial, false)
    ->Name("BM_two_workloads/serial")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(two_workloads, parallel, true)
    ->Name("BM_two_workloads/parallel")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(fused_pass, engine, true)->Name("BM_fused_2_24/engine")->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(fused_pass, direct, false)->Name("BM_fused_2_24/direct")->UseRealTime()->Unit(benchmark::kMillisecond);

BENCHMARK(eager_add)->Name("BM_eager_add")->RangeMultiplier(2)->Range(1 << 16, 1 << 20)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(eager_add_sporadic)
    ->Name("BM_eager_add_sporadic")
    ->Arg(6)
    ->Arg(20)
    ->Iterations(300)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
