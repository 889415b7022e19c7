// hybra on a GPU: a fused 8-op elementwise chain over 2^26 float32 values
// (one NVRTC-compiled kernel: two reads and a write per element) against the
// device-to-device copy bandwidth measured in the same run, the round trip
// of one small eager expression, GEMM 4096^3 (float32 and TF32) through hybra against cuBLAS
// called directly, the chapter's MLP eager at batch 1, a whole-tensor sum,
// row sums, row argmaxes, a row softmax and cumsum against that bandwidth
// (each with the block step of a shared-memory tree, /cub:0, and of CUB's
// WarpReduce or BlockScan, /cub:1; cumsum through each of its kernels), a
// training step of the MLP and
// of LeNet-5 (eager and hybridized), and the first use of an expression's kernel in a
// process (an NVRTC compile, or a hit in the kernel cache's disk half when
// HYBRA_KERNEL_CACHE_DIR already holds it).
//
//   bash benchmarks/run.sh bench_cuda
//
// With no GPU it says why and exits 77.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <hybra/hybra.hpp>

using namespace hybra;

namespace {

constexpr std::int64_t n = std::int64_t{1} << 26;

auto long_chain(const Tensor& a, const Tensor& b) { return ((a * b + 2) * a - b) * 0.5f + a * b - 1; }

// Bytes moved per element: the copy reads one value and writes one; the
// chain reads two and writes one.
void BM_cuda_copy(benchmark::State& state) {
  Tensor src = ones({n}, DType::float32, cuda(0)), dst({n}, DType::float32, cuda(0));
  for (auto _ : state) {
    src.copy_to(dst);
    dst.wait_to_read();
  }
  state.SetBytesProcessed(state.iterations() * n * 2 * 4);
}
BENCHMARK(BM_cuda_copy)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_cuda_fusion_long(benchmark::State& state) {
  Tensor a = random_uniform({n}, -1, 1, DType::float32, cuda(0)), b = ones({n}, DType::float32, cuda(0));
  Tensor out({n}, DType::float32, cuda(0));
  for (auto _ : state) {
    out.assign(long_chain(a, b));
    out.wait_to_read();
  }
  state.SetBytesProcessed(state.iterations() * n * 3 * 4);
}
BENCHMARK(BM_cuda_fusion_long)->Name("BM_cuda_fusion_long/hybra")->UseRealTime()->Unit(benchmark::kMillisecond);

// A whole-tensor sum (pieces of the input in parallel, then their sum):
// bytes read, to set against the copy's bandwidth.
void BM_cuda_sum(benchmark::State& state) {
  const backend::cuda::CubBlockCombineScope combine(state.range(0) != 0);  // argument cub
  Tensor a = ones({n}, DType::float32, cuda(0));
  for (auto _ : state) sum(a).wait_to_read();
  state.SetBytesProcessed(state.iterations() * n * 4);
}
BENCHMARK(BM_cuda_sum)->ArgName("cub")->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);

// A reduction of each row of 1024 (a block per row, so a block combine per
// row): bytes read.
template <class Reduce>
void BM_cuda_rows(benchmark::State& state, Reduce reduce) {
  const backend::cuda::CubBlockCombineScope combine(state.range(0) != 0);  // argument cub
  Tensor a = random_normal({n / 1024, 1024}, 0, 1, DType::float32, cuda(0));
  for (auto _ : state) reduce(a).wait_to_read();
  state.SetBytesProcessed(state.iterations() * n * 4);
}
BENCHMARK_CAPTURE(BM_cuda_rows, sum, [](const Tensor& a) { return sum(a, 1); })
    ->ArgName("cub")->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_cuda_rows, argmax, [](const Tensor& a) { return argmax(a, 1); })
    ->ArgName("cub")->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);

