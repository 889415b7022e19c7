// conv2d, pooling, their gradients and batch_norm on cuda(i), checked
// without a GPU against the stand-in driver and cuBLAS of tests/fake_cuda
// (launches are recorded, not run): which kernels and GEMMs each op queues,
// that the ops' errors are the CPU's, and that LeNet trains on cuda(0),
// eagerly and hybridized, with every op of its step on the GPU. What the
// kernels compute is checked on simulated threads (test_cuda_kernels.cpp)
// and on a real GPU (test_gpu.cpp).
//
// Run by ctest's `unit_cuda_fake`, with the stand-ins loaded (see
// test_cuda_runtime.cpp).
#include <dlfcn.h>
#include <doctest/doctest.h>

#include <cstdlib>
#include <hybra/hybra.hpp>
#include <string>

#include "training.hpp"

using namespace hybra;

namespace {

// The stand-ins' counters (tests/fake_cuda/), once hybra has loaded them.
struct FakeCounters {
  FakeCounters() {
    REQUIRE_MESSAGE(backend::cuda::driver_status().problem.empty(), "run with HYBRA_CUDA_DRIVER naming the stand-in driver");
    backend::cuda::cublas();
  }
  template <class F>
  static F hook(const char* env, const char* name) {
    void* lib = ::dlopen(std::getenv(env), RTLD_NOW | RTLD_NOLOAD);
    REQUIRE(lib);
    void* f = ::dlsym(lib, name);
    REQUIRE(f != nullptr);
    return reinterpret_cast<F>(f);
  }
  long launches() const {
    return hook<long (*)(const char*)>("HYBRA_CUDA_DRIVER", "hybra_fake_cuda_calls")("cuLaunchKernel");
  }
  std::string last_launch() const { return hook<const char* (*)()>("HYBRA_CUDA_DRIVER", "hybra_fake_cuda_last_launch")(); }
  long gemms() const { return hook<long (*)()>("HYBRA_CUBLAS", "hybra_fake_cublas_gemms")(); }
};

// LeNet-5 as examples/lenet_inference builds it, with parameters of dtype d.
void add_lenet(nn::HybridSequential& net, DType d) {
  net.add(nn::Conv2D(6, 5, 1, 2, 1, 1, "relu", true, 0, d), nn::MaxPool2D(2),
          nn::Conv2D(16, 5, 1, 0, 1, 1, "relu", true, 0, d), nn::MaxPool2D(2), nn::Flatten(),
          nn::Dense(120, "relu", 0, true, d), nn::Dense(84, "relu", 0, true, d), nn::Dense(10, "", 0, true, d));
}

}  // namespace

