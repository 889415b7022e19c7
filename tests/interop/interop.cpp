// The hybra side of the MXNet interop test (tests/interop/run.sh).
//
//   interop export DIR           hybra exports its models into DIR (<name>-symbol.json,
//                                <name>-0000.params) with <name>-io.params: the input and
//                                hybra's output, for MXNet to compare with; and arrays.npy,
//                                arrays.npz, for NumPy to read
//   interop check DIR [IMPORTS]  hybra imports every <name>-symbol.json of DIR and compares
//                                its output with <name>-io.params (written by the other side);
//                                each model is imported IMPORTS times (default 1), and each
//                                fresh import's first call checked: a first call once raced
//                                with the constants the import made
//
// Outputs agree when max |a - b| / max |b| <= 1e-4.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <hybra/hybra.hpp>
#include <string>
#include <vector>

namespace fs = std::filesystem;
namespace nn = hybra::nn;
using hybra::Tensor;

namespace {

constexpr double tolerance = 1e-4;

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

// softplus (MXNet's Activation softrelu) where exp would overflow float32,
// and cumsum (MXNet's numpy cumsum) on both axes.
class SoftplusCumsum : public nn::HybridBlock<SoftplusCumsum> {
 public:
  SoftplusCumsum() : HybridBlock("softpluscumsum") {}
  template <class F>
  F hybrid_forward(const F& x) {
    return cumsum(softplus(x * 100), 1) + cumsum(x, 0);
  }
};

// The fire module of SqueezeNet: a 1x1 squeeze, then 1x1 and 3x3 expansions side by side.
class Fire : public nn::HybridBlock<Fire> {
 public:
  Fire(std::int64_t squeeze, std::int64_t expand) : HybridBlock("fire") {
    squeeze_ = register_child(nn::Conv2D(squeeze, 1, 1, 0, 1, 1, "relu"));
    expand1_ = register_child(nn::Conv2D(expand, 1, 1, 0, 1, 1, "relu"));
    expand3_ = register_child(nn::Conv2D(expand, 3, 1, 1, 1, 1, "relu"));
  }
  template <class F>
  F hybrid_forward(const F& x) {
    F s = (*squeeze_)(x);
    return concat(std::vector<F>{(*expand1_)(s), (*expand3_)(s)}, 1);
  }

 private:
  std::shared_ptr<nn::Conv2D> squeeze_, expand1_, expand3_;
};

// MobileNet v2's inverted residual: 1x1 expansion, depthwise 3x3, 1x1
// projection, ReLU6 between, the input added back.
class InvertedResidual : public nn::HybridBlock<InvertedResidual> {
 public:
  InvertedResidual(std::int64_t channels, std::int64_t expansion) : HybridBlock("invertedresidual") {
    body_ = register_child(nn::HybridSequential());
    body_->add(nn::Conv2D(channels * expansion, 1, 1, 0, 1, 1, "", false), nn::BatchNorm(), nn::Activation("relu6"),
               nn::Conv2D(channels * expansion, 3, 1, 1, 1, channels * expansion, "", false), nn::BatchNorm(),
               nn::Activation("relu6"), nn::Conv2D(channels, 1, 1, 0, 1, 1, "", false), nn::BatchNorm());
  }
  template <class F>
  F hybrid_forward(const F& x) {
    return x + (*body_)(x);
  }

 private:
  std::shared_ptr<nn::HybridSequential> body_;
};

// A DenseNet layer: its input with BN-ReLU-Conv's new channels concatenated.
class DenseLayer : public nn::HybridBlock<DenseLayer> {
 public:
  explicit DenseLayer(std::int64_t growth) : HybridBlock("denselayer") {
    body_ = register_child(nn::HybridSequential());
    body_->add(nn::BatchNorm(), nn::Activation("relu"), nn::Conv2D(growth, 3, 1, 1, 1, 1, "", false));
  }
  template <class F>
  F hybrid_forward(const F& x) {
    return concat(std::vector<F>{x, (*body_)(x)}, 1);
  }