// softmax over rows of 1024 (a block per row): the bytes of one read and one
// write (the kernel reads each row three times, from cache after the first).
void BM_cuda_softmax(benchmark::State& state) {
  const backend::cuda::CubBlockCombineScope combine(state.range(0) != 0);  // argument cub
  Tensor a = random_normal({n / 1024, 1024}, 0, 1, DType::float32, cuda(0));
  for (auto _ : state) softmax(a).wait_to_read();
  state.SetBytesProcessed(state.iterations() * n * 2 * 4);
}
BENCHMARK(BM_cuda_softmax)->ArgName("cub")->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);

// cumsum of 2^26 float32 values through each of its kernels, forced where
// ops/cumsum.hpp's rule would pick another, so that the run shows where the
// rule should fall: one row (a block or chunks; a thread alone would take
// seconds), 64 rows of 2^20, rows of 1024, and 1024 columns of 2^16 (axis
// 0). Bytes read and written.
void BM_cuda_cumsum(benchmark::State& state, Shape shape, std::int64_t axis, detail::cumsum::Kernel kernel) {
  const backend::cuda::CubBlockCombineScope combine(state.range(0) != 0);  // argument cub
  const Tensor a = random_normal(shape, 0, 1, DType::float32, cuda(0));
  const Tensor out(shape, DType::float32, cuda(0));
  const auto block = detail::cumsum::block(shape, axis);
  for (auto _ : state) {
    backend::cuda::push_cuda_launch("cumsum", {a}, out,
                                    detail::cumsum::cuda_launch(block, false, DType::float32, backend::cuda::gpu(0), kernel));
    out.wait_to_read();
  }
  state.SetBytesProcessed(state.iterations() * n * 2 * 4);
}
BENCHMARK_CAPTURE(BM_cuda_cumsum, row_by_block, Shape{n}, 0, detail::cumsum::Kernel::by_block)
    ->ArgName("cub")->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_cuda_cumsum, row_by_chunks, Shape{n}, 0, detail::cumsum::Kernel::by_chunks)
    ->ArgName("cub")->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_cuda_cumsum, rows_64_by_block, Shape{64, n / 64}, 1, detail::cumsum::Kernel::by_block)
    ->ArgName("cub")->Arg(0)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_cuda_cumsum, rows_64_by_chunks, Shape{64, n / 64}, 1, detail::cumsum::Kernel::by_chunks)
    ->ArgName("cub")->Arg(0)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_cuda_cumsum, rows_by_thread, Shape{n / 1024, 1024}, 1, detail::cumsum::Kernel::by_thread)
    ->ArgName("cub")->Arg(0)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_cuda_cumsum, rows_by_block, Shape{n / 1024, 1024}, 1, detail::cumsum::Kernel::by_block)
    ->ArgName("cub")->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_cuda_cumsum, columns_by_thread, Shape{n / 1024, 1024}, 0, detail::cumsum::Kernel::by_thread)
    ->ArgName("cub")->Arg(0)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_cuda_cumsum, columns_by_block, Shape{n / 1024, 1024}, 0, detail::cumsum::Kernel::by_block)
    ->ArgName("cub")->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);

// What one small eager expression costs end to end: push, the GPU thread's
// launch and stream wait, and the caller's wait.
void BM_cuda_eager_small(benchmark::State& state) {
  Tensor a = ones({1024}, DType::float32, cuda(0)), b = ones({1024}, DType::float32, cuda(0));
  Tensor out({1024}, DType::float32, cuda(0));
  for (auto _ : state) {
    out.assign(relu(a * b + 2));
    out.wait_to_read();
  }
}
BENCHMARK(BM_cuda_eager_small)->UseRealTime()->Unit(benchmark::kMicrosecond);

// GEMM 4096^3 float32 through hybra (matmul: a new result from the caching
// allocator, the engine, one cuBLAS call, the wait for its event) against the
// same cuBLAS call made directly on the GPU's stream; in float32, and with
// TF32 tensor cores (backend::cuda::set_tf32).
constexpr std::int64_t gemm_n = 4096;

