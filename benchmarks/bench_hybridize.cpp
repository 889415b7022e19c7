// bench_hybridize: the chapter's MLP (512 -> 256 relu -> 128 relu -> 2) at
// batch 1, per forward call including synchronisation (wait_to_read), and
// what capture costs. Figures in docs/benchmarks.md.
//
// Cases:
//   BM_mlp/eager              net(x) without hybridize: 3 fully_connected + 2
//                             relu engine ops per call
//   BM_mlp/hybridized         net(x) after hybridize: one engine op running the
//                             captured plan (3 GEMVs, bias + relu epilogues)
//   BM_mlp/lower_bound        the same forward hand-written with AVX2
//                             intrinsics, one thread, no engine, no allocation
//   BM_mlp/lower_bound_2t     the same with the first (largest) layer's rows
//                             split with a second thread that spins, waiting
//                             for work (no OpenMP: with the engine's threads in
//                             the process, libgomp throttles its spinning and an
//                             OpenMP region then costs a futex wake, ~50 us here)
//   BM_mlp/capture            a fresh net's first hybridized call: trace,
//                             optimise, plan, run (initialisation excluded)
//   BM_mlp/imported           net(x) on the model export_model wrote, read
//                             back by SymbolBlock::imports (as examples/deploy)
//   BM_mlp/import             imports + the first call: read both files,
//                             build, optimise and plan the graph, run
// The ratio hybridized / lower_bound is the figure the goal is stated in.
// The hand-written forward is the in-run reference (bench_lenet has the
// LibTorch peer).
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>
#include <hybra/hybra.hpp>
#include <vector>

namespace {

namespace nn = hybra::nn;

nn::HybridSequential make_mlp() {
  nn::HybridSequential net;
  net.add(nn::Dense(256, "relu"), nn::Dense(128, "relu"), nn::Dense(2));
  net.initialize();
  return net;
}

void mlp_call(benchmark::State& state, bool hybridize) {
  hybra::seed(0);
  auto net = make_mlp();
  hybra::Tensor x = hybra::random_normal({1, 512});
  net(x).wait_to_read();  // deferred initialisation
  net.hybridize(hybridize);
  net(x).wait_to_read();  // capture
  for (auto _ : state) net(x).wait_to_read();
}

// y[n] = relu?(b[n] + sum_k w[n, k] x[k]) for rows [begin, end): 4 rows at a
// time, 8-float AVX2 accumulators, K a multiple of 8.
void dense_rows(const float* w, const float* b, const float* x, float* y, int K, int begin, int end, bool relu) {
  auto hsum = [](__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_hadd_ps(s, s);
    return _mm_cvtss_f32(_mm_hadd_ps(s, s));
  };
  int n = begin;
  for (; n + 4 <= end; n += 4) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const float* r = w + static_cast<std::ptrdiff_t>(n) * K;
    for (int k = 0; k < K; k += 8) {
      __m256 xv = _mm256_loadu_ps(x + k);
      a0 = _mm256_fmadd_ps(_mm256_loadu_ps(r + k), xv, a0);
      a1 = _mm256_fmadd_ps(_mm256_loadu_ps(r + K + k), xv, a1);
      a2 = _mm256_fmadd_ps(_mm256_loadu_ps(r + 2 * K + k), xv, a2);
      a3 = _mm256_fmadd_ps(_mm256_loadu_ps(r + 3 * K + k), xv, a3);
    }
    float v[4] = {hsum(a0), hsum(a1), hsum(a2), hsum(a3)};
    for (int i = 0; i < 4; ++i) y[n + i] = relu ? std::max(0.0f, v[i] + b[n + i]) : v[i] + b[n + i];
  }
  for (; n < end; ++n) {
    __m256 a = _mm256_setzero_ps();
    for (int k = 0; k < K; k += 8)
      a = _mm256_fmadd_ps(_mm256_loadu_ps(w + static_cast<std::ptrdiff_t>(n) * K + k), _mm256_loadu_ps(x + k), a);
    float v = hsum(a) + b[n];
    y[n] = relu ? std::max(0.0f, v) : v;
  }
}

