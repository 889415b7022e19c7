// The hybra side of the MXNet interop test (tests/interop/run.sh).
//
//   interop export DIR   hybra exports its models into DIR (<name>-symbol.json,
//                        <name>-0000.params) with <name>-io.params: the input and
//                        hybra's output, for MXNet to compare with
//   interop check DIR    hybra imports every <name>-symbol.json of DIR and compares
//                        its output with <name>-io.params (written by the other side)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <hybra/hybra.hpp>
#include <string>

namespace fs = std::filesystem;
namespace nn = hybra::nn;
using hybra::Tensor;

namespace {

constexpr double tolerance = 1e-5;

// Arithmetic with scalars on both sides, comparisons, a reduction and a
// softmax: the MXNet spellings of hybra's elementwise ops.
class ScalarMath : public nn::HybridBlock<ScalarMath> {
 public:
  ScalarMath() : HybridBlock("scalarmath") {}
  template <class F>
  F hybrid_forward(const F& x) {
    F y = relu(x * 2 - 1) / (3 - x) + (x > 0.5) + pow(2, x);
    return softmax(sum(y, 1, true) * y, -1);
  }
};

void save(nn::HybridBase& net, const hybra::Shape& shape, const fs::path& dir, const std::string& name) {
  net.initialize(hybra::nn::init::Xavier());
  Tensor x = hybra::random_uniform(shape, -1, 1);
  net.hybridize();
  Tensor y = net(x);
  net.export_model((dir / name).string());
  hybra::io::save_ndarray_list(dir / (name + "-io.params"), std::vector<std::pair<std::string, Tensor>>{{"input", x}, {"output", y}});
  std::printf("hybra exported %s: output %s\n", name.c_str(), hybra::to_string(y.shape()).c_str());
}

int export_models(const fs::path& dir) {
  hybra::seed(7);
  nn::HybridSequential mlp;
  mlp.add(nn::Dense(16, "relu"), nn::Dense(8, "tanh"), nn::Dense(3));
  save(mlp, {2, 10}, dir, "mlp");
  ScalarMath math;
  save(math, {3, 4}, dir, "scalar_math");
  nn::HybridSequential convnet;
  convnet.add(nn::Conv2D(4, 3, 1, 1, 1, 1, "relu"), nn::BatchNorm(), nn::MaxPool2D(2),
              nn::Conv2D(6, 3, 2, 0, 1, 2, "", false), nn::AvgPool2D(2, 1, 1), nn::GlobalAvgPool2D(), nn::Flatten(),
              nn::Dense(5, "sigmoid"));
  save(convnet, {3, 2, 12, 12}, dir, "convnet");
  return 0;
}

int check_models(const fs::path& dir) {
  int checked = 0;
  double worst_all = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string file = entry.path().filename().string();
    if (!file.ends_with("-symbol.json")) continue;
    const std::string name = file.substr(0, file.size() - std::string("-symbol.json").size());
    const fs::path prefix = dir / name;
    auto net = nn::SymbolBlock::imports(prefix.string() + "-symbol.json", {"data"}, prefix.string() + "-0000.params");
    Tensor input, want;
    for (auto& [key, value] : hybra::io::load_ndarray_list(prefix.string() + "-io.params"))
      (key == "input" ? input : want) = value;
    Tensor y = net(input);
    if (y.shape() != want.shape()) {
      std::printf("%s: hybra's output has shape %s, MXNet's %s\n", name.c_str(), hybra::to_string(y.shape()).c_str(),
                  hybra::to_string(want.shape()).c_str());
      return 1;
    }
    const auto a = y.to_vector<double>(), b = want.to_vector<double>();
    double worst = 0;
    for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / std::max(std::abs(b[i]), 1e-3));
    std::printf("hybra ran MXNet's %s: max relative difference %.1e\n", name.c_str(), worst);
    if (!(worst <= tolerance)) {
      std::printf("%s: outputs differ (max relative difference %.1e > %.0e)\n", name.c_str(), worst, tolerance);
      return 1;
    }
    worst_all = std::max(worst_all, worst);
    ++checked;
  }
  if (checked == 0) {
    std::printf("no *-symbol.json in %s\n", dir.string().c_str());
    return 1;
  }
  std::printf("hybra agrees with MXNet on %d models (max relative difference %.1e)\n", checked, worst_all);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc == 3 ? argv[1] : "";
  if (mode != "export" && mode != "check") {
    std::fprintf(stderr, "usage: interop export|check DIR\n");
    return 2;
  }
  try {
    return mode == "export" ? export_models(argv[2]) : check_models(argv[2]);
  } catch (const hybra::Error& e) {
    std::fprintf(stderr, "interop: %s\n", e.what());
    return 1;
  }
}