void BM_cuda_gemm_hybra(benchmark::State& state, bool tf32) {
  backend::cuda::set_tf32(tf32);
  Tensor a = random_uniform({gemm_n, gemm_n}, -1, 1, DType::float32, cuda(0));
  Tensor b = random_uniform({gemm_n, gemm_n}, -1, 1, DType::float32, cuda(0));
  for (auto _ : state) matmul(a, b).wait_to_read();
  backend::cuda::set_tf32(false);
  state.counters["TFLOP/s"] = benchmark::Counter(2.0 * gemm_n * gemm_n * gemm_n * state.iterations() / 1e12,
                                                 benchmark::Counter::kIsRate);
}
BENCHMARK_CAPTURE(BM_cuda_gemm_hybra, float32, false)->Name("BM_cuda_gemm/hybra")->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_cuda_gemm_hybra, tf32, true)->Name("BM_cuda_gemm/hybra_tf32")->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_cuda_gemm_cublas(benchmark::State& state, bool tf32) {
  Tensor a = random_uniform({gemm_n, gemm_n}, -1, 1, DType::float32, cuda(0));
  Tensor b = random_uniform({gemm_n, gemm_n}, -1, 1, DType::float32, cuda(0)), c({gemm_n, gemm_n}, DType::float32, cuda(0));
  waitall();
  auto& gpu = backend::cuda::gpu(0);
  const auto& cb = backend::cuda::cublas();
  gpu.bind();
  backend::cuda::cublasHandle_t handle = nullptr;
  cb.check(cb.create(&handle), "cublasCreate");
  cb.check(cb.set_stream(handle, gpu.stream()), "cublasSetStream");
  cb.check(cb.set_math_mode(handle, tf32 ? 3 : 0), "cublasSetMathMode");  // CUBLAS_TF32_TENSOR_OP_MATH : DEFAULT
  const float one = 1, zero = 0;
  const int n = static_cast<int>(gemm_n);
  auto* pa = static_cast<const float*>(a.raw_data());
  auto* pb = static_cast<const float*>(b.raw_data());
  auto* pc = static_cast<float*>(c.raw_data());
  for (auto _ : state) {
    cb.check(cb.sgemm(handle, 0, 0, n, n, n, &one, pb, n, pa, n, &zero, pc, n), "cublasSgemm");
    gpu.synchronize("of the direct cuBLAS call");
  }
  state.counters["TFLOP/s"] = benchmark::Counter(2.0 * gemm_n * gemm_n * gemm_n * state.iterations() / 1e12,
                                                 benchmark::Counter::kIsRate);
}
BENCHMARK_CAPTURE(BM_cuda_gemm_cublas, float32, false)->Name("BM_cuda_gemm/cublas")->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_cuda_gemm_cublas, tf32, true)->Name("BM_cuda_gemm/cublas_tf32")->UseRealTime()->Unit(benchmark::kMillisecond);

// fully_connected 4096 x 4096 by 4096 x 4096 with a bias (cuBLASLt's
// epilogue) in float32, and in float16 and bfloat16 on tensor cores
// (accumulating in float32): what casting a model to a 16-bit float buys.
void BM_cuda_dense(benchmark::State& state, DType dtype) {
  Tensor x = random_uniform({gemm_n, gemm_n}, -1, 1, dtype, cuda(0));
  Tensor w = random_uniform({gemm_n, gemm_n}, -1, 1, dtype, cuda(0)), b = zeros({gemm_n}, dtype, cuda(0));
  fully_connected(x, w, b).wait_to_read();
  for (auto _ : state) fully_connected(x, w, b).wait_to_read();
  state.counters["TFLOP/s"] = benchmark::Counter(2.0 * gemm_n * gemm_n * gemm_n * state.iterations() / 1e12,
                                                 benchmark::Counter::kIsRate);
}
BENCHMARK_CAPTURE(BM_cuda_dense, float32, DType::float32)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_cuda_dense, float16, DType::float16)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_cuda_dense, bfloat16, DType::bfloat16)->UseRealTime()->Unit(benchmark::kMillisecond);

