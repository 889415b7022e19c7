// Tensors on cuda(i), checked without a GPU against the stand-in driver of
// tests/fake_cuda (two "GPUs" whose memory is host memory; launches are
// recorded, not run): devices, memory and its cache, out-of-memory, copies
// through pinned staging and between GPUs, fills, an expression as one
// NVRTC-compiled kernel loaded and launched, errors the device reports
// after a launch blamed on the op, views written by copy kernels, and operands on two GPUs refused by
// name. What kernels compute is checked on a real GPU (tests/gpu).
//
// The suite needs the stand-in loaded in place of libcuda.so.1, so it is
// skipped in the main run and run by ctest's `cuda_fake`:
//   HYBRA_CUDA_DRIVER=.../libhybra_fake_cuda.so hybra_tests --no-skip -ts="cuda fake"
#include <dlfcn.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <hybra/hybra.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "training.hpp"

using namespace hybra;

namespace {

// The stand-ins' test hooks (tests/fake_cuda/).
struct FakeDriver {
  // Probing the driver loads the stand-in, whichever test runs first.
  void* handle = (backend::cuda::driver_status(), ::dlopen(std::getenv("HYBRA_CUDA_DRIVER"), RTLD_NOW | RTLD_NOLOAD));
  template <class F>
  F hook(const char* name) const {
    REQUIRE(handle);
    void* f = ::dlsym(handle, name);
    REQUIRE(f != nullptr);
    return reinterpret_cast<F>(f);
  }
  long calls(const char* call) const { return hook<long (*)(const char*)>("hybra_fake_cuda_calls")(call); }
  std::string last_launch() const { return hook<const char* (*)()>("hybra_fake_cuda_last_launch")(); }
  // Parameter i of the latest launch, as a T.
  template <class T>
  T last_launch_param(int i) const {
    T value{};
    CHECK(hook<long (*)(int, void*, long)>("hybra_fake_cuda_last_launch_param")(i, &value, sizeof value) ==
          static_cast<long>(sizeof value));
    return value;
  }
  void fail_next_sync(int error) const { hook<void (*)(int)>("hybra_fake_cuda_fail_next_sync")(error); }
  template <class F>
  F library_hook(const char* env, const char* name) const {
    void* lib = ::dlopen(std::getenv(env), RTLD_NOW);  // the library hybra loads (or will: the same handle)
    REQUIRE(lib);
    void* f = ::dlsym(lib, name);
    REQUIRE(f != nullptr);
    return reinterpret_cast<F>(f);
  }
  template <class F>
  F cublas_hook(const char* name) const {
    return library_hook<F>("HYBRA_CUBLAS", name);
  }
  long nccl_calls(const char* call) const {
    return library_hook<long (*)(const char*)>("HYBRA_NCCL", "hybra_fake_nccl_calls")(call);
  }
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
    // Some drivers refuse more than a GPU has as an invalid value: still out of memory.
    fake.hook<void (*)(int)>("hybra_fake_cuda_refuse_more_than_capacity_with")(1);  // CUDA_ERROR_INVALID_VALUE
    CHECK_THROWS_WITH_AS(Tensor({100 << 20}, DType::float32, cuda(1)),
                         doctest::Contains("CUDA_ERROR_INVALID_VALUE"), OutOfMemory);
    fake.hook<void (*)(int)>("hybra_fake_cuda_refuse_more_than_capacity_with")(2);
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

  TEST_CASE("cuda fake: an expression's scalars are its kernel's arguments: one kernel serves every value") {
    FakeDriver fake;
    Tensor a = ones({5}, DType::float32, cuda(0));
    const long loads = fake.calls("cuModuleLoadData");
    for (float scale : {2.0f, 3.0f, -0.25f}) {
      Tensor y = a * scale + 1;
      y.wait_to_read();
      // in0, out, n, then the constants in the expression's order: scale (a float), 1 (as the dtype, float)
      CHECK(fake.last_launch_param<float>(3) == scale);
      CHECK(fake.last_launch_param<float>(4) == 1.0f);
    }
    CHECK(fake.calls("cuModuleLoadData") == loads + 1);
    // Integer expressions run node by node (docs/architecture.md): the scalar
    // is a 0-d operand of the add node's one launch.
    Tensor i = ones({5}, DType::int64, cuda(0));
    const long launches = fake.calls("cuLaunchKernel");
    Tensor shifted = i + 7;
    shifted.wait_to_read();
    CHECK(shifted.dtype() == DType::int64);
    CHECK(fake.calls("cuLaunchKernel") == launches + 1);
    CHECK(fake.last_launch().rfind("hybra_fused_", 0) == 0);
  }

  TEST_CASE("cuda fake: node by node (eval_unfused, autograd), an op is a kernel of its own, compiled once") {
    FakeDriver fake;
    Tensor a = array<float>({1, -2, 3}, {3}, cuda(0)), b = ones({3}, DType::float32, cuda(0));
    const long launches = fake.calls("cuLaunchKernel");
    Tensor y = eval_unfused(relu(a * b + 2));
    waitall();
    CHECK(y.device() == cuda(0));
    CHECK(y.dtype() == DType::float32);
    CHECK(fake.calls("cuLaunchKernel") == launches + 3);  // multiply, add, relu
    CHECK(fake.last_launch().rfind("hybra_fused_", 0) == 0);
    const long loads = fake.calls("cuModuleLoadData");
    Tensor again = eval_unfused(relu(b * a + 2));
    waitall();
    CHECK(fake.calls("cuLaunchKernel") == launches + 6);
    CHECK(fake.calls("cuModuleLoadData") == loads);
  }

