// bench_train: one LeNet-5 training step (forward under autograd::record,
// softmax cross-entropy, backward, SGD with momentum) on a batch of 28x28
// images, including synchronisation, in images per second. Each case runs at
// the example's batch of 256, where the convolutions' arithmetic is most of a
// step, and at 16, where what each op costs beyond its arithmetic shows.
//
// Cases:
//   BM_train/hybridized        the block hybridized: its forward and backward are two compiled plans
//   BM_train/eager             the same block eager: every op recorded on the tape, the backward
//                              interpreted op by op
//   BM_train/hybridized_2dev   data parallel over cpu(0) and cpu(1): half the batch each,
//                              gradients summed by allreduce, both copies updated. Run it
//                              in a process of its own (--benchmark_filter=2dev; the others
//                              with -2dev): from then on cpu(0) has only its share of the cores
//   BM_train/libtorch          the same network and step in LibTorch (torch::nn modules,
//                              torch::optim::SGD), with as many intra-op threads as hybra
//                              uses. Built only when CMake finds Torch (Debian: libtorch-dev).
//   BM_conv/<pass>/<layer>     one pass (forward, data or weight gradient) of a convolution
//                              of D2L's ResNet-18 training step (batch 64 of 28x28 images), or
//                              of the zoo's inference (batch 2 of 224x224: ResNet-18's layers,
//                              ResNet-50's 1x1 layers, VGG's and AlexNet's first, DenseNet-121's
//                              3x3 into 32 filters): hybra's kernels or oneDNN's, as
//                              ops/conv_onednn.hpp decides; HYBRA_ONEDNN=0 times hybra's own
//                              on every layer, HYBRA_ONEDNN=always oneDNN's.
#include <benchmark/benchmark.h>

#include <hybra/hybra.hpp>
#include <string>

#include "lenet_common.hpp"

