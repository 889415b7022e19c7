// Hybrid programming (D2L 13.1, "Hybridizing the Sequential Class"): the
// chapter's benchmark. The same HybridSequential MLP runs eagerly (each layer
// queues its own ops: fully_connected, then relu) and, after hybridize(),
// as one captured graph: the first call runs the layers on Symbols once,
// optimises the graph (bias and relu become epilogues of the matrix products)
// and compiles it into one engine op; every later call runs that op.
//
// Timing, as in the chapter: a loop of calls, then ONE waitall() at the end
// (no wait after each call), so the time includes all the computation.
//
// It ends as the chapter does, by exporting the model: my_mlp-symbol.json
// (the graph) and my_mlp-0000.params (the weights), in MXNet's formats, into
// the working directory; examples/deploy runs them with none of this code.
//
//   hybrid_mlp           1000 calls per mode (median of 3 loops)
//   hybrid_mlp --smoke   50 calls per mode, one loop; fails if the outputs differ
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <hybra/hybra.hpp>
#include <iostream>
#include <vector>

#include "../common/command_line.hpp"

namespace nn = hybra::nn;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Median over `runs` loops of `calls` calls of net(x), each loop ended by
// waitall(), in milliseconds per loop.
double benchmark(nn::HybridSequential& net, const hybra::Tensor& x, int calls, int runs) {
  std::vector<double> ms;
  for (int r = 0; r < runs; ++r) {
    hybra::waitall();
    auto start = Clock::now();
    for (int i = 0; i < calls; ++i) net(x);
    hybra::waitall();
    ms.push_back(ms_since(start));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// max_i |a_i - b_i| / max(|a_i|, |b_i|), 0 where both are 0; infinite if the shapes differ.
double max_rel_diff(const hybra::Tensor& a, const hybra::Tensor& b) {
  if (a.shape() != b.shape()) return INFINITY;
  auto u = a.to_vector<double>(), v = b.to_vector<double>();
  double worst = 0;
  for (std::size_t i = 0; i < u.size(); ++i) {
    const double scale = std::max(std::abs(u[i]), std::abs(v[i]));
    if (scale > 0) worst = std::max(worst, std::abs(u[i] - v[i]) / scale);
  }
  return worst;
}

int main(int argc, char** argv) {
  const bool smoke = example::smoke_run(argc, argv,
      "hybrid_mlp: the chapter's MLP eager and hybridized, 1000 calls per mode (median of 3 loops), then\n"
      "exported as my_mlp-symbol.json and my_mlp-0000.params for examples/deploy.",
      "50 calls per mode, one loop; fails if the outputs differ");
  const int calls = smoke ? 50 : 1000, runs = smoke ? 1 : 3;

  nn::HybridSequential net;
  net.add(nn::Dense(256, "relu"), nn::Dense(128, "relu"), nn::Dense(2));
  net.initialize();
  // The input examples/deploy makes too, to print the same outputs.
  hybra::Generator input_generator(2026);
  hybra::Tensor x = hybra::random_normal({1, 512}, 0, 1, hybra::DType::float32, hybra::cpu(), input_generator);

  // The first call completes the weights' shapes (in_units is inferred) and
  // initialises them; it is not timed.
  hybra::Tensor eager_out = net(x);
  eager_out.wait_to_read();
  const double eager_ms = benchmark(net, x, calls, runs);

  net.hybridize();
  auto start = Clock::now();
  hybra::Tensor hybrid_out = net(x);  // captures, optimises, compiles, then runs
  hybrid_out.wait_to_read();
  const double first_ms = ms_since(start);
  const double hybrid_ms = benchmark(net, x, calls, runs);

  const double diff = max_rel_diff(eager_out, hybrid_out);
  const bool agree = diff <= 1e-6;

  std::printf("MLP 512 -> 256 (relu) -> 128 (relu) -> 2 on a (1, 512) float32 input, %d calls, waitall() at the end\n",
              calls);
  std::printf("  eager:      %8.2f us per call\n", eager_ms * 1000 / calls);
  std::printf("  hybridized: %8.2f us per call   (speed-up %.2fx)\n", hybrid_ms * 1000 / calls, eager_ms / hybrid_ms);
  std::printf("  first hybridized call: %.2f ms (capture + optimise + compile + run)\n", first_ms);
  std::printf("outputs %s (max relative difference %.1e)\n", agree ? "agree" : "DIFFER", diff);
  std::cout << "\nthe captured, optimised graph (one engine op per call):\n" << net.plan().graph();
  std::printf("workspace: %zu bytes planned (%zu without buffer reuse)\n", net.plan().peak_bytes(),
              net.plan().unplanned_bytes());

  net.export_model("my_mlp");
  const auto y = hybrid_out.to_vector<float>();
  std::printf("\nexported my_mlp-symbol.json and my_mlp-0000.params; outputs for the seed-2026 input: %.6f %.6f\n",
              y[0], y[1]);
  return agree ? 0 : 1;
}