  TEST_CASE("cuda fake: GPU ops do not wait for their work; another GPU waits on its stream, the host on an event") {
    FakeDriver fake;
    const std::vector<float> values = staged_values(1 << 16);
    Tensor y = array<float>(values, {1 << 16}, cuda(0));
    waitall();
    const long stream_syncs = fake.calls("cuStreamSynchronize"), stream_waits = fake.calls("cuStreamWaitEvent");
    // Each copy is queued on the receiving GPU's stream behind a wait for the other GPU's work.
    for (int k = 1; k <= 10; ++k) y = y.to(cuda(k % 2));
    Tensor host = y.to(cpu());
    Tensor sum = host + 1;  // a host op: waits for the copy's event first
    std::vector<float> expected = values;
    for (float& v : expected) v += 1;
    CHECK(sum.to_vector<float>() == expected);
    CHECK(fake.calls("cuStreamSynchronize") == stream_syncs);
    CHECK(fake.calls("cuStreamWaitEvent") == stream_waits + 10);
  }

  TEST_CASE("cuda fake: an error the device reports after a launch is reported by every wait for that work, naming the op") {
    FakeDriver fake;
    Tensor a = ones({4}, DType::float32, cuda(0));
    waitall();
    const std::string reported =
        "the work queued on cuda(0) up to the end of op 'exp(Tensor * int)' failed on the device: "
        "CUDA_ERROR_ILLEGAL_ADDRESS (700): an illegal memory access was encountered";
    fake.fail_next_sync(700);
    Tensor y = exp(a * 3);
    CHECK_THROWS_WITH_AS(y.wait_to_read(), doctest::Contains(reported.c_str()), DeviceError);
    CHECK_THROWS_WITH_AS(y.wait_to_read(), doctest::Contains(reported.c_str()), DeviceError);
    CHECK_THROWS_WITH_AS(waitall(), doctest::Contains(reported.c_str()), DeviceError);  // the GPU's latest work
    CHECK_NOTHROW(waitall());
    CHECK_NOTHROW(Tensor(exp(a * 3)).wait_to_read());

    fake.fail_next_sync(700);
    Tensor unread = exp(a * 3);  // no wait names it: waitall reports it
    CHECK_THROWS_WITH_AS(waitall(), doctest::Contains(reported.c_str()), DeviceError);
    CHECK_NOTHROW(waitall());
  }

  TEST_CASE("cuda fake: with synchronous ops, a device error fails the very op that caused it") {
    FakeDriver fake;
    Tensor a = ones({4}, DType::float32, cuda(0));
    waitall();
    backend::cuda::set_synchronous_ops(true);
    fake.fail_next_sync(700);
    Tensor y = exp(a * 3);
    CHECK_THROWS_WITH_AS(y.wait_to_read(), doctest::Contains("engine op 'exp(Tensor * int)' on cuda(0) failed"),
                         DeviceError);
    CHECK_THROWS_WITH_AS(y.wait_to_read(),
                         doctest::Contains("CUDA_ERROR_ILLEGAL_ADDRESS (700): an illegal memory access was encountered"),
                         DeviceError);
    CHECK_NOTHROW(Tensor(exp(a * 3)).wait_to_read());
    backend::cuda::set_synchronous_ops(false);
  }

  TEST_CASE("cuda fake: float32 products use TF32 tensor cores only when asked (set_tf32, HYBRA_CUDA_TF32=1)") {
    FakeDriver fake;
    auto math_mode = [&] { return fake.cublas_hook<int (*)()>("hybra_fake_cublas_math_mode")(); };
    auto lt_compute = [&] { return fake.cublas_hook<int (*)()>("hybra_fake_cublas_last_compute")(); };
    auto products = [](DType dtype) {
      Tensor x = ones({8, 16}, dtype, cuda(0)), w = ones({4, 16}, dtype, cuda(0)), b = zeros({4}, dtype, cuda(0));
      matmul(x, transpose(w)).wait_to_read();    // cuBLAS
      fully_connected(x, w, b).wait_to_read();  // cuBLASLt
    };
    REQUIRE_FALSE(backend::cuda::tf32());
    products(DType::float32);
    CHECK(math_mode() == 0);    // CUBLAS_DEFAULT_MATH
    CHECK(lt_compute() == 68);  // CUBLAS_COMPUTE_32F
    backend::cuda::set_tf32(true);
    products(DType::float32);
    CHECK(math_mode() == 3);    // CUBLAS_TF32_TENSOR_OP_MATH
    CHECK(lt_compute() == 77);  // CUBLAS_COMPUTE_32F_FAST_TF32
    products(DType::float64);
    CHECK(lt_compute() == 70);  // CUBLAS_COMPUTE_64F: TF32 is for float32 only
    backend::cuda::set_tf32(false);
    products(DType::float32);
    CHECK(math_mode() == 0);
    CHECK(lt_compute() == 68);
  }

