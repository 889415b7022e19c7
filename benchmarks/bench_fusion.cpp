// bench_fusion: hybra's compile-time fusion against the same ops run one at a
// time, Eigen Array expressions and a hand-written loop, over N = 2^24 float32
// elements on 1 and 2 threads. Run with benchmarks/run_fusion.sh; figures in
// docs/benchmarks.md.
//
//   short chain, 5 ops:  relu(a * b + c) * d + 1
//                        (multiply, add, relu, multiply, add)
//   long chain,  8 ops:  sigmoid(tanh(a * b + c) * exp(-d)) + a
//                        (multiply, add, tanh, negative, exp, multiply, sigmoid, add)
//   sum:                 sum(relu(a * b + c)), a reduction of a fused expression
//
// Cases BM_fusion_<chain>/<impl>_t<threads>:
//   hybra    out.assign(expression): one fused pass into a preallocated output;
//            for sum, hybra::sum(expression): the pass into a temporary, then the sum
//   thrust   with_thrust::assign(out, expression), with_thrust::sum(expression):
//            the kernel tree through Thrust's OpenMP backend (include/hybra/expr/thrust.hpp),
//            one pass for sum too
//   unfused  one hybra assign per op, into preallocated temporaries
//   eigen    Eigen Array expression over Eigen::Map of the same buffers
//   loop     a hand-written fused loop
// Eigen Array expressions and the loop are single-threaded; at 2 threads they
// run on two halves of the range with OpenMP, as hybra splits its loops.
//
// Bytes processed are the same for every impl of a chain: each distinct input
// read once plus the output written once, 5 x N x 4 bytes (the unfused impl
// moves more, which is the point); for sum, the three inputs read once. The
// sums accumulate in double but Eigen's, which accumulates in float.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <hybra/expr/thrust.hpp>
#include <hybra/hybra.hpp>
#include <string>

#ifdef HYBRA_BENCH_EIGEN
#include <Eigen/Core>
#endif