TEST_SUITE("cuda fake" * doctest::skip()) {
  TEST_CASE("cuda fake: conv2d and its gradients are im2col, col2im and friends around a GEMM per group and chunk") {
    const FakeCounters fake;
    const Tensor x = ones({4, 1, 28, 28}, DType::float32, cuda(0)), w = ones({6, 1, 5, 5}, DType::float32, cuda(0));
    const Tensor b = ones({6}, DType::float32, cuda(0));
    long launches = fake.launches(), gemms = fake.gemms();
    const Tensor y = conv2d(x, w, b, 1, 2);
    waitall();
    CHECK(y.device() == cuda(0));
    CHECK(y.shape() == Shape{4, 6, 28, 28});
    CHECK(fake.launches() == launches + 2);  // im2col, then the product to NCHW plus the bias
    CHECK(fake.gemms() == gemms + 1);        // all four images in one GEMM
    CHECK(fake.last_launch() == "hybra_conv_conv_output_float32");

    launches = fake.launches();
    gemms = fake.gemms();
    const Tensor grouped = conv2d(ones({2, 4, 7, 7}, DType::float64, cuda(0)), ones({6, 2, 3, 3}, DType::float64, cuda(0)),
                                  {}, 2, 1, 1, 2);
    waitall();
    CHECK(grouped.shape() == Shape{2, 6, 4, 4});
    CHECK(grouped.dtype() == DType::float64);
    CHECK(fake.launches() == launches + 2);
    CHECK(fake.gemms() == gemms + 2);  // a GEMM per group
    CHECK(fake.last_launch() == "hybra_conv_conv_output_float64");

    launches = fake.launches();
    gemms = fake.gemms();
    const Tensor dy = ones({4, 6, 28, 28}, DType::float32, cuda(0));
    const Tensor dx = conv2d_backward_data(dy, w, x.shape(), 1, 2, 1, 1);
    waitall();
    CHECK(dx.shape() == x.shape());
    CHECK(fake.launches() == launches + 2);  // dy filter-major, then each input element gathers its taps
    CHECK(fake.gemms() == gemms + 1);
    CHECK(fake.last_launch() == "hybra_conv_col2im_float32");
    const Tensor dw = conv2d_backward_weight(dy, x, w.shape(), 1, 2, 1, 1);
    waitall();
    CHECK(dw.shape() == w.shape());
    CHECK(fake.launches() == launches + 4);
    CHECK(fake.gemms() == gemms + 2);
    CHECK(fake.last_launch() == "hybra_conv_im2col_float32");

    // Operands of two dtypes are converted first, as on the CPU.
    const Tensor mixed = conv2d(x, w.astype(DType::float64), b);
    waitall();
    CHECK(mixed.dtype() == DType::float64);
    CHECK(fake.last_launch() == "hybra_conv_conv_output_float64");
    // The ops' errors are the CPU's.
    CHECK_THROWS_WITH_AS(conv2d(ones({1, 2, 5, 5}, DType::float32, cuda(0)), ones({3, 1, 3, 3}, DType::float32, cuda(0))),
                         doctest::Contains("conv2d: input of shape (1, 2, 5, 5) (2 channels in 1 group) does not match weight of shape (3, 1, 3, 3)"),
                         ShapeError);
    CHECK_THROWS_WITH_AS(conv2d(ones({1, 1, 5, 5}, DType::int32, cuda(0)), ones({1, 1, 3, 3}, DType::int32, cuda(0))),
                         doctest::Contains("conv2d: dtype int32 is not supported (float32 or float64)"), DTypeError);
    CHECK_THROWS_WITH_AS(conv2d(x, ones({6, 1, 5, 5}, DType::float32, cuda(1))),
                         doctest::Contains("operands live on cuda(0) and cuda(1)"), DeviceError);
  }

  TEST_CASE("cuda fake: pooling, its gradient and batch_norm are one kernel each on cuda(0)") {
    const FakeCounters fake;
    const Tensor x = ones({2, 3, 8, 8}, DType::float32, cuda(0));
    const long launches = fake.launches(), gemms = fake.gemms();
    const Tensor m = max_pool2d(x, 2, 2);
    waitall();
    CHECK(m.shape() == Shape{2, 3, 4, 4});
    CHECK(fake.last_launch() == "hybra_max_pool2d_float32");
    const Tensor a = avg_pool2d(x, 3, 2, 1, false);
    waitall();
    CHECK(a.shape() == Shape{2, 3, 4, 4});
    CHECK(fake.last_launch() == "hybra_avg_pool2d_float32");
    const Tensor g = global_max_pool2d(x);
    waitall();
    CHECK(g.shape() == Shape{2, 3, 1, 1});
    CHECK(fake.last_launch() == "hybra_max_pool2d_float32");
    const Tensor dx = pool2d_backward(ones({2, 3, 4, 4}, DType::float32, cuda(0)), x, true, 2, 2, 0, true);
    waitall();
    CHECK(dx.shape() == x.shape());
    CHECK(fake.last_launch() == "hybra_max_pool2d_backward_disjoint_float32");  // a thread per window
    const Tensor overlapping = pool2d_backward(ones({2, 3, 6, 6}, DType::float32, cuda(0)), x, true, 3, 1, 0, true);
    waitall();
    CHECK(overlapping.shape() == x.shape());
    CHECK(fake.last_launch() == "hybra_max_pool2d_backward_float32");  // a thread per input element
    const Tensor c = ones({3}, DType::float32, cuda(0));
    const Tensor bn = batch_norm(x, c, c, c, c);
    waitall();
    CHECK(bn.shape() == x.shape());
    CHECK(fake.last_launch() == "hybra_batch_norm_float32");
    CHECK(fake.launches() == launches + 6);
    CHECK(fake.gemms() == gemms);
    CHECK_THROWS_WITH_AS(max_pool2d(x, 2, 2, 2), doctest::Contains("max_pool2d: padding (2, 2) must be smaller than the kernel (2, 2)"),
                         ValueError);
  }

  TEST_CASE("cuda fake: LeNet trains on cuda(0), eager and hybridized: every op of the step has a GPU path") {
    const FakeCounters fake;
    for (bool hybridized : {false, true}) {
      CAPTURE(hybridized);
      nn::HybridSequential net;
      // float64: this suite's reductions case (test_cuda_runtime.cpp) counts the first loads of the float32 programs.
      add_lenet(net, DType::float64);
      net.initialize(nn::init::Xavier(), cuda(0));
      if (hybridized) net.hybridize();
      const Tensor X = ones({8, 1, 28, 28}, DType::float64, cuda(0)), y = zeros({8}, DType::int32, cuda(0));
      const long launches = fake.launches(), gemms = fake.gemms();
      test::train_steps(net, X, y, 2);
      waitall();  // an op without a GPU path would have thrown, naming itself
      CHECK(fake.launches() > launches);
      CHECK(fake.gemms() > gemms);  // the convolutions' products, forward and backward
      for (const auto& p : net.collect_params()) {
        CAPTURE(p.name());
        CHECK(p.data().device() == cuda(0));
        CHECK(p.grad().device() == cuda(0));
      }
      if (hybridized) {
        for (int call = 0; call < 3; ++call) net(X);
        waitall();
        CHECK(net.plan().replays_graph());  // convolutions and pools are launch steps of the plan
        CHECK(net.plan().graphs_recorded() == 1);
      }
    }
  }
}