  TEST_CASE("cuda fake: float16 and bfloat16 on cuda(0): fills, conversions and ops as on the CPU, Dense on tensor cores") {
    FakeDriver fake;
    auto lt_compute = [&] { return fake.cublas_hook<int (*)()>("hybra_fake_cublas_last_compute")(); };
    auto lt_matmuls = [&] { return fake.cublas_hook<long (*)()>("hybra_fake_cublas_lt_matmuls")(); };
    for (DType d : {DType::float16, DType::bfloat16}) {
      CAPTURE(name(d));
      const long memsets = fake.calls("cuMemsetD16Async");
      CHECK(full({5}, 1.5, d, cuda(0)).to_vector<float>() == std::vector<float>(5, 1.5f));
      CHECK(fake.calls("cuMemsetD16Async") == memsets + 1);
      seed(31);
      const Tensor x = random_uniform({6, 16}, -1, 1, d), w = random_uniform({4, 16}, -1, 1, d);
      const Tensor b = random_uniform({4}, -1, 1, d);
      const Tensor xg = x.to(cuda(0)), wg = w.to(cuda(0)), bg = b.to(cuda(0));
      CHECK(xg.to(cpu()).to_vector<float>() == x.to_vector<float>());
      // A conversion is one kernel; an op converts its operand, computes in float32 and converts back (the
      // stand-in runs no kernel: the launches are what is checked, the values by the `gpu` cases).
      long launches = fake.calls("cuLaunchKernel");
      xg.astype(DType::float32).wait_to_read();
      CHECK(fake.calls("cuLaunchKernel") == launches + 1);
      launches = fake.calls("cuLaunchKernel");
      Tensor(exp(xg)).wait_to_read();
      CHECK(fake.calls("cuLaunchKernel") == launches + 3);
      launches = fake.calls("cuLaunchKernel");
      transpose(xg).contiguous().wait_to_read();  // a copy of 2-byte elements
      CHECK(fake.calls("cuLaunchKernel") == launches + 1);
      launches = fake.calls("cuLaunchKernel");
      embedding(array<std::int64_t>({3, 1}, Shape{2}, cuda(0)), xg).wait_to_read();  // the table's bits, gathered
      CHECK(fake.calls("cuLaunchKernel") == launches + 1);
      // fully_connected of one 16-bit float is one cuBLASLt product in that type, accumulating in float32.
      const long products = lt_matmuls();
      const Tensor y = fully_connected(xg, wg, bg);
      CHECK(y.dtype() == d);
      const std::vector<float> got = y.to(cpu()).to_vector<float>(), want = fully_connected(x, w, b).to_vector<float>();
      CHECK(lt_matmuls() == products + 1);
      CHECK(lt_compute() == 68);  // CUBLAS_COMPUTE_32F
      REQUIRE(got.size() == want.size());
      for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(0.02).scale(0.05));
    }
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

  TEST_CASE("cuda fake: cuBLASLt is told how aligned a product's operands are, as a view's offset leaves them") {
    FakeDriver fake;
    auto misaligned = [&] { return fake.cublas_hook<long (*)()>("hybra_fake_cublas_misaligned")(); };
    seed(6);
    const Tensor rows = random_uniform({5, 12}, -1, 1), w = random_uniform({3, 12}, -1, 1), b = random_uniform({3}, -1, 1);
    const Tensor g_rows = rows.to(cuda(0)), gw = w.to(cuda(0)), gb = b.to(cuda(0));
    const long before = misaligned();
    // Rows 1..4 start 48 bytes into their block, the bias 4 bytes into its own: 16- and 4-byte aligned.
    const Tensor got = fully_connected(slice(g_rows, 0, 1, std::nullopt), gw, slice(concat({gb, gb}), 0, 1, 4));
    const Tensor want = fully_connected(slice(rows, 0, 1, std::nullopt), w, slice(concat({b, b}), 0, 1, 4));
    const auto g = got.to_vector<float>(), c = want.to_vector<float>();
    for (std::size_t i = 0; i < c.size(); ++i) CHECK(g[i] == doctest::Approx(c[i]).epsilon(1e-5));
    CHECK(misaligned() == before);
  }

  TEST_CASE("cuda fake: the chapter's MLP on a GPU, eager and hybridized: cuBLASLt epilogues, then one CUDA graph") {
    FakeDriver fake;
    auto lt_matmuls = [&] { return fake.cublas_hook<long (*)()>("hybra_fake_cublas_lt_matmuls")(); };
    seed(5);
    nn::HybridSequential net, on_cpu;
    net.add(nn::Dense(256, "relu"), nn::Dense(128, "relu"), nn::Dense(2));
    on_cpu.add(nn::Dense(256, "relu"), nn::Dense(128, "relu"), nn::Dense(2));
    net.initialize(nn::init::Uniform(), cuda(0));
    on_cpu.initialize(nn::init::Uniform());
    const Tensor x = random_normal({1, 512}), x2 = random_normal({1, 512});
    auto close = [](const Tensor& on_gpu, const Tensor& want) {
      const auto g = on_gpu.to_vector<float>(), c = want.to_vector<float>();
      REQUIRE(g.size() == c.size());
      for (std::size_t i = 0; i < g.size(); ++i) CHECK(g[i] == doctest::Approx(c[i]).epsilon(1e-5));
    };

    // Eager: each Dense is one cuBLASLt GEMM with the bias in its epilogue,
    // then a relu kernel; the first call also draws the three weights (a kernel each).
    on_cpu(x);  // parameters take their shapes at the first call
    long launches = fake.calls("cuLaunchKernel"), gemms = lt_matmuls();
    Tensor y = net(x.to(cuda(0)));
    y.wait_to_read();
    CHECK(y.device() == cuda(0));
    CHECK(lt_matmuls() == gemms + 3);
    CHECK(fake.calls("cuLaunchKernel") == launches + 3 + 2);
    const auto dict = net.collect_params(), cpu_dict = on_cpu.collect_params();
    const std::vector<nn::Parameter> params(dict.begin(), dict.end()), cpu_params(cpu_dict.begin(), cpu_dict.end());
    for (const auto& p : params) CHECK(p.data().device() == cuda(0));
    for (std::size_t k = 0; k < params.size(); ++k) cpu_params[k].data().copy_to(params[k].data());
    const Tensor want = on_cpu(x), want2 = on_cpu(x2);

    // Hybridized: the relus go into the GEMMs' epilogues; the first call runs the steps.
    net.hybridize();
    launches = fake.calls("cuLaunchKernel");
    gemms = lt_matmuls();
    const long captures = fake.calls("cuStreamBeginCapture"), replays = fake.calls("cuGraphLaunch");
    const Tensor gx = x.to(cuda(0));
    close(net(gx), want);
    CHECK(lt_matmuls() == gemms + 3);
    CHECK(fake.calls("cuLaunchKernel") == launches);  // no relu kernel
    CHECK(fake.calls("cuStreamBeginCapture") == captures);
    REQUIRE(net.plan().replays_graph());
    // The second call records the steps as a graph and replays it; later calls only replay.
    close(net(gx), want);
    CHECK(fake.calls("cuStreamBeginCapture") == captures + 1);
    CHECK(fake.calls("cuGraphLaunch") == replays + 1);
    gemms = lt_matmuls();
    close(net(gx), want);
    CHECK(fake.calls("cuGraphLaunch") == replays + 2);
    CHECK(lt_matmuls() == gemms);  // replayed, not called again
    CHECK(net.plan().graphs_recorded() == 1);
    // Another input tensor: copied into the plan's buffer, recorded once more to read it there.
    close(net(x2.to(cuda(0))), want2);
    close(net(x.to(cuda(0))), want);
    CHECK(net.plan().graphs_recorded() == 2);
    CHECK(fake.calls("cuStreamBeginCapture") == captures + 2);
    // Parameters are read where they live: new values reach the next replay.
    Tensor doubled = cpu_params.back().data() * 2;
    doubled.copy_to(params.back().data());
    doubled.copy_to(cpu_params.back().data());
    close(net(gx), on_cpu(x));
    CHECK(net.plan().graphs_recorded() == 2);
  }