// The chapter's MLP at batch 1, eager on cuda(0): three products, two
// bias GEMMs, two ReLU kernels, each an engine op with its stream wait.
// The chapter's MLP at batch 1: eager (three cuBLASLt GEMMs and two relu
// kernels, one engine op each) and hybridized (the relus in the GEMMs'
// epilogues, the call replayed as one CUDA graph).
void BM_cuda_mlp(benchmark::State& state, bool hybridized) {
  nn::HybridSequential net;
  net.add(nn::Dense(256, "relu"), nn::Dense(128, "relu"), nn::Dense(2));
  net.initialize(nn::init::Uniform(), cuda(0));
  Tensor x = random_normal({1, 512}, 0, 1, DType::float32, cuda(0));
  net(x).wait_to_read();
  if (hybridized) net.hybridize();
  for (int warm = 0; warm < 3; ++warm) net(x).wait_to_read();
  for (auto _ : state) net(x).wait_to_read();
}
BENCHMARK_CAPTURE(BM_cuda_mlp, eager, false)->Name("BM_cuda_mlp/eager")->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_cuda_mlp, hybridized, true)
    ->Name("BM_cuda_mlp/hybridized")
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// One SGD training step at batch 256 on cuda(0): forward under record,
// softmax cross-entropy, backward, update; of the chapter's MLP (512
// features) or of LeNet-5 as train_lenet builds it (28 x 28 images).
enum class Model { mlp, lenet };

void BM_cuda_train(benchmark::State& state, Model model, bool hybridized) {
  nn::HybridSequential net;
  if (model == Model::mlp)
    net.add(nn::Dense(256, "relu"), nn::Dense(128, "relu"), nn::Dense(10));
  else
    net.add(nn::Conv2D(6, 5, 1, 2, 1, 1, "relu"), nn::MaxPool2D(2), nn::Conv2D(16, 5, 1, 0, 1, 1, "relu"),
            nn::MaxPool2D(2), nn::Flatten(), nn::Dense(120, "relu"), nn::Dense(84, "relu"), nn::Dense(10));
  net.initialize(nn::init::Xavier(), cuda(0));
  if (hybridized) net.hybridize();
  Trainer trainer(net.collect_params(), "sgd", {{"learning_rate", 0.01}});
  const nn::SoftmaxCrossEntropyLoss loss_fn;
  const Shape features = model == Model::mlp ? Shape{256, 512} : Shape{256, 1, 28, 28};
  const Tensor X = random_normal(features, 0, 1, DType::float32, cuda(0));
  const Tensor y = random_uniform({256}, 0, 10).astype(DType::int32).to(cuda(0));
  auto step = [&] {
    Tensor loss;
    {
      autograd::record rec;
      loss = loss_fn(net(X), y);
    }
    loss.backward();
    trainer.step(256);
    waitall();
  };
  for (int warm = 0; warm < 3; ++warm) step();
  for (auto _ : state) step();
}
BENCHMARK_CAPTURE(BM_cuda_train, mlp_eager, Model::mlp, false)
    ->Name("BM_cuda_mlp_train/eager")
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_cuda_train, mlp_hybridized, Model::mlp, true)
    ->Name("BM_cuda_mlp_train/hybridized")
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_cuda_train, lenet_eager, Model::lenet, false)
    ->Name("BM_cuda_lenet_train/eager")
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_cuda_train, lenet_hybridized, Model::lenet, true)
    ->Name("BM_cuda_lenet_train/hybridized")
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  const auto& driver = backend::cuda::driver_status();
  if (driver.gpus.empty()) {
    std::printf("bench_cuda: no GPU: %s\n", driver.problem.c_str());
    return 77;
  }
  std::printf("bench_cuda: %s, driver CUDA %d\n", driver.gpus.front().name.c_str(), driver.version);
  {
    Tensor a = ones({1024}, DType::float32, cuda(0));
    const auto start = std::chrono::steady_clock::now();
    Tensor y = exp(a * 0.25f) - 3;  // an expression no other case uses
    y.wait_to_read();
    const std::chrono::duration<double, std::milli> first = std::chrono::steady_clock::now() - start;
    std::printf("bench_cuda: first use of a fused kernel in this process: %.2f ms\n", first.count());
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