namespace {

using hybra::Tensor;

constexpr std::int64_t N = std::int64_t{1} << 24;
constexpr std::int64_t chain_bytes = 5 * N * static_cast<std::int64_t>(sizeof(float));
constexpr std::int64_t sum_bytes = 3 * N * static_cast<std::int64_t>(sizeof(float));

struct Buffers {
  Tensor a = hybra::random_uniform({N}, -2, 2);
  Tensor b = hybra::random_uniform({N}, -2, 2);
  Tensor c = hybra::random_uniform({N}, -2, 2);
  Tensor d = hybra::random_uniform({N}, -2, 2);
  Tensor out = hybra::zeros({N}), t1 = hybra::zeros({N}), t2 = hybra::zeros({N}), t3 = hybra::zeros({N});
  Tensor total;  // a sum pass's result
  double checksum = 0;  // a hand-written sum's, kept so that the compiler keeps the loop
  const float *pa = a.data<float>(), *pb = b.data<float>(), *pc = c.data<float>(), *pd = d.data<float>();
  float* po = out.data<float>();
};

Buffers& buffers() {
  static Buffers bufs;
  return bufs;
}

// body(begin, end) over [0, N), one contiguous half per thread as hybra's
// parallel_for splits it.
template <class Body>
void split(int threads, Body body) {
  if (threads == 1) {
    body(std::int64_t{0}, N);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    std::int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    std::int64_t chunk = (N + nt - 1) / nt;
    std::int64_t begin = std::min(N, t * chunk), end = std::min(N, begin + chunk);
    body(begin, end);
  }
}

template <class Pass>
void run(benchmark::State& state, int threads, std::int64_t bytes_per_pass, Pass pass) {
  hybra::set_num_threads(threads);
  // hybra's passes only queue their work: each timed pass ends once `out`
  // has been written (a no-op wait for the hand-written loops).
  pass(buffers(), threads);  // warm up: page in buffers, wake the thread team
  buffers().out.wait_to_read();
  for (auto _ : state) {
    pass(buffers(), threads);
    buffers().out.wait_to_read();
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * bytes_per_pass);
}

// ---- short chain: relu(a * b + c) * d + 1 --------------------------------

void short_hybra(Buffers& B, int) { B.out.assign(hybra::relu(B.a * B.b + B.c) * B.d + 1); }

void short_thrust(Buffers& B, int) { hybra::with_thrust::assign(B.out, hybra::relu(B.a * B.b + B.c) * B.d + 1); }

void short_unfused(Buffers& B, int) {
  B.t1.assign(B.a * B.b);
  B.t2.assign(B.t1 + B.c);
  B.t1.assign(hybra::relu(B.t2));
  B.t2.assign(B.t1 * B.d);
  B.out.assign(B.t2 + 1);
}

void short_loop(Buffers& B, int threads) {
  split(threads, [&](std::int64_t begin, std::int64_t end) {
    const float *a = B.pa, *b = B.pb, *c = B.pc, *d = B.pd;
    float* o = B.po;
#pragma omp simd
    for (std::int64_t i = begin; i < end; ++i) {
      float x = a[i] * b[i] + c[i];
      o[i] = (x < 0.0f ? 0.0f : x) * d[i] + 1.0f;
    }
  });
}

// ---- long chain: sigmoid(tanh(a * b + c) * exp(-d)) + a ------------------

void long_hybra(Buffers& B, int) {
  B.out.assign(hybra::sigmoid(hybra::tanh(B.a * B.b + B.c) * hybra::exp(-B.d)) + B.a);
}

void long_thrust(Buffers& B, int) {
  hybra::with_thrust::assign(B.out, hybra::sigmoid(hybra::tanh(B.a * B.b + B.c) * hybra::exp(-B.d)) + B.a);
}

void long_unfused(Buffers& B, int) {
  B.t1.assign(B.a * B.b);
  B.t2.assign(B.t1 + B.c);
  B.t1.assign(hybra::tanh(B.t2));
  B.t2.assign(-B.d);
  B.t3.assign(hybra::exp(B.t2));
  B.t2.assign(B.t1 * B.t3);
  B.t1.assign(hybra::sigmoid(B.t2));
  B.out.assign(B.t1 + B.a);
}

void long_loop(Buffers& B, int threads) {
  split(threads, [&](std::int64_t begin, std::int64_t end) {
    const float *a = B.pa, *b = B.pb, *c = B.pc, *d = B.pd;
    float* o = B.po;
#pragma omp simd
    for (std::int64_t i = begin; i < end; ++i) {
      float x = std::tanh(a[i] * b[i] + c[i]) * std::exp(-d[i]);
      o[i] = 1.0f / (1.0f + std::exp(-x)) + a[i];
    }
  });
}

// ---- sum: sum(relu(a * b + c)) ---------------------------------------------

void sum_hybra(Buffers& B, int) {
  B.total = hybra::sum(hybra::relu(B.a * B.b + B.c));
  B.total.wait_to_read();
}

void sum_thrust(Buffers& B, int) {
  B.total = hybra::with_thrust::sum(hybra::relu(B.a * B.b + B.c));
  B.total.wait_to_read();
}

// The halves' sums, added once both are done.
template <class HalfSum>
double sum_of_halves(int threads, HalfSum half_sum) {
  double part[2] = {0, 0};
  split(threads, [&](std::int64_t begin, std::int64_t end) { part[begin == 0 ? 0 : 1] = half_sum(begin, end); });
  return part[0] + part[1];
}

void sum_loop(Buffers& B, int threads) {
  B.checksum = sum_of_halves(threads, [&](std::int64_t begin, std::int64_t end) {
    const float *a = B.pa, *b = B.pb, *c = B.pc;
    double total = 0;
#pragma omp simd reduction(+ : total)
    for (std::int64_t i = begin; i < end; ++i) {
      const float x = a[i] * b[i] + c[i];
      total += x < 0.0f ? 0.0f : x;
    }
    return total;
  });
}

#ifdef HYBRA_BENCH_EIGEN
using ConstArray = Eigen::Map<const Eigen::ArrayXf>;
using Array = Eigen::Map<Eigen::ArrayXf>;

void short_eigen(Buffers& B, int threads) {
  split(threads, [&](std::int64_t begin, std::int64_t end) {
    const auto n = static_cast<Eigen::Index>(end - begin);
    ConstArray a(B.pa + begin, n), b(B.pb + begin, n), c(B.pc + begin, n), d(B.pd + begin, n);
    Array(B.po + begin, n) = (a * b + c).max(0.0f) * d + 1.0f;
  });
}

void long_eigen(Buffers& B, int threads) {
  split(threads, [&](std::int64_t begin, std::int64_t end) {
    const auto n = static_cast<Eigen::Index>(end - begin);
    ConstArray a(B.pa + begin, n), b(B.pb + begin, n), c(B.pc + begin, n), d(B.pd + begin, n);
    Array(B.po + begin, n) = ((a * b + c).tanh() * (-d).exp()).logistic() + a;
  });
}

void sum_eigen(Buffers& B, int threads) {
  B.checksum = sum_of_halves(threads, [&](std::int64_t begin, std::int64_t end) {
    const auto n = static_cast<Eigen::Index>(end - begin);
    ConstArray a(B.pa + begin, n), b(B.pb + begin, n), c(B.pc + begin, n);
    return static_cast<double>((a * b + c).max(0.0f).sum());
  });
}
#endif

template <class Pass>
void add(const std::string& chain, const std::string& impl, Pass pass) {
  const std::int64_t bytes = chain == "sum" ? sum_bytes : chain_bytes;
  for (int threads : {1, 2}) {
    std::string name = "BM_fusion_" + chain + "/" + impl + "_t" + std::to_string(threads);
    benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) { run(s, threads, bytes, pass); })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace

int main(int argc, char** argv) {
  add("short", "hybra", short_hybra);
  add("short", "thrust", short_thrust);
  add("short", "unfused", short_unfused);
#ifdef HYBRA_BENCH_EIGEN
  add("short", "eigen", short_eigen);
#endif
  add("short", "loop", short_loop);
  add("long", "hybra", long_hybra);
  add("long", "thrust", long_thrust);
  add("long", "unfused", long_unfused);
#ifdef HYBRA_BENCH_EIGEN
  add("long", "eigen", long_eigen);
#endif
  add("long", "loop", long_loop);
  add("sum", "hybra", sum_hybra);
  add("sum", "thrust", sum_thrust);
#ifdef HYBRA_BENCH_EIGEN
  add("sum", "eigen", sum_eigen);
#endif
  add("sum", "loop", sum_loop);

  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