  TEST_CASE("cuda fake: a captured graph's elementwise groups are kernels of one program, replayed as a CUDA graph") {
    FakeDriver fake;
    auto a = sym::var("a", Shape{2, 3}), b = sym::var("b", Shape{3});  // b broadcasts along a's rows
    const long loads = fake.calls("cuModuleLoadData");
    jit::Plan plan(graph::optimize(graph::trace({relu(a * b + 1), exp(a) + b})), cuda(0), false, "two groups");
    CHECK(fake.calls("cuModuleLoadData") == loads + 1);
    REQUIRE(plan.replays_graph());
    Tensor x = ones({2, 3}, DType::float32, cuda(0)), y = ones({3}, DType::float32, cuda(0));
    const long launched = fake.calls("cuLaunchKernel"), ran = fake.calls("kernels run");
    for (int call = 0; call < 3; ++call) {
      auto out = plan({x, y});
      REQUIRE(out.size() == 2);
      CHECK(out[1].shape() == Shape{2, 3});
      CHECK(out[1].device() == cuda(0));
      waitall();
    }
    CHECK(fake.calls("kernels run") == ran + 6);        // two kernels per call
    CHECK(fake.calls("cuLaunchKernel") == launched + 4);  // the first call's, and the recording's
    CHECK(plan.graphs_recorded() == 1);
    CHECK_THROWS_WITH_AS(plan({x, x}), doctest::Contains("input 'b' is (2, 3) float32 but the plan was built for (3,)"),
                         ShapeError);
  }

  TEST_CASE("cuda fake: reductions, argmax and softmax are kernels of one program per op and dtype, launched in the planned steps") {
    FakeDriver fake;
    Tensor x = ones({64, 10}, DType::float32, cuda(0));
    const long loads = fake.calls("cuModuleLoadData"), launches = fake.calls("cuLaunchKernel");
    Tensor s = sum(x, 1), m = mean(x), top = argmax(x, 1), p = softmax(x), lp = log_softmax(x, 0);
    waitall();
    CHECK(s.device() == cuda(0));
    CHECK(s.shape() == Shape{64});
    CHECK(m.shape() == Shape{});
    CHECK(top.dtype() == DType::int64);
    CHECK(p.shape() == x.shape());
    CHECK(fake.calls("cuModuleLoadData") == loads + 5);   // sum, mean, argmax, softmax, log_softmax of float32
    CHECK(fake.calls("cuLaunchKernel") == launches + 5);  // one step each: nothing here needs pieces
    CHECK(fake.last_launch() == "hybra_log_softmax_float32_columns_cub");
    Tensor total = sum(ones({1 << 20}, DType::float32, cuda(0)));
    waitall();
    CHECK(fake.calls("cuLaunchKernel") == launches + 7);  // 2^20 elements: pieces, then their sum
    CHECK(fake.last_launch() == "hybra_sum_float32_rows_acc_out_cub");
    Tensor columns = sum(x, 0);
    waitall();
    CHECK(fake.calls("cuModuleLoadData") == loads + 5);  // the sum's program serves every sum of float32
    CHECK(fake.calls("cuLaunchKernel") == launches + 8);
    CHECK(fake.last_launch() == "hybra_sum_float32_columns_in_out_cub");
    Tensor counted = mean(ones({3, 1}, DType::int32, cuda(0)), 1);  // nothing to reduce: a conversion
    waitall();
    CHECK(counted.dtype() == DType::float32);
    CHECK(fake.calls("cuLaunchKernel") == launches + 9);
    CHECK(fake.last_launch() == backend::cuda::cuda_convert_kernel_name(DType::int32, DType::float32));
    CHECK_THROWS_WITH_AS(sum(ones({2}, DType::float32, cuda(0)), 1), doctest::Contains("sum: axis 1"), AxisError);
  }

