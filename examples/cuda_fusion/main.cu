// Two ways to run relu(a * b + 2) on a GPU as ONE kernel, from the same
// expression templates and op table the CPU loops use, against the CPU:
// - compile time: nvcc instantiates kernels/evaluate.cuh for the
//   expression's type (its tensor leaves become device pointers);
// - run time: hybra evaluates the expression on cuda(0) itself, through a
//   kernel NVRTC generates from the type (what a program built with plain
//   g++ gets).
// Built where CMake finds nvcc; run with no GPU it says why and exits 77
// (ctest's "skipped").
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <hybra/eager.hpp>
#include <kernels/evaluate.cuh>
#include <vector>

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) hybra::fail<hybra::DeviceError>("cuda_fusion: ", what, " failed: ", cudaGetErrorString(e));
}

double worst_difference(const std::vector<float>& x, const std::vector<float>& y) {
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(double(x[i]) - y[i]));
  return worst;
}

}  // namespace

int main() {
  using namespace hybra;
  const auto& driver = backend::cuda::driver_status();
  if (driver.gpus.empty()) {
    std::printf("cuda_fusion: skipped, no GPU: %s\n", driver.problem.c_str());
    return 77;
  }
  const std::int64_t n = 1 << 20;
  seed(1);
  Tensor a = random_uniform({n}, -2, 2), b = random_uniform({n}, -2, 2);
  const std::vector<float> expected = Tensor(relu(a * b + 2)).to_vector<float>();

  Tensor ga = a.to(cuda(0)), gb = b.to(cuda(0)), gy({n}, DType::float32, cuda(0));
  ga.wait_to_read();
  gb.wait_to_read();
  gy.wait_to_write();  // written below outside the engine: nothing else may use it meanwhile

  // Compile time: the expression's kernel tree, its leaves pointing at cuda(0)'s memory.
  auto on_gpu = relu(ga * gb + 2);
  const float* leaves[] = {static_cast<const float*>(ga.raw_data()), static_cast<const float*>(gb.raw_data())};
  auto kernel = kernel::build<float, kernel::flat_leaf>(on_gpu, leaves, nullptr);
  kernels::evaluate<<<256, 256>>>(kernel, static_cast<float*>(gy.raw_data()), n);
  check(cudaGetLastError(), "launching the nvcc-compiled kernel");
  check(cudaDeviceSynchronize(), "running the nvcc-compiled kernel");
  const double nvcc_error = worst_difference(gy.to_vector<float>(), expected);

  // Run time: the same expression evaluated by hybra on cuda(0).
  const double nvrtc_error = worst_difference(Tensor(on_gpu).to_vector<float>(), expected);

  std::printf("relu(a * b + 2) on %lld elements on %s, one kernel each way: max |GPU - CPU| = %g (nvcc), %g (NVRTC)\n",
              static_cast<long long>(n), driver.gpus.front().name.c_str(), nvcc_error, nvrtc_error);
  return nvcc_error <= 1e-6 && nvrtc_error <= 1e-6 ? 0 : 1;
}