namespace {

namespace nn = hybra::nn;

void train_hybra(benchmark::State& state, bool hybridize, std::vector<hybra::Device> devices) {
  const std::int64_t batch_size = state.range(0);
  // The engine shares the cores out among the CPU devices a process has used,
  // for the rest of the process: after a two-device case, cpu(0) has one core
  // of two, and a one-device case would time that.
  if (devices.size() == 1 && hybra::engine::get().device_threads(devices[0]) < hybra::num_threads()) {
    state.SkipWithError("cpu(1) was used earlier in this process, so cpu(0) has part of the cores: "
                        "run the two-device cases in a process of their own (--benchmark_filter=2dev)");
    return;
  }
  hybra::seed(0);
  nn::HybridSequential net;
  net.add(nn::Conv2D(6, 5, 1, 2, 1, 1, "relu"), nn::MaxPool2D(2), nn::Conv2D(16, 5, 1, 0, 1, 1, "relu"),
          nn::MaxPool2D(2), nn::Flatten(), nn::Dense(120, "relu"), nn::Dense(84, "relu"), nn::Dense(10));
  net.initialize(nn::init::Xavier(), devices);
  net.hybridize(hybridize);
  hybra::Trainer trainer(net.collect_params(), "sgd", {{"learning_rate", 0.05}, {"momentum", 0.9}});
  const nn::SoftmaxCrossEntropyLoss loss_fn;
  const hybra::Tensor x = hybra::random_uniform({batch_size, 1, 28, 28});
  const hybra::Tensor y = hybra::random_uniform({batch_size}, 0, 10).astype(hybra::DType::int32);
  auto step = [&] {
    auto xs = hybra::split_and_load(x, devices), ys = hybra::split_and_load(y, devices);
    std::vector<hybra::Tensor> losses;
    {
      hybra::autograd::record rec;
      for (std::size_t k = 0; k < xs.size(); ++k) losses.push_back(loss_fn(net(xs[k]), ys[k]));
    }
    for (auto& l : losses) l.backward();
    trainer.step(batch_size);
    hybra::waitall();
  };
  step();  // deferred initialisation and capture
  for (auto _ : state) step();
  count_images(state, batch_size);
}

#ifdef HYBRA_BENCH_TORCH
void train_libtorch(benchmark::State& state) {
  const std::int64_t batch_size = state.range(0);
  torch::manual_seed(0);
  torch::set_num_threads(hybra::num_threads());
  LeNet net;
  torch::optim::SGD sgd(net.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::Tensor x = torch::rand({batch_size, 1, 28, 28});
  torch::Tensor y = torch::randint(0, 10, {batch_size}, torch::kLong);
  auto step = [&] {
    sgd.zero_grad();
    torch::Tensor loss = torch::nn::functional::cross_entropy(net.forward(x), y);
    loss.backward();
    sgd.step();
  };
  step();
  for (auto _ : state) step();
  count_images(state, batch_size);
}
BENCHMARK(train_libtorch)->Name("BM_train/libtorch")->Arg(256)->Arg(16)->MinTime(2)->UseRealTime();
#endif

// A convolution layer: input (N, C, H, W), F filters of K x K, stride, padding.
struct ConvLayer {
  const char* name;
  std::int64_t N, C, H, F, K, stride, padding;
};
constexpr ConvLayer conv_layers[] = {
    {"train_64x28", 64, 64, 28, 64, 3, 1, 1},     {"train_64to128x28_s2", 64, 64, 28, 128, 3, 2, 1},
    {"train_128x14", 64, 128, 14, 128, 3, 1, 1},  {"train_256x7", 64, 256, 7, 256, 3, 1, 1},
    {"train_512x4", 64, 512, 4, 512, 3, 1, 1},    {"train_1x1_64to128_s2", 64, 64, 28, 128, 1, 2, 0},
    {"infer_7x7_s2", 2, 3, 224, 64, 7, 2, 3},     {"infer_64x56", 2, 64, 56, 64, 3, 1, 1},
    {"infer_64to128x56_s2", 2, 64, 56, 128, 3, 2, 1}, {"infer_128x28", 2, 128, 28, 128, 3, 1, 1},
    {"infer_256x14", 2, 256, 14, 256, 3, 1, 1},   {"infer_512x7", 2, 512, 7, 512, 3, 1, 1},
    // ResNet-50's 1x1 layers, VGG's and AlexNet's first layers, at batch 2 of 224x224.
    {"infer_1x1_64to256x56", 2, 64, 56, 256, 1, 1, 0},   {"infer_1x1_256to64x56", 2, 256, 56, 64, 1, 1, 0},
    {"infer_1x1_1024to256x14", 2, 1024, 14, 256, 1, 1, 0}, {"infer_1x1_2048to512x7", 2, 2048, 7, 512, 1, 1, 0},
    {"infer_1x1_512to2048x7", 2, 512, 7, 2048, 1, 1, 0}, {"infer_3x3_3to64x224", 2, 3, 224, 64, 3, 1, 1},
    {"infer_11x11_s4", 2, 3, 224, 64, 11, 4, 2},
    // DenseNet-121's: each dense layer's 3x3 convolution into 32 filters, per block, and a 1x1 into 128.
    {"infer_3x3_128to32x56", 2, 128, 56, 32, 3, 1, 1}, {"infer_3x3_128to32x28", 2, 128, 28, 32, 3, 1, 1},
    {"infer_3x3_128to32x14", 2, 128, 14, 32, 3, 1, 1}, {"infer_3x3_128to32x7", 2, 128, 7, 32, 3, 1, 1},
    {"infer_1x1_96to128x56", 2, 96, 56, 128, 1, 1, 0},
};

void conv_pass(benchmark::State& state, ConvLayer layer, int pass) {
  const std::int64_t OH = (layer.H + 2 * layer.padding - layer.K) / layer.stride + 1;
  const hybra::Shape xs{layer.N, layer.C, layer.H, layer.H}, ws{layer.F, layer.C, layer.K, layer.K};
  const hybra::Tensor x = hybra::random_normal(xs), w = hybra::random_normal(ws);
  const hybra::Tensor dy = hybra::random_normal({layer.N, layer.F, OH, OH});
  auto run = [&] {
    if (pass == 0) return hybra::conv2d(x, w, {}, layer.stride, layer.padding);
    if (pass == 1) return hybra::conv2d_backward_data(dy, w, xs, layer.stride, layer.padding, 1, 1);
    return hybra::conv2d_backward_weight(dy, x, ws, layer.stride, layer.padding, 1, 1);
  };
  run().wait_to_read();
  for (auto _ : state) run().wait_to_read();
}

const bool conv_layers_registered = [] {
  const char* passes[] = {"forward", "data", "weight"};
  for (const auto& layer : conv_layers)
    for (int pass = 0; pass < 3; ++pass) {
      if (layer.N == 2 && pass > 0) continue;  // inference: the forward pass only
      benchmark::RegisterBenchmark((std::string("BM_conv/") + passes[pass] + "/" + layer.name).c_str(), conv_pass,
                                   layer, pass)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
  return true;
}();

}  // namespace

BENCHMARK_CAPTURE(train_hybra, hybridized, true, {hybra::cpu(0)})
    ->Name("BM_train/hybridized")->Arg(256)->Arg(16)->MinTime(2)->UseRealTime();
BENCHMARK_CAPTURE(train_hybra, eager, false, {hybra::cpu(0)})
    ->Name("BM_train/eager")->Arg(256)->Arg(16)->MinTime(2)->UseRealTime();
BENCHMARK_CAPTURE(train_hybra, hybridized_2dev, true, {hybra::cpu(0), hybra::cpu(1)})
    ->Name("BM_train/hybridized_2dev")->Arg(256)->Arg(16)->MinTime(2)->UseRealTime();

BENCHMARK_MAIN();