  TEST_CASE("cuda fake: each op's block combine is its default (CUB for reductions, the tree for scans) unless one is forced, under entry names of its own") {
    FakeDriver fake;
    Tensor x = ones({64, 10}, DType::float32, cuda(0));
    const long loads = fake.calls("cuModuleLoadData");
    const auto launched = [&](const auto& op) {
      Tensor y = op();
      waitall();
      return fake.last_launch();
    };
    const auto row_sum = [&] { return sum(x, 1); };
    const auto row_softmax = [&] { return softmax(x); };
    const auto flat_cumsum = [&] { return cumsum(x); };
    REQUIRE_FALSE(backend::cuda::block_combine_choice().forced().has_value());
    CHECK(launched(row_sum) == "hybra_sum_float32_rows_in_out_cub");
    CHECK(launched(row_softmax) == "hybra_softmax_float32_rows_cub");
    CHECK(launched(flat_cumsum) == "hybra_cumsum_float32_by_block");
    {
      const backend::cuda::CubBlockCombineScope combine(true);
      CHECK(launched(row_sum) == "hybra_sum_float32_rows_in_out_cub");
      CHECK(launched(flat_cumsum) == "hybra_cumsum_float32_by_block_cub");
    }
    {
      const backend::cuda::CubBlockCombineScope combine(false);
      CHECK(launched(row_sum) == "hybra_sum_float32_rows_in_out");
      CHECK(launched(row_softmax) == "hybra_softmax_float32_rows");
      CHECK(launched(flat_cumsum) == "hybra_cumsum_float32_by_block");
    }
    // Put back, each op has its default again: a GPU's functions are cached
    // by name, so the two versions must never share one.
    CHECK_FALSE(backend::cuda::block_combine_choice().forced().has_value());
    CHECK(launched(row_sum) == "hybra_sum_float32_rows_in_out_cub");
    CHECK(launched([&] { return cumsum(x, 1); }) == "hybra_cumsum_float32");  // rows of 10: a thread each
    CHECK(fake.calls("cuModuleLoadData") >= loads + 5);
  }

  TEST_CASE("cuda fake: a long column's cumsum is three launches over chunks, with scratch for the chunks' sums") {
    FakeDriver fake;
    const Tensor x = ones({1 << 15}, DType::int32, cuda(0));
    const long launches = fake.calls("cuLaunchKernel");
    Tensor y = cumsum(x);
    waitall();
    CHECK(y.dtype() == DType::int64);
    CHECK(fake.calls("cuLaunchKernel") == launches + 3);
    CHECK(fake.last_launch() == "hybra_cumsum_int32_by_chunks");
    const auto b = detail::cumsum::block(x.shape(), std::nullopt);
    CHECK(detail::cumsum::kernel_for(b, 4) == detail::cumsum::Kernel::by_chunks);  // the stand-in's 4 multiprocessors
    CHECK(detail::cumsum::cuda_launch(b, false, DType::int32, backend::cuda::gpu(0)).scratch_bytes == 32 * 8);
  }

  // The stand-in runs no kernel: the test writes the report as the kernel
  // would on finding index 7 at element 2 (tests/unit/test_cuda_kernels.cpp
  // runs the kernel itself on simulated threads).
  TEST_CASE("cuda fake: embedding and its gradient are kernels on cuda(0); a bad index a kernel reports is raised by the next wait") {
    FakeDriver fake;
    const Tensor table = ones({5, 3}, DType::float32, cuda(0));
    const Tensor indices = array<std::int64_t>({4, 0, 7}).to(cuda(0));
    waitall();
    const long launches = fake.calls("cuLaunchKernel");
    Tensor y = embedding(indices, table);
    waitall();
    CHECK(y.shape() == Shape{3, 3});
    CHECK(fake.calls("cuLaunchKernel") == launches + 1);
    CHECK(fake.last_launch() == "hybra_embedding_int64_float32_gather");
    backend::cuda::BadInputReport* report = backend::cuda::gpu(0).bad_input_report();
    CHECK(fake.last_launch_param<void*>(6) == static_cast<void*>(report));
    CHECK(fake.last_launch_param<unsigned>(7) == backend::cuda::bad_input_code("embedding"));

    *report = {backend::cuda::bad_input_code("embedding"), 0, 7.0, 2, 5};
    Tensor z = embedding(indices, table);
    CHECK_THROWS_WITH_AS(z.wait_to_read(),
                         doctest::Contains("embedding: index 7 (element 2 of the indices, flattened) is not one of the 5 "
                                           "rows of its table, found on cuda(0) by its kernel"),
                         IndexError);
    CHECK(report->op == 0u);  // taken: the waits for that work report it, later work does not
    CHECK_THROWS_AS(waitall(), IndexError);
    CHECK_NOTHROW(waitall());
    CHECK_NOTHROW(Tensor(embedding(indices, table)).wait_to_read());

    // The gradient zeroes the table's gradient, then adds into it.
    const long memsets = fake.calls("cuMemsetD8Async");
    Tensor grad = embedding_backward(indices, ones({3, 3}, DType::float32, cuda(0)), 5);
    waitall();
    CHECK(grad.shape() == Shape{5, 3});
    CHECK(fake.calls("cuMemsetD8Async") == memsets + 1);
    CHECK(fake.last_launch() == "hybra_embedding_int64_float32_scatter_add");

    // With synchronous ops the op that found it fails.
    backend::cuda::set_synchronous_ops(true);
    *report = {backend::cuda::bad_input_code("embedding"), 0, -1.0, 0, 5};
    CHECK_THROWS_WITH_AS(Tensor(embedding(indices, table)).wait_to_read(),
                         doctest::Contains("engine op 'embedding' on cuda(0) failed: embedding: index -1"), IndexError);
    backend::cuda::set_synchronous_ops(false);
    CHECK_NOTHROW(waitall());
  }