void mlp_lower_bound(benchmark::State& state, int threads) {
  hybra::seed(0);
  auto net = make_mlp();
  hybra::Tensor xt = hybra::random_normal({1, 512});
  net(xt).wait_to_read();
  std::vector<std::vector<float>> w, b;
  for (const auto& p : net.collect_params()) (p.name().ends_with("weight") ? w : b).push_back(p.data().to_vector<float>());
  std::vector<float> x = xt.to_vector<float>(), h1(256), h2(128), y(2);
  auto layer1 = [&](int begin, int end) { dense_rows(w[0].data(), b[0].data(), x.data(), h1.data(), 512, begin, end, true); };
  // The second thread computes rows 128..255 of layer 1 whenever `round` moves on.
  std::atomic<long> round{0}, done{0};
  std::atomic<bool> stop{false};
  std::thread helper;
  if (threads == 2)
    helper = std::thread([&] {
      for (long seen = 0; !stop.load(std::memory_order_relaxed);) {
        if (round.load(std::memory_order_acquire) == seen) continue;
        ++seen;
        layer1(128, 256);
        done.store(seen, std::memory_order_release);
      }
    });
  long calls = 0;
  for (auto _ : state) {
    if (threads == 2) {
      round.store(++calls, std::memory_order_release);
      layer1(0, 128);
      while (done.load(std::memory_order_acquire) != calls) {
      }
    } else {
      layer1(0, 256);
    }
    dense_rows(w[1].data(), b[1].data(), h1.data(), h2.data(), 256, 0, 128, true);
    dense_rows(w[2].data(), b[2].data(), h2.data(), y.data(), 128, 0, 2, false);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  stop = true;
  if (helper.joinable()) helper.join();
}

void mlp_capture(benchmark::State& state) {
  hybra::Tensor x = hybra::random_normal({1, 512});
  for (auto _ : state) {
    state.PauseTiming();
    auto net = make_mlp();
    net(x).wait_to_read();
    net.hybridize();
    state.ResumeTiming();
    net(x).wait_to_read();
  }
}

// The MLP exported once per process into a temporary directory; returns the
// file prefix.
std::string exported_mlp() {
  static const std::string prefix = [] {
    hybra::seed(0);
    auto net = make_mlp();
    net.hybridize();
    net(hybra::random_normal({1, 512})).wait_to_read();
    auto dir = std::filesystem::temp_directory_path() / "hybra_bench_hybridize";
    std::filesystem::create_directories(dir);
    std::string p = (dir / "my_mlp").string();
    net.export_model(p);
    return p;
  }();
  return prefix;
}

void mlp_imported(benchmark::State& state) {
  auto net = nn::SymbolBlock::imports(exported_mlp() + "-symbol.json", {"data"}, exported_mlp() + "-0000.params");
  hybra::Tensor x = hybra::random_normal({1, 512});
  net(x).wait_to_read();  // capture
  for (auto _ : state) net(x).wait_to_read();
}

void mlp_import(benchmark::State& state) {
  const std::string prefix = exported_mlp();
  hybra::Tensor x = hybra::random_normal({1, 512});
  for (auto _ : state) {
    auto net = nn::SymbolBlock::imports(prefix + "-symbol.json", {"data"}, prefix + "-0000.params");
    net(x).wait_to_read();
  }
}

}  // namespace

BENCHMARK_CAPTURE(mlp_call, eager, false)->Name("BM_mlp/eager")->MinTime(0.5)->UseRealTime();
BENCHMARK_CAPTURE(mlp_call, hybridized, true)->Name("BM_mlp/hybridized")->MinTime(0.5)->UseRealTime();
BENCHMARK_CAPTURE(mlp_lower_bound, one, 1)->Name("BM_mlp/lower_bound")->MinTime(0.5)->UseRealTime();
BENCHMARK_CAPTURE(mlp_lower_bound, two, 2)->Name("BM_mlp/lower_bound_2t")->MinTime(0.5)->UseRealTime();
BENCHMARK(mlp_capture)->Name("BM_mlp/capture")->Iterations(20)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(mlp_imported)->Name("BM_mlp/imported")->MinTime(0.5)->UseRealTime();
BENCHMARK(mlp_import)->Name("BM_mlp/import")->Iterations(20)->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK_MAIN();
