// bench_lenet: LeNet-5 inference on a batch of 256 28x28 images, per forward
// call including synchronisation, in images per second (counter images/s).
//
//   Conv2D(6, 5, padding 2, relu) -> MaxPool2D(2) -> Conv2D(16, 5, relu) ->
//   MaxPool2D(2) -> Flatten -> Dense(120, relu) -> Dense(84, relu) -> Dense(10)
//
// Cases:
//   BM_lenet/hybridized  net(x) after hybridize: one engine op running the
//                        captured plan (each conv2d with its relu as epilogue)
//   BM_lenet/eager       net(x) without hybridize: one engine op per layer op
//   BM_lenet/libtorch    the same network in LibTorch (torch::nn modules,
//                        eval mode, NoGradGuard), with as many intra-op
//                        threads as hybra uses (hybra::num_threads()). Built
//                        only when CMake finds Torch (Debian: libtorch-dev).
// Weights differ between the libraries (each initialises its own); shapes
// and work are the same. LibTorch's own default here is one thread (its
// cpuinfo counts one core on the development VM).

#include <benchmark/benchmark.h>

#include <hybra/hybra.hpp>

#include "lenet_common.hpp"

namespace {

namespace nn = hybra::nn;

void lenet_hybra(benchmark::State& state, bool hybridize) {
  hybra::seed(0);
  nn::HybridSequential net;
  net.add(nn::Conv2D(6, 5, 1, 2, 1, 1, "relu"), nn::MaxPool2D(2), nn::Conv2D(16, 5, 1, 0, 1, 1, "relu"),
          nn::MaxPool2D(2), nn::Flatten(), nn::Dense(120, "relu"), nn::Dense(84, "relu"), nn::Dense(10));
  net.initialize(nn::init::Xavier());
  hybra::Tensor x = hybra::random_uniform({batch, 1, 28, 28});
  net(x).wait_to_read();  // deferred initialisation
  net.hybridize(hybridize);
  net(x).wait_to_read();  // capture
  for (auto _ : state) net(x).wait_to_read();
  count_images(state);
}

#ifdef HYBRA_BENCH_TORCH
void lenet_libtorch(benchmark::State& state) {
  torch::manual_seed(0);
  torch::set_num_threads(hybra::num_threads());
  torch::NoGradGuard no_grad;
  LeNet net;
  net.eval();
  torch::Tensor x = torch::rand({batch, 1, 28, 28});
  net.forward(x);
  for (auto _ : state) benchmark::DoNotOptimize(net.forward(x).data_ptr<float>());
  count_images(state);
}
#endif

}  // namespace

BENCHMARK_CAPTURE(lenet_hybra, hybridized, true)->Name("BM_lenet/hybridized")->MinTime(1)->UseRealTime();
BENCHMARK_CAPTURE(lenet_hybra, eager, false)->Name("BM_lenet/eager")->MinTime(1)->UseRealTime();
#ifdef HYBRA_BENCH_TORCH
BENCHMARK(lenet_libtorch)->Name("BM_lenet/libtorch")->MinTime(1)->UseRealTime();
#endif

BENCHMARK_MAIN();
