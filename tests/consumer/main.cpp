// Computes a fused expression through the public header and checks the values,
// fills layer options by name;
// with GCC (CMakeLists.txt), trains a small hybridized network a few steps, so
// the build compiles what a training program compiles (autograd's rules, the
// optimizers); where NVRTC is, compiles a GPU reduction from the device
// code (kernels/) the package ships, found where it was installed; and checks
// that the version the build found is the headers' (HYBRA_CONSUMER_EXPECTS_VERSION).
#include <hybra/hybra.hpp>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

int main() {
  hybra::Tensor a = hybra::array({-3.0f, 1.0f, 0.5f, 2.0f});
  hybra::Tensor b = hybra::array({1.0f, 4.0f, 2.0f, 3.0f});
  hybra::Tensor c = hybra::relu(a * b + 2);  // one fused pass

  const std::vector<float> expected = {0.0f, 6.0f, 3.0f, 8.0f};
  std::vector<float> got = c.to_vector<float>();
  bool ok = c.dtype() == hybra::DType::float32 && got.size() == expected.size();
  for (std::size_t i = 0; ok && i < got.size(); ++i) ok = std::fabs(got[i] - expected[i]) < 1e-6f;
  std::printf("relu(a * b + 2) = [");
  for (std::size_t i = 0; i < got.size(); ++i) std::printf(i ? ", %g" : "%g", static_cast<double>(got[i]));
  std::printf("]: %s\n", ok ? "PASS" : "FAIL (expected [0, 6, 3, 8])");

  // Layer options by name, under -Wextra: every field has its default, so
  // none is a "missing initializer" (GCC warns of a field without one).
  namespace nn = hybra::nn;
  const nn::Dense::Options dense{.units = 2, .activation = "relu", .flatten = false};
  const nn::LayerNorm::Options norm{.epsilon = 1e-6};
  const nn::MultiHeadAttention::Options attention{.units = 8, .heads = 2};
  const nn::TransformerEncoderLayer::Options encoder{.units = 8, .heads = 2, .hidden = 16};
  const nn::Conv2D::Options conv{.channels = 4, .kernel_size = 3, .padding = 1};
  const nn::MaxPool2D::Options pool{.pool_size = 3, .ceil_mode = true};
  const nn::AvgPool2D::Options average{.count_include_pad = false};
  const nn::BatchNorm::Options batch_norm{.momentum = 0.99};
  const bool named_ok = dense.units == 2 && !dense.flatten && dense.use_bias && norm.axis == -1 &&
                        attention.use_bias && encoder.activation == "relu" && conv.groups == 1 &&
                        pool.ceil_mode && average.pool_size == hybra::Size2d(2) && batch_norm.epsilon == 1e-5;
  std::printf("layer options by name: %s\n", named_ok ? "PASS" : "FAIL");
  ok = ok && named_ok;

#ifdef HYBRA_CONSUMER_TRAINS
  hybra::seed(1);
  nn::HybridSequential net;
  net.add(nn::Dense({.units = 8, .activation = "relu"}), nn::Dense(3));
  net.initialize(nn::init::Xavier());
  net.hybridize();
  hybra::Trainer trainer(net.collect_params(), "sgd", {{"learning_rate", 0.1}, {"momentum", 0.9}});
  const nn::SoftmaxCrossEntropyLoss loss_fn;
  const hybra::Tensor x = hybra::random_normal({32, 4});
  const hybra::Tensor y = hybra::random_uniform({32}, 0, 3).astype(hybra::DType::int32);
  double first = 0, last = 0;
  for (int step = 0; step < 20; ++step) {
    hybra::Tensor loss;
    {
      hybra::autograd::record rec;
      loss = loss_fn(net(x), y);
    }
    loss.backward();
    trainer.step(32);
    (step == 0 ? first : last) = hybra::mean(loss).item<double>();
  }
  const bool trained = last < first;
  std::printf("training: loss %.4f -> %.4f: %s\n", first, last, trained ? "PASS" : "FAIL");
  ok = ok && trained;
#endif

  std::printf("device code in %s", hybra::backend::cuda::kernels_parent_dir().c_str());
  if (hybra::backend::cuda::nvrtc().loaded()) {
    const std::string ptx = hybra::backend::cuda::cuda_ptx(
        hybra::backend::cuda::cuda_reduce_program(hybra::backend::cuda::Reduction::sum, hybra::DType::float32, false),
        "sum.cu");
    const bool compiled = ptx.find(".entry hybra_sum_float32_rows_in_out") != std::string::npos;
    std::printf(": sum compiled by NVRTC: %s\n", compiled ? "PASS" : "FAIL");
    ok = ok && compiled;
  } else {
    std::printf(" (no NVRTC here: not compiled)\n");
  }

  // The version the build system found (CMake's package, pkg-config's
  // --modversion) is the one the headers say.
#ifdef HYBRA_CONSUMER_EXPECTS_VERSION
  const bool same_version = hybra::version == HYBRA_CONSUMER_EXPECTS_VERSION;
  std::printf("hybra %s, found as %s: %s\n", std::string(hybra::version).c_str(), HYBRA_CONSUMER_EXPECTS_VERSION,
              same_version ? "PASS" : "FAIL");
  ok = ok && same_version;
#endif
  return ok ? 0 : 1;
}
