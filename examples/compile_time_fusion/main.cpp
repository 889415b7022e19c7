// Compile-time fusion: a hybra expression's C++ type IS its graph. Nothing is
// computed while the expression is built; assigning it to a Tensor runs the
// whole graph as one vectorised loop, with no temporaries. eval_unfused runs
// the same graph node by node (one pass and one temporary per op) instead.
//
//   compile_time_fusion           N = 2^24 float32 elements, median of 5 runs
//   compile_time_fusion --smoke   N = 4096, one run (the test suite's check)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <hybra/hybra.hpp>
#include <vector>

#include "../common/command_line.hpp"

// Median wall time of `runs` calls of f, in milliseconds.
template <class F>
double median_ms(int runs, F f) {
  std::vector<double> ms;
  for (int r = 0; r < runs; ++r) {
    auto start = std::chrono::steady_clock::now();
    f();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int main(int argc, char** argv) {
  const bool smoke = example::smoke_run(argc, argv,
      "compile_time_fusion: an expression's C++ type is its graph, run as one fused loop, against the\n"
      "same graph op by op (2^24 float32 elements, median of 5 runs).",
      "4096 elements, one run");
  const std::int64_t n = smoke ? 4096 : std::int64_t{1} << 24;
  const int runs = smoke ? 1 : 5;

  hybra::Tensor a = hybra::random_uniform({n}, -2, 2), b = hybra::random_uniform({n}, -2, 2),
                c = hybra::random_uniform({n}, -2, 2), d = hybra::random_uniform({n}, -2, 2);

  // 8 elementwise ops; `e` is only a tree of references to a, b, c and d.
  auto e = hybra::sigmoid(hybra::tanh(a * b + c) * hybra::exp(-d)) + a;
  std::printf("graph from the C++ type: %s\n", hybra::type_string(e).c_str());
  std::printf("graph with leaf names:   %s\n", hybra::to_string(e).c_str());

  hybra::Tensor fused, unfused;
  // Each run ends when the result is computed, not when its ops are queued.
  double fused_ms = median_ms(runs, [&] {  // one loop over n
    fused = e;
    fused.wait_to_read();
  });
  double unfused_ms = median_ms(runs, [&] {  // 8 loops
    unfused = hybra::eval_unfused(e);
    unfused.wait_to_read();
  });

  // Same values up to float rounding (a fused loop may turn a * b + c into a
  // single FMA instruction, which rounds once instead of twice).
  auto f = fused.to_vector<float>(), u = unfused.to_vector<float>();
  double worst = 0;  // largest difference, relative to max(1, |value|)
  for (std::size_t i = 0; i < f.size(); ++i)
    worst = std::max(worst, std::abs(double(f[i]) - u[i]) / std::max(1.0, std::abs(double(u[i]))));
  const bool agree = f.size() == u.size() && worst <= 1e-5;

  std::printf("N = %lld float32, %d thread(s)\n", static_cast<long long>(n), hybra::num_threads());
  std::printf("fused:   %8.2f ms\nunfused: %8.2f ms\nfused is %.2fx faster\n", fused_ms, unfused_ms,
              unfused_ms / fused_ms);
  std::printf("results %s (largest difference %.1e)\n", agree ? "agree" : "DIFFER", worst);
  return agree ? 0 : 1;
}
