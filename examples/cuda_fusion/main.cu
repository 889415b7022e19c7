// Compile-time fusion on a GPU: nvcc turns the whole expression
// relu(a * b + 2) into ONE kernel (kernels/evaluate.cuh), computing each
// element in registers with no temporaries, from the same expression
// templates and op table the CPU loops use. Built where CMake finds nvcc; run
// with no GPU it says why and exits 77 (ctest's "skipped").
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <hybra/backend/cuda/driver.hpp>
#include <hybra/eager.hpp>
#include <kernels/evaluate.cuh>
#include <vector>

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) hybra::fail<hybra::DeviceError>("cuda_fusion: ", what, " failed: ", cudaGetErrorString(e));
}

}  // namespace

int main() {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    const auto& driver = hybra::backend::cuda::driver_status();
    std::printf("cuda_fusion: skipped, no GPU: %s\n",
                driver.problem.empty() ? "the CUDA runtime sees none" : driver.problem.c_str());
    return 77;
  }
  const std::int64_t n = 1 << 20;
  hybra::seed(1);
  hybra::Tensor a = hybra::random_uniform({n}, -2, 2), b = hybra::random_uniform({n}, -2, 2);
  auto expr = hybra::relu(a * b + 2);
  const std::vector<float> expected = hybra::Tensor(expr).to_vector<float>();

  float *da = nullptr, *db = nullptr, *dy = nullptr;
  const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(float);
  check(cudaMalloc(&da, bytes), "cudaMalloc");
  check(cudaMalloc(&db, bytes), "cudaMalloc");
  check(cudaMalloc(&dy, bytes), "cudaMalloc");
  check(cudaMemcpy(da, a.to_vector<float>().data(), bytes, cudaMemcpyHostToDevice), "copy a");
  check(cudaMemcpy(db, b.to_vector<float>().data(), bytes, cudaMemcpyHostToDevice), "copy b");

  // The expression's kernel tree, its tensor leaves pointing at device memory.
  const float* leaves[] = {da, db};
  auto kernel = hybra::kernel::build<float, hybra::kernel::flat_leaf>(expr, leaves, nullptr);
  hybra::kernels::evaluate<<<256, 256>>>(kernel, dy, n);
  check(cudaGetLastError(), "launching the fused kernel");
  std::vector<float> y(static_cast<std::size_t>(n));
  check(cudaMemcpy(y.data(), dy, bytes, cudaMemcpyDeviceToHost), "copy y");
  cudaFree(da);
  cudaFree(db);
  cudaFree(dy);

  double worst = 0;
  for (std::size_t i = 0; i < y.size(); ++i) worst = std::max(worst, std::abs(double(y[i]) - expected[i]));
  std::printf("relu(a * b + 2) on %lld elements: one kernel on the GPU, max |GPU - CPU| = %g\n",
              static_cast<long long>(n), worst);
  return worst <= 1e-6 ? 0 : 1;
}
