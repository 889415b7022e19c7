// Tensors on cuda(i), checked without a GPU against the stand-in driver of
// tests/fake_cuda (two "GPUs" whose memory is host memory; launches are
// recorded, not run): devices, memory and its cache, out-of-memory, copies
// through pinned staging and between GPUs, fills, an expression as one
// NVRTC-compiled kernel loaded and launched, errors the device reports
// after a launch blamed on the op, and ops with no CUDA kernel refused by
// name. What kernels compute is checked on a real GPU (tests/gpu).
//
// The suite needs the stand-in loaded in place of libcuda.so.1, so it is
// skipped in the main run and run by ctest's `cuda_fake`:
//   HYBRA_CUDA_DRIVER=.../libhybra_fake_cuda.so hybra_tests --no-skip -ts="cuda fake"
#include <dlfcn.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <hybra/hybra.hpp>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

using namespace hybra;

namespace {

// The stand-in's test hooks (tests/fake_cuda/fake_driver.cpp).
struct FakeDriver {
  void* handle = ::dlopen(std::getenv("HYBRA_CUDA_DRIVER"), RTLD_NOW | RTLD_NOLOAD);
  template <class F>
  F hook(const char* name) const {
    REQUIRE(handle);
    void* f = ::dlsym(handle, name);
    REQUIRE(f != nullptr);
    return reinterpret_cast<F>(f);
  }
  long calls(const char* call) const { return hook<long (*)(const char*)>("hybra_fake_cuda_calls")(call); }
  std::string last_launch() const { return hook<const char* (*)()>("hybra_fake_cuda_last_launch")(); }
  void fail_next_sync(int error) const { hook<void (*)(int)>("hybra_fake_cuda_fail_next_sync")(error); }
};

std::vector<float> staged_values(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 1000) - 500.0f;
  return v;
}

}  // namespace