  TEST_CASE("cuda fake: a captured graph's reductions, argmax and softmax run in the plan's buffers and replay with it") {
    FakeDriver fake;
    auto a = sym::var("a", Shape{64, 10});
    const auto logits = a * 2 + 1;
    jit::Plan plan(graph::optimize(graph::trace({softmax(logits), argmax(logits, 1), sum(a, 0), mean(exp(a))})), cuda(0),
                   false, "classifier");
    REQUIRE(plan.replays_graph());
    const Tensor x = ones({64, 10}, DType::float32, cuda(0));
    const long launched = fake.calls("cuLaunchKernel"), ran = fake.calls("kernels run");
    const long captures = fake.calls("cuStreamBeginCapture"), replays = fake.calls("cuGraphLaunch");
    for (int call = 0; call < 3; ++call) {
      auto out = plan({x});
      REQUIRE(out.size() == 4);
      CHECK(out[0].shape() == Shape{64, 10});
      CHECK(out[1].dtype() == DType::int64);
      CHECK(out[2].shape() == Shape{10});
      CHECK(out[3].shape() == Shape{});
      waitall();
    }
    // Per call: the kernels of a * 2 + 1 and exp(a), then one step each for softmax, argmax and the sums.
    CHECK(fake.calls("kernels run") == ran + 3 * 6);
    CHECK(fake.calls("cuLaunchKernel") == launched + 2 * 6);  // the first call's, and the recording's
    CHECK(fake.last_launch() == "hybra_mean_float32_rows_in_out_cub");
    CHECK(fake.calls("cuStreamBeginCapture") == captures + 1);
    CHECK(fake.calls("cuGraphLaunch") == replays + 2);
    CHECK(plan.graphs_recorded() == 1);

    // A sum in pieces: their accumulators live in the workspace, after the planned values.
    auto v = sym::var("v", Shape{1 << 20});
    jit::Plan total(graph::optimize(graph::trace({sum(v)})), cuda(0), false, "total");
    const auto pieces = backend::cuda::plan_reduce(std::vector<std::array<std::int64_t, 3>>{{1, 1 << 20, 1}}, 8,
                                                   backend::cuda::gpu(0).info().multiprocessors);
    REQUIRE(pieces.steps.size() == 2);
    CHECK(total.peak_bytes() >= static_cast<std::size_t>(pieces.scratch_bytes) + sizeof(float));
    const long before = fake.calls("kernels run");
    for (int call = 0; call < 2; ++call) total({ones({1 << 20}, DType::float32, cuda(0))});
    waitall();
    CHECK(fake.calls("kernels run") == before + 4);
    CHECK(total.graphs_recorded() == 1);
  }

  TEST_CASE("cuda fake: an MLP's training graphs replay on a GPU: gradient products read transposed views in place") {
    FakeDriver fake;
    auto x = sym::var("x", Shape{8, 20}), w1 = sym::var("w1", Shape{16, 20}), b1 = sym::var("b1", Shape{16});
    auto w2 = sym::var("w2", Shape{10, 16}), b2 = sym::var("b2", Shape{10});
    const auto scores = fully_connected(relu(fully_connected(x, w1, b1)), w2, b2);
    const auto pair = autograd::training_graphs(graph::trace({log_softmax(scores)}), {false, true, true, true, true});
    jit::Plan forward(graph::optimize(pair.forward), cuda(0), true, "forward");
    jit::Plan backward(graph::optimize(pair.backward), cuda(0), true, "backward");
    CHECK(forward.replays_graph());
    CHECK(backward.replays_graph());  // matmul(transpose(dy), x) and sum(dy, 0) are launch steps
    auto gemms = [&] { return fake.cublas_hook<long (*)()>("hybra_fake_cublas_gemms")(); };
    const long before = gemms();
    std::vector<Tensor> inputs;
    for (int v : backward.graph().vars())
      inputs.push_back(ones(*backward.graph().nodes[static_cast<std::size_t>(v)].meta.shape, DType::float32, cuda(0)));
    for (int call = 0; call < 3; ++call) backward(inputs);
    waitall();
    // Called by the first call and the recording only: the weights' gradients and the hidden layer's.
    CHECK(gemms() - before == 2 * 3);
    CHECK(backward.graphs_recorded() == 1);
  }

  TEST_CASE("cuda fake: an MLP trains on cuda(0), eager and hybridized: every op of the step has a GPU path") {
    FakeDriver fake;
    for (bool hybridized : {false, true}) {
      CAPTURE(hybridized);
      nn::HybridSequential net;
      net.add(nn::Dense(16, "relu"), nn::Dense(10));
      net.initialize(nn::init::Normal(0.01), cuda(0));
      if (hybridized) net.hybridize();
      const Tensor X = ones({8, 20}, DType::float32, cuda(0)), y = zeros({8}, DType::int32, cuda(0));  // int labels
      const long launches = fake.calls("cuLaunchKernel");
      test::train_steps(net, X, y, 2);
      waitall();  // an op without a GPU path would have thrown, naming itself
      CHECK(fake.calls("cuLaunchKernel") > launches);
      for (const auto& p : net.collect_params()) {
        CAPTURE(p.name());
        CHECK(p.data().device() == cuda(0));
        CHECK(p.grad().device() == cuda(0));
      }
    }
  }

  TEST_CASE("cuda fake: a dtype conversion on a GPU is one kernel per pair of dtypes; a view is gathered first") {
    FakeDriver fake;
    Tensor a = ones({4, 3}, DType::float32, cuda(0));
    const long launches = fake.calls("cuLaunchKernel");
    Tensor wide = a.astype(DType::float64);
    waitall();
    CHECK(wide.dtype() == DType::float64);
    CHECK(wide.device() == cuda(0));
    CHECK(fake.calls("cuLaunchKernel") == launches + 1);
    CHECK(fake.last_launch() == "hybra_convert_float32_to_float64");
    Tensor labels = transpose(a).astype(DType::int32);
    waitall();
    CHECK(labels.shape() == Shape{3, 4});
    CHECK(fake.calls("cuLaunchKernel") == launches + 3);  // gather, convert
    Tensor moved(Shape{4, 3}, DType::uint8, cuda(1));
    moved.assign(a);  // converted on cuda(0), then copied
    waitall();
    CHECK(fake.calls("cuLaunchKernel") == launches + 4);
    CHECK(fake.last_launch() == "hybra_convert_float32_to_uint8");

    // Captured, a conversion (or a copy, to its own dtype) is a launch step: the plan replays.
    auto s = sym::var("s", Shape{4, 3});
    jit::Plan plan(graph::trace({s.astype(DType::float64), s.astype(DType::float32)}), cuda(0), false, "astype");
    CHECK(plan.replays_graph());
    for (int call = 0; call < 2; ++call) CHECK(plan({a})[0].dtype() == DType::float64);
    waitall();
    CHECK(plan.graphs_recorded() == 1);
  }