 private:
  std::shared_ptr<nn::HybridSequential> body_;
};

// BatchNorm parameters and running statistics that are not 1, 0, 0 and 1, so that they matter.
void perturb_batch_norms(nn::HybridBase& net) {
  for (hybra::nn::Parameter p : net.collect_params()) {
    const std::string name = p.name();
    auto set = [&](double low, double high) { p.set_data(hybra::random_uniform(p.data().shape(), low, high)); };
    if (name.ends_with("running_mean")) set(-0.5, 0.5);
    else if (name.ends_with("running_var")) set(0.5, 2);
    else if (name.ends_with("gamma")) set(0.5, 1.5);
    else if (name.ends_with("beta")) set(-0.2, 0.2);
  }
}

// The model's input: uniform in [-1, 1], or whole numbers in [0, tokens) (an embedding's indices, float32 as
// MXNet's data are).
void save(nn::HybridBase& net, const hybra::Shape& shape, const fs::path& dir, const std::string& name,
          std::int64_t tokens = 0) {
  net.initialize(hybra::nn::init::Xavier());
  Tensor x = tokens ? hybra::random_uniform(shape, 0, static_cast<double>(tokens))
                          .astype(hybra::DType::int64)
                          .astype(hybra::DType::float32)
                    : hybra::random_uniform(shape, -1, 1);
  net(x);
  perturb_batch_norms(net);
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
  SoftplusCumsum scan;
  save(scan, {3, 5}, dir, "softplus_cumsum");
  nn::HybridSequential convnet;
  convnet.add(nn::Conv2D(4, 3, 1, 1, 1, 1, "relu"), nn::BatchNorm(), nn::MaxPool2D(2),
              nn::Conv2D(6, 3, 2, 0, 1, 2, "", false), nn::AvgPool2D(2, 1, 1), nn::GlobalAvgPool2D(), nn::Flatten(),
              nn::Dense(5, "sigmoid"));
  save(convnet, {3, 2, 12, 12}, dir, "convnet");
  // The zoo's families, as hybra builds them: D2L's ResNet-18 (narrow), AlexNet's and VGG's
  // layers, SqueezeNet's fire modules with ceil-mode pooling, MobileNet v2's inverted residuals
  // with ReLU6, DenseNet's concatenating layers.
  auto resnet = nn::model_zoo::resnet18(10, 4);
  save(resnet, {2, 1, 28, 28}, dir, "resnet18_d2l");
  nn::HybridSequential vgg;
  vgg.add(nn::Conv2D(8, 11, 4, 2, 1, 1, "relu"), nn::MaxPool2D(3, 2), nn::Conv2D(8, 3, 1, 1, 1, 1, "", false),
          nn::BatchNorm(), nn::Activation("relu"), nn::MaxPool2D(2), nn::Flatten(), nn::Dense(16, "relu"),
          nn::Dropout(0.5), nn::Dense(10));
  save(vgg, {1, 3, 67, 67}, dir, "alexnet_vgg_layers");
  nn::HybridSequential squeeze;
  squeeze.add(nn::Conv2D(8, 3, 2, 0, 1, 1, "relu"), nn::MaxPool2D(3, 2, 0, hybra::PoolingConvention::full),
              Fire(4, 8), nn::MaxPool2D(3, 2, 0, hybra::PoolingConvention::full), Fire(4, 8), nn::Dropout(0.5),
              nn::Conv2D(10, 1, 1, 0, 1, 1, "relu"), nn::GlobalAvgPool2D(), nn::Flatten());
  save(squeeze, {1, 3, 54, 54}, dir, "squeezenet_fire");
  nn::HybridSequential mobile;
  mobile.add(nn::Conv2D(8, 3, 2, 1, 1, 1, "", false), nn::BatchNorm(), nn::Activation("relu6"),
             InvertedResidual(8, 6), InvertedResidual(8, 6), nn::GlobalAvgPool2D(), nn::Flatten(), nn::Dense(10));
  save(mobile, {2, 3, 32, 32}, dir, "mobilenetv2_blocks");
  nn::HybridSequential dense;
  dense.add(nn::Conv2D(8, 3, 1, 1, 1, 1, "", false), DenseLayer(4), DenseLayer(4), nn::BatchNorm(),
            nn::Activation("relu"), nn::AvgPool2D(2), nn::GlobalAvgPool2D(), nn::Flatten(), nn::Dense(10));
  save(dense, {2, 3, 16, 16}, dir, "densenet_layers");
  // The activations of current models, as compositions of MXNet's own ops (erf, where, exp, sigmoid, ...).
  nn::HybridSequential activations;
  activations.add(nn::Dense(8, "gelu"), nn::GELU("tanh"), nn::LeakyReLU(0.1), nn::ELU(0.5), nn::SELU(), nn::Swish(2),
                  nn::PReLU(), nn::Dense(4, "silu"));
  save(activations, {3, 6}, dir, "activations");
  // A transformer encoder layer: Dense on the last axis, batched products (batch_dot), softmax,
  // LayerNorm as mean and arithmetic, GELU.
  nn::HybridSequential encoder;
  encoder.add(nn::Dense({.units = 8, .flatten = false}),
              nn::TransformerEncoderLayer({.units = 8, .heads = 2, .hidden = 16, .activation = "gelu"}), nn::Dense(3));
  save(encoder, {2, 5, 4}, dir, "transformer_encoder");
  // Tokens through an embedding table (MXNet's Embedding) into the encoder layer.
  nn::HybridSequential tokens;
  tokens.add(nn::Embedding({.input_dim = 20, .output_dim = 8}),
             nn::TransformerEncoderLayer({.units = 8, .heads = 2, .hidden = 16}), nn::Dense(3));
  save(tokens, {2, 6}, dir, "token_encoder", 20);
  // NumPy's array files: NumPy reads what hybra writes (tests/data/numpy: hybra reads NumPy's).
  const Tensor quarters = hybra::reshape(hybra::arange(0, 6, 1, hybra::DType::float32) / 4, {2, 3});
  const Tensor longs = hybra::array<std::int64_t>({-3, 0, 7, std::int64_t{1} << 40});
  hybra::io::save_npy(dir / "arrays.npy", quarters);
  hybra::io::save_npz(dir / "arrays.npz", std::vector<std::pair<std::string, Tensor>>{{"quarters", quarters}, {"longs", longs}});
  // A float16 parameter file (MXNet's dtype code 2), as a model cast to float16 saves it.
  const Tensor halves = hybra::array<double>({1, 0.1, -65504, 1e6}).astype(hybra::DType::float16);
  hybra::io::save_ndarray_list(dir / "float16.params", std::vector<std::pair<std::string, Tensor>>{{"h", halves}});
  return 0;
}

// max |a - b| / max |b|: the error against the output's scale.
double relative_difference(const Tensor& got, const Tensor& want) {
  const auto a = got.to_vector<double>(), b = want.to_vector<double>();
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::isnan(a[i]) ? INFINITY : std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / std::max(scale, 1e-30);
}

int check_models(const fs::path& dir, int imports) {
  int checked = 0;
  double worst_all = 0;
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string file = entry.path().filename().string();
    if (file.ends_with("-symbol.json")) names.push_back(file.substr(0, file.size() - std::string("-symbol.json").size()));
  }
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    const fs::path prefix = dir / name;
    Tensor input, want;
    for (auto& [key, value] : hybra::io::load_ndarray_list(prefix.string() + "-io.params"))
      (key == "input" ? input : want) = value;
    double worst = 0;
    for (int k = 0; k < imports; ++k) {
      auto net = nn::SymbolBlock::imports(prefix.string() + "-symbol.json", {"data"}, prefix.string() + "-0000.params");
      Tensor y = net(input);
      if (y.shape() != want.shape()) {
        std::printf("%s: hybra's output has shape %s, MXNet's %s\n", name.c_str(), hybra::to_string(y.shape()).c_str(),
                    hybra::to_string(want.shape()).c_str());
        return 1;
      }
      const double first = relative_difference(y, want), second = relative_difference(net(input), want);
      if (!(first <= tolerance) || !(second <= tolerance)) {
        std::printf("%s: outputs differ in import %d (max relative difference %.1e in its first call, %.1e in its "
                    "second; tolerance %.0e)\n",
                    name.c_str(), k + 1, first, second, tolerance);
        return 1;
      }
      worst = std::max({worst, first, second});
    }
    std::printf("hybra ran MXNet's %s (%d fresh import%s): max relative difference %.1e\n", name.c_str(), imports,
                imports == 1 ? "" : "s", worst);
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
  const std::string mode = argc >= 3 ? argv[1] : "";
  const int imports = mode == "check" && argc == 4 ? std::atoi(argv[3]) : 1;
  if ((mode != "export" && mode != "check") || argc > (mode == "check" ? 4 : 3) || imports < 1) {
    std::fprintf(stderr, "usage: interop export DIR | interop check DIR [IMPORTS]\n");
    return 2;
  }
  try {
    return mode == "export" ? export_models(argv[2]) : check_models(argv[2], imports);
  } catch (const hybra::Error& e) {
    std::fprintf(stderr, "interop: %s\n", e.what());
    return 1;
  }
}
