// LeNet-5 (D2L 7.6) for inference: built from Conv2D, MaxPool2D and Dense,
// hybridized (each convolution's bias and activation become its epilogue),
// exported in MXNet's formats and imported back as a SymbolBlock, which
// gives the same outputs. Then a timed batch of 256 images through the
// imported model.
//
//   lenet_inference           a batch of 256 28x28 images, 20 timed calls
//   lenet_inference --smoke   a batch of 8, 2 timed calls
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <hybra/hybra.hpp>
#include <iostream>

#include "../common/command_line.hpp"

namespace nn = hybra::nn;

int main(int argc, char** argv) {
  const bool smoke = example::smoke_run(argc, argv,
      "lenet_inference: LeNet-5 hybridized, exported, imported back as a SymbolBlock and timed on a batch of\n"
      "256 28x28 images (20 calls).",
      "a batch of 8, 2 timed calls");
  const std::int64_t batch = smoke ? 8 : 256;
  const int calls = smoke ? 2 : 20;

  nn::HybridSequential net;
  net.add(nn::Conv2D(6, 5, 1, 2, 1, 1, "relu"), nn::MaxPool2D(2),  // (6, 28, 28) -> (6, 14, 14)
          nn::Conv2D(16, 5, 1, 0, 1, 1, "relu"), nn::MaxPool2D(2),  // (16, 10, 10) -> (16, 5, 5)
          nn::Flatten(), nn::Dense(120, "relu"), nn::Dense(84, "relu"), nn::Dense(10));
  net.initialize(nn::init::Xavier());
  hybra::Tensor images = hybra::random_uniform({batch, 1, 28, 28}, 0, 1);

  hybra::Tensor eager = net(images);
  net.hybridize();
  hybra::Tensor hybrid = net(images);
  std::cout << "LeNet-5, hybridized and optimised:\n" << net.plan().graph();

  const auto prefix = (std::filesystem::temp_directory_path() / "lenet").string();
  net.export_model(prefix);
  auto imported = nn::SymbolBlock::imports(prefix + "-symbol.json", {"data"}, prefix + "-0000.params");
  hybra::Tensor again = imported(images);

  auto max_diff = [](const hybra::Tensor& a, const hybra::Tensor& b) {
    auto u = a.to_vector<float>(), v = b.to_vector<float>();
    float worst = 0;
    for (std::size_t i = 0; i < u.size(); ++i) worst = std::max(worst, std::abs(u[i] - v[i]));
    return worst;
  };
  const float hybrid_diff = max_diff(eager, hybrid), import_diff = max_diff(hybrid, again);
  std::printf("exported %s-symbol.json and %s-0000.params, imported back\n", prefix.c_str(), prefix.c_str());
  std::printf("max |eager - hybridized| = %.2e, max |hybridized - imported| = %.2e\n", hybrid_diff, import_diff);

  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) imported(images);
  hybra::waitall();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("imported model: %d calls on a batch of %lld: %.0f images/s\n", calls, static_cast<long long>(batch),
              static_cast<double>(calls * batch) / s);
  std::printf("classes of the first 8 images:");
  const auto classes = hybra::argmax(again, 1).to_vector<std::int64_t>();
  for (std::size_t i = 0; i < 8; ++i) std::printf(" %lld", static_cast<long long>(classes[i]));
  std::printf("\n");
  std::filesystem::remove(prefix + "-symbol.json");
  std::filesystem::remove(prefix + "-0000.params");
  return hybrid_diff <= 1e-5f && import_diff == 0 ? 0 : 1;
}