  TEST_CASE("cuda fake: allreduce over GPUs is one NCCL group; two GPUs train a data-parallel MLP") {
    FakeDriver fake;
    REQUIRE(backend::cuda::nccl_available());  // loads it
    Tensor a = array<float>({1, 2, 3}, {3}, cuda(0)), b = array<float>({10, 20, 30}, {3}, cuda(1));
    const long groups = fake.nccl_calls("ncclGroupEnd"), reduces = fake.nccl_calls("ncclAllReduce");
    std::vector<Tensor> both{a, b};
    allreduce(both);
    waitall();
    CHECK(a.to_vector<float>() == std::vector<float>{11, 22, 33});
    CHECK(b.to_vector<float>() == std::vector<float>{11, 22, 33});
    CHECK(fake.nccl_calls("ncclGroupEnd") == groups + 1);
    CHECK(fake.nccl_calls("ncclAllReduce") == reduces + 2);
    CHECK(fake.nccl_calls("ncclCommInitAll") == 1);  // the communicators of (cuda(0), cuda(1)), kept

    const std::vector<Device> gpus{cuda(0), cuda(1)};
    nn::HybridSequential net;
    net.add(nn::Dense(8, "relu"), nn::Dense(3));
    net.initialize(nn::init::Xavier(), gpus);
    Trainer trainer(net.collect_params(), "sgd", {{"learning_rate", 0.1}});
    const nn::SoftmaxCrossEntropyLoss loss_fn;
    const Tensor X = ones({8, 5}), y = zeros({8}, DType::int32);
    auto Xs = split_and_load(X, gpus), ys = split_and_load(y, gpus);
    std::vector<Tensor> losses;
    {
      autograd::record rec;
      for (std::size_t k = 0; k < Xs.size(); ++k) losses.push_back(loss_fn(net(Xs[k]), ys[k]));
    }
    for (auto& l : losses) l.backward();
    trainer.step(8);
    waitall();
    CHECK(fake.nccl_calls("ncclGroupEnd") == groups + 1 + 4);  // one group per parameter
    CHECK(fake.nccl_calls("ncclCommInitAll") == 1);
  }

  TEST_CASE("cuda fake: operands on two GPUs are refused by name") {
    Tensor a = ones({2, 2}, DType::float32, cuda(0));
    CHECK_THROWS_WITH_AS(Tensor(a + a.to(cuda(1))), doctest::Contains("operands live on cuda(0) and cuda(1)"), DeviceError);
  }

  TEST_CASE("cuda fake: views are written on a GPU: assign, concat and slice's gradient are copy kernels of one program") {
    FakeDriver fake;
    const Tensor a = ones({4, 3}, DType::float32, cuda(0)), b = ones({4, 2}, DType::float32, cuda(0));
    const long launches = fake.calls("cuLaunchKernel"), loads = fake.calls("cuModuleLoadData");
    const Tensor joined = concat({a, b}, 1);  // parts written into column blocks: views that are not contiguous
    Tensor t = zeros({3, 4}, DType::float32, cuda(0));
    transpose(t).assign(a);
    Tensor x = ones({4, 6}, DType::float32, cuda(0));
    x.attach_grad();
    {
      autograd::record rec;
      Tensor y = slice(x, 1, 1, 5, 2) * 2;
      y.backward();
    }
    waitall();
    CHECK(joined.shape() == Shape{4, 5});
    CHECK(x.grad().shape() == Shape{4, 6});
    CHECK(fake.calls("cuLaunchKernel") >= launches + 4);
    CHECK(fake.calls("cuModuleLoadData") <= loads + 3);  // the copy program (and the expressions' kernels), whatever the layouts

    // Captured, concat and slice's gradient are launch steps: the plan replays a CUDA graph.
    auto u = sym::var("u", Shape{4, 3}), v = sym::var("v", Shape{4, 2});
    jit::Plan joins(graph::optimize(graph::trace({concat(std::vector{u, v}, 1) * 2})), cuda(0), false, "concat");
    CHECK(joins.replays_graph());
    for (int call = 0; call < 2; ++call) CHECK(joins({a, b})[0].shape() == Shape{4, 5});
    waitall();
    CHECK(joins.graphs_recorded() == 1);
  }

  TEST_CASE("cuda fake: captured views gathered, integer chains fused, mixed dtypes converted first: the plan replays") {
    FakeDriver fake;
    auto v = sym::var("v", Shape{4, 6}), label = sym::var("label", Shape{4}, DType::int64),
         mask = sym::var("mask", Shape{6}, DType::uint8);
    // softmax of every other column and a sum over a transpose: ops whose
    // launches read contiguous operands, given views of the input; an
    // accuracy's integer comparison, a fused kernel in int64; a float times
    // a uint8 mask, an astype launch and a float kernel; flatten of a
    // transpose, a copy.
    jit::Plan plan(graph::optimize(graph::trace({softmax(slice(v, 1, 0, 6, 2), 1), sum(transpose(v), 1),
                                                 sum((argmax(v, 1) == label) * 1), v * mask, flatten(transpose(v))})),
                   cuda(0), false, "gathered");
    CHECK(plan.replays_graph());
    const Tensor x = ones({4, 6}, DType::float32, cuda(0)), y = zeros({4}, DType::int64, cuda(0)),
                 keep = ones({6}, DType::uint8, cuda(0));
    for (int call = 0; call < 3; ++call) {
      const auto out = plan({x, y, keep});
      CHECK(out[0].shape() == Shape{4, 3});
      CHECK(out[1].shape() == Shape{6});
      CHECK(out[2].dtype() == DType::int64);
      CHECK(out[3].dtype() == DType::float32);
      CHECK(out[4].shape() == Shape{6, 4});  // a reshape of a view: a copy launch
    }
    waitall();
    CHECK(plan.graphs_recorded() == 1);
  }