TEST_SUITE("cuda fake" * doctest::skip()) {
  TEST_CASE("cuda fake: the driver's GPUs are devices") {
    const auto& s = backend::cuda::driver_status();
    REQUIRE_MESSAGE(s.problem.empty(), "run with HYBRA_CUDA_DRIVER naming the stand-in driver: ", s.problem);
    REQUIRE(s.gpus.size() == 2);
    CHECK(s.gpus[1].name == "hybra fake GPU 1");
    CHECK(s.gpus[0].major == 9);
    CHECK(backend::cuda::gpu(0).arch() == "compute_90");
    CHECK(devices() == std::vector<Device>{cpu(0), cuda(0), cuda(1)});
    CHECK_THROWS_WITH_AS(zeros({2}, DType::float32, cuda(2)),
                         doctest::Contains("there is no cuda(2): the CUDA driver sees 2 GPUs"), DeviceError);
  }

  TEST_CASE("cuda fake: values go to a GPU, between GPUs and back, through the staging buffers") {
    // 12 MiB: three chunks through the two 4 MiB pinned buffers each way.
    const std::vector<float> values = staged_values(3 << 20);
    const Shape shape{3, 1 << 20};
    Tensor on_gpu = array(values, shape, cuda(0));
    CHECK(on_gpu.device() == cuda(0));
    CHECK(on_gpu.to_vector<float>() == values);
    Tensor on_other = on_gpu.to(cuda(1));
    CHECK(on_other.device() == cuda(1));
    CHECK(on_other.to(cpu()).to_vector<float>() == values);
    CHECK(on_other.copy().to_vector<float>() == values);
    CHECK(array<std::int64_t>({-3, 1LL << 40}, {2}, cuda(1)).to_vector<std::int64_t>() ==
          std::vector<std::int64_t>{-3, 1LL << 40});
    // Views and other dtypes are made contiguous and converted on the host's side.
    Tensor small = array<float>({1, 2, 3, 4, 5, 6}, {2, 3});
    CHECK(transpose(small).to(cuda(0)).to_vector<float>() == transpose(small).to_vector<float>());
    Tensor as_double = zeros({2, 3}, DType::float64, cuda(1));
    small.copy_to(as_double);
    CHECK(as_double.to_vector<double>() == std::vector<double>{1, 2, 3, 4, 5, 6});
    Tensor host_view = zeros({3, 2});
    small.to(cuda(0)).copy_to(transpose(host_view));
    CHECK(host_view.to_vector<float>() == std::vector<float>{1, 4, 2, 5, 3, 6});
    // Saved through the host, loaded to the CPU.
    const std::vector<std::pair<std::string, Tensor>> named{{"w", on_other}};
    const auto file = std::filesystem::temp_directory_path() / ("hybra-cuda-fake-" + std::to_string(::getpid()));
    io::save_ndarray_list(file, named);
    const auto loaded = io::load_ndarray_list(file);
    std::filesystem::remove(file);
    CHECK(loaded.at(0).second.to_vector<float>() == values);
    std::ostringstream shown;
    shown << array<float>({1, 2}, {2}, cuda(1));
    CHECK(shown.str() == "[1. 2.]\n<Tensor 2 @cuda(1)>");
  }

  TEST_CASE("cuda fake: fills of every dtype") {
    CHECK(zeros({3}, DType::float32, cuda(0)).to_vector<float>() == std::vector<float>{0, 0, 0});
    CHECK(ones({2}, DType::uint8, cuda(0)).to_vector<int>() == std::vector<int>{1, 1});
    CHECK(full({2}, -7, DType::int32, cuda(0)).to_vector<int>() == std::vector<int>{-7, -7});
    CHECK(full({2}, -1, DType::int64, cuda(1)).to_vector<std::int64_t>() == std::vector<std::int64_t>{-1, -1});
    CHECK(full({3}, 2.5, DType::float64, cuda(0)).to_vector<double>() == std::vector<double>{2.5, 2.5, 2.5});
    CHECK(arange(0, 4, 1, DType::float32, cuda(0)).to_vector<float>() == std::vector<float>{0, 1, 2, 3});
    seed(3);
    const auto on_cpu = random_uniform({5}).to_vector<float>();
    seed(3);
    CHECK(random_uniform({5}, 0, 1, DType::float32, cuda(0)).to_vector<float>() == on_cpu);
  }

  TEST_CASE("cuda fake: freed blocks are reused, and the cache is given back when memory runs out") {
    FakeDriver fake;
    auto& memory = backend::cuda::gpu(1).memory();
    memory.empty_cache();
    { Tensor t({1000}, DType::float32, cuda(1)); }
    const auto before = memory.stats();
    CHECK(before.cached >= 4000);
    { Tensor t({990}, DType::float32, cuda(1)); }  // fits the cached block
    CHECK(memory.stats().driver_allocations == before.driver_allocations);
    {
      Tensor t({1000}, DType::float32, cuda(1));
      CHECK(memory.stats().in_use >= 4000);
    }
    // The stand-in has 64 MiB per GPU: 40 MiB cached, then 50 MiB asked for.
    { Tensor t({10 << 20}, DType::float32, cuda(1)); }
    CHECK(memory.stats().cached >= (40u << 20));
    const long frees = fake.calls("cuMemFree");
    Tensor big({50 << 18}, DType::float32, cuda(1));
    CHECK(fake.calls("cuMemFree") > frees);
    CHECK(memory.stats().cached == 0);
    CHECK_THROWS_WITH_AS(Tensor({100 << 20}, DType::float32, cuda(1)),
                         doctest::Contains("out of memory on cuda(1): 419430400 bytes requested"), OutOfMemory);
    CHECK_THROWS_WITH_AS(Tensor({100 << 20}, DType::float32, cuda(1)),
                         doctest::Contains("shape (104857600,) and dtype float32"), OutOfMemory);
  }

  TEST_CASE("cuda fake: an expression is one kernel, compiled once and launched each time") {
    FakeDriver fake;
    Tensor a = array<float>({1, -2, 3}, {3}, cuda(0)), b = ones({3}, DType::float32, cuda(0));
    const long loads = fake.calls("cuModuleLoadData"), launches = fake.calls("cuLaunchKernel");
    Tensor y = relu(a * b + 2);
    y.wait_to_read();
    CHECK(y.device() == cuda(0));
    CHECK(y.shape() == Shape{3});
    CHECK(fake.calls("cuLaunchKernel") == launches + 1);
    CHECK(fake.calls("cuModuleLoadData") == loads + 1);
    CHECK(fake.last_launch().rfind("hybra_fused_", 0) == 0);
    Tensor again = relu(b * a + 2);  // other tensors, the same expression type
    Tensor twice = relu(y * b + 2);
    waitall();
    CHECK(fake.calls("cuLaunchKernel") == launches + 3);
    CHECK(fake.calls("cuModuleLoadData") == loads + 1);
  }

  TEST_CASE("cuda fake: an error the device reports after a launch fails the op that launched it") {
    FakeDriver fake;
    Tensor a = ones({4}, DType::float32, cuda(0));
    waitall();
    fake.fail_next_sync(700);  // CUDA_ERROR_ILLEGAL_ADDRESS
    Tensor y = exp(a * 3);
    CHECK_THROWS_WITH_AS(y.wait_to_read(), doctest::Contains("engine op 'exp(Tensor * int)' on cuda(0) failed"),
                         DeviceError);
    CHECK_THROWS_WITH_AS(y.wait_to_read(),
                         doctest::Contains("CUDA_ERROR_ILLEGAL_ADDRESS (700): an illegal memory access was encountered"),
                         DeviceError);
    CHECK_NOTHROW(Tensor(exp(a * 3)).wait_to_read());
  }

  TEST_CASE("cuda fake: products go to cuBLAS row-major, transposed views and batches included") {
    seed(11);
    auto same = [](const Tensor& on_gpu, const Tensor& on_cpu) {
      CHECK(on_gpu.device() == cuda(0));
      CHECK(on_gpu.shape() == on_cpu.shape());
      const auto g = on_gpu.to_vector<double>(), c = on_cpu.to_vector<double>();
      double worst = 0;
      for (std::size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::abs(g[i] - c[i]));
      CHECK(worst <= 1e-5);
    };
    Tensor a = random_uniform({2, 3, 4}, -1, 1), b = random_uniform({4, 5}, -1, 1), c = random_uniform({2, 4, 5}, -1, 1);
    Tensor ga = a.to(cuda(0)), gb = b.to(cuda(0)), gc = c.to(cuda(0));
    same(matmul(ga, gb), matmul(a, b));                                        // one right operand: rows folded
    same(matmul(ga, gc), matmul(a, c));                                        // a batch of products
    same(matmul(transpose(gb), transpose(ga, {0, 2, 1})), matmul(transpose(b), transpose(a, {0, 2, 1})));
    Tensor v = random_uniform({4}, -1, 1);
    same(matmul(v.to(cuda(0)), gb), matmul(v, b));                            // a row times a matrix
    Tensor d = random_uniform({3, 4}, -1, 1, DType::float64);
    same(matmul(d.to(cuda(0)), transpose(d.to(cuda(0)))), matmul(d, transpose(d)));
    same(matmul(zeros({3, 0}, DType::float32, cuda(0)), zeros({0, 2}, DType::float32, cuda(0))), zeros({3, 2}));
    Tensor x = random_uniform({6, 4}, -1, 1), w = random_uniform({3, 4}, -1, 1), bias = random_uniform({3}, -1, 1);
    same(fully_connected(x.to(cuda(0)), w.to(cuda(0)), bias.to(cuda(0))), fully_connected(x, w, bias));
    same(fully_connected(x.to(cuda(0)), w.to(cuda(0))), fully_connected(x, w));
    CHECK_THROWS_WITH_AS(matmul(ones({2, 2}, DType::int32, cuda(0)), ones({2, 2}, DType::int32, cuda(0))),
                         doctest::Contains("matmul: int32 products are not done on a GPU"), DTypeError);
  }

  TEST_CASE("cuda fake: the chapter's MLP runs eagerly on a GPU; hybridized, it says it cannot yet") {
    FakeDriver fake;
    nn::HybridSequential net;
    net.add(nn::Dense(256, "relu"), nn::Dense(128, "relu"), nn::Dense(2));
    net.initialize(nn::init::Uniform(), cuda(0));
    const long launches = fake.calls("cuLaunchKernel");
    Tensor y = net(random_normal({1, 512}, 0, 1, DType::float32, cuda(0)));
    y.wait_to_read();
    CHECK(y.shape() == Shape{1, 2});
    CHECK(y.device() == cuda(0));
    CHECK(fake.calls("cuLaunchKernel") == launches + 2);  // the two relus; the products are cuBLAS's
    for (const auto& p : net.collect_params()) CHECK(p.data().device() == cuda(0));
    net.hybridize();
    CHECK_THROWS_WITH_AS(net(random_normal({1, 512}, 0, 1, DType::float32, cuda(0))),
                         doctest::Contains("a hybridized block runs on the CPU only so far"), DeviceError);
  }

  TEST_CASE("cuda fake: what does not run on a GPU yet is refused by name") {
    Tensor a = ones({2, 2}, DType::float32, cuda(0));
    CHECK_THROWS_WITH_AS(dot(a, a), doctest::Contains("dot: this op has no CUDA kernel yet"), DeviceError);
    CHECK_THROWS_WITH_AS(sum(a), doctest::Contains("operand lives on cuda(0)"), DeviceError);
    CHECK_THROWS_WITH_AS(Tensor(a + a.to(cuda(1))), doctest::Contains("operands live on cuda(0) and cuda(1)"), DeviceError);
    CHECK_THROWS_WITH_AS(Tensor(a + ones({2}, DType::float32, cuda(0))),
                         doctest::Contains("every tensor of an expression has the result's shape"), DeviceError);
    CHECK_THROWS_WITH_AS(a.astype(DType::float64), doctest::Contains("converting float32 to float64"), DTypeError);
    CHECK_THROWS_WITH_AS(transpose(a).contiguous(), doctest::Contains("not contiguous"), DeviceError);
    CHECK_THROWS_WITH_AS(transpose(a).to(cuda(1)), doctest::Contains("not contiguous"), DeviceError);
  }
}
