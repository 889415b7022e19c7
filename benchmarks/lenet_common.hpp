#pragma once
// What bench_lenet and bench_train share: the batch, the images/s counter
// and, where CMake found LibTorch, LeNet-5 in LibTorch (their peer), with the
// layers hybra's benchmarks build (ReLU, max pooling).
#include <benchmark/benchmark.h>

#include <cstdint>

#ifdef HYBRA_BENCH_TORCH
#include <torch/torch.h>
#endif

constexpr std::int64_t batch = 256;

inline void count_images(benchmark::State& state, std::int64_t images_per_iteration = batch) {
  state.counters["images/s"] = benchmark::Counter(static_cast<double>(state.iterations() * images_per_iteration),
                                                  benchmark::Counter::kIsRate);
}

#ifdef HYBRA_BENCH_TORCH
struct LeNet : torch::nn::Module {
  torch::nn::Conv2d conv0{torch::nn::Conv2dOptions(1, 6, 5).padding(2)}, conv1{torch::nn::Conv2dOptions(6, 16, 5)};
  torch::nn::Linear dense0{400, 120}, dense1{120, 84}, dense2{84, 10};
  LeNet() {
    register_module("conv0", conv0);
    register_module("conv1", conv1);
    register_module("dense0", dense0);
    register_module("dense1", dense1);
    register_module("dense2", dense2);
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv0(x)), 2);
    x = torch::max_pool2d(torch::relu(conv1(x)), 2);
    x = torch::relu(dense0(x.flatten(1)));
    return dense2(torch::relu(dense1(x)));
  }
};
#endif