  TEST_CASE("cuda fake: random draws and dropout on a GPU are kernels there, drawing the CPU's counter blocks") {
    FakeDriver fake;
    const long uploads = fake.calls("cuMemcpyHtoDAsync");
    seed(3);
    const Tensor u = random_uniform({1001}, 0, 1, DType::float32, cuda(0));
    waitall();
    CHECK(fake.last_launch() == "hybra_random_uniform_float32");
    const Tensor n = random_normal({10}, 0, 1, DType::float64, cuda(0));
    waitall();
    CHECK(fake.last_launch() == "hybra_random_normal_float64");
    CHECK(fake.calls("cuMemcpyHtoDAsync") == uploads);  // nothing drawn on the host
    // The generator moved on as a CPU draw of the same sizes moves it.
    const Tensor next_on_gpu = random_uniform({4}, 0, 1, DType::float32, cpu());
    seed(3);
    (void)random_uniform({1001}, 0, 1, DType::float32, cpu());
    (void)random_normal({10}, 0, 1, DType::float64, cpu());
    CHECK(random_uniform({4}, 0, 1, DType::float32, cpu()).to_vector<float>() == next_on_gpu.to_vector<float>());

    const Tensor x = ones({8, 8}, DType::float32, cuda(0));
    autograd::train_mode training;
    const long launches = fake.calls("cuLaunchKernel");
    const Tensor dropped = dropout(x, 0.5);
    waitall();
    CHECK(dropped.device() == cuda(0));
    CHECK(fake.last_launch() == "hybra_dropout_float32");
    CHECK(fake.calls("cuLaunchKernel") == launches + 1);  // draws and mask in one kernel
    CHECK(fake.calls("cuMemcpyHtoDAsync") == uploads);

    // Captured in training mode, dropout is a launch step: the plan replays a
    // CUDA graph, writing each call's draws (key and first block) to the GPU
    // before it, and takes its counter blocks from the generator as an eager call would.
    auto v = sym::var("v", Shape{8, 8});
    jit::Plan plan(graph::optimize(graph::trace({dropout(relu(v), 0.5) * 2})), cuda(0), true, "dropout");
    REQUIRE(plan.replays_graph());
    waitall();  // the plan's copies of its constants
    Generator& gen = default_generator();
    for (int call = 0; call < 3; ++call) {
      const std::uint64_t before = gen.advance(0);
      const long copied = fake.calls("cuMemcpyHtoDAsync");
      CHECK(plan({x})[0].shape() == Shape{8, 8});
      waitall();
      CHECK(gen.advance(0) == before + Generator::blocks_for(64));
      CHECK(fake.calls("cuMemcpyHtoDAsync") == copied + 1);
    }
    CHECK(plan.graphs_recorded() == 1);
  }

  TEST_CASE("cuda fake: dot on a GPU is one cuBLAS product, as matmul is") {
    Tensor a = array<float>({1, 2, 3, 4, 5, 6}, {1, 2, 3}).to(cuda(0));
    Tensor b = array<float>({1, 0, 0, 1, 1, 1}, {3, 2}).to(cuda(0));
    const Tensor d = dot(a, b);  // (1, 2, 3) . (3, 2): a's rows times b
    CHECK(d.device() == cuda(0));
    CHECK(d.to(cpu()).to_vector<float>() == std::vector<float>{4, 5, 10, 11});
    const Tensor v = dot(array<float>({1, 2, 3}).to(cuda(0)), array<float>({4, 5, 6}).to(cuda(0)));
    CHECK(v.shape() == Shape{});
    CHECK(v.to(cpu()).to_vector<float>() == std::vector<float>{32});
    CHECK_THROWS_WITH_AS(dot(ones({2, 2}, DType::int32, cuda(0)), ones({2, 2}, DType::int32, cuda(0))),
                         doctest::Contains("dot: int32 products are not done on a GPU"), DTypeError);
  }

  TEST_CASE("cuda fake: broadcast operands and views are read through their strides by a kernel") {
    FakeDriver fake;
    Tensor a = ones({2, 2}, DType::float32, cuda(0));
    const long launches = fake.calls("cuLaunchKernel");
    Tensor broadcast = a + ones({2}, DType::float32, cuda(0));
    Tensor gathered = transpose(a).contiguous();
    Tensor moved = transpose(a).to(cuda(1));  // gathered on cuda(0), then copied
    waitall();
    CHECK(broadcast.shape() == Shape{2, 2});
    CHECK(gathered.is_contiguous());
    CHECK(moved.device() == cuda(1));
    CHECK(fake.calls("cuLaunchKernel") == launches + 3);
  }
}

// In a process of its own (ctest's unit_cuda_exit), with the stand-ins: the
// process ends with GPU work still queued in the engine.
TEST_SUITE("cuda exit" * doctest::skip()) {
  TEST_CASE("cuda exit: GPU work still queued at exit finishes before cuBLAS's exit handlers run") {
    const Tensor a = ones({8, 8}, DType::float32, cuda(0));
    matmul(a, a).wait_to_read();  // cuBLAS made its handle: its exit handlers are registered now
    Tensor slow({8, 8}, DType::float32);
    push_op("slow", {}, {slow}, [] { std::this_thread::sleep_for(std::chrono::milliseconds(200)); });
    const Tensor b = slow.to(cuda(0));
    for (int k = 0; k < 4; ++k) (void)matmul(a, b);  // queued behind the slow op when exit comes
    std::exit(0);  // the stand-in cuBLAS aborts if a GEMM is asked for after its exit handlers
  }
}

