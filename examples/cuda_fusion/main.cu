// relu(a * b + 2) as ONE kernel, from the same expression templates and op
// table the CPU loops use, four ways, each against hybra's CPU result:
// - Thrust on the CPU: with_thrust::evaluate runs the expression's kernel
//   tree through thrust::transform with Thrust's OpenMP backend, and
//   with_thrust::sum fuses sum(relu(a * b + 2)) into one
//   thrust::transform_reduce (what any build, GPU or not, can run);
// - with a GPU, the same two calls on cuda(0) tensors run through Thrust's
//   CUDA backend on hybra's stream;
// - nvcc instantiates kernels/evaluate.cuh for the expression's type (its
//   tensor leaves become device pointers);
// - hybra evaluates the expression on cuda(0) itself, through a kernel NVRTC
//   generates from the type (what a program built with plain g++ gets).
// Built where CMake finds nvcc; with no GPU it runs the CPU half, says why
// it stops there and exits 77 (ctest's "skipped").
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <hybra/eager.hpp>
#include <hybra/expr/thrust.hpp>
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

double relative_difference(const hybra::Tensor& x, const hybra::Tensor& y) {
  const double a = x.item<float>(), b = y.item<float>();
  return std::abs(a - b) / std::max(1.0, std::abs(b));
}

}  // namespace

int main() {
  using namespace hybra;
  const std::int64_t n = 1 << 20;
  seed(1);
  Tensor a = random_uniform({n}, -2, 2), b = random_uniform({n}, -2, 2);
  const std::vector<float> expected = Tensor(relu(a * b + 2)).to_vector<float>();
  const Tensor expected_sum = sum(relu(a * b + 2));

  // The Thrust path on the CPU.
  const double thrust_cpu_error = worst_difference(with_thrust::evaluate(relu(a * b + 2)).to_vector<float>(), expected);
  const double thrust_cpu_sum_error = relative_difference(with_thrust::sum(relu(a * b + 2)), expected_sum);
  std::printf("Thrust on the CPU, one pass each: max |Thrust - hybra| = %g, sum's relative difference %g\n",
              thrust_cpu_error, thrust_cpu_sum_error);
  if (thrust_cpu_error > 1e-6 || thrust_cpu_sum_error > 1e-6) return 1;

  const auto& driver = backend::cuda::driver_status();
  if (driver.gpus.empty()) {
    std::printf("cuda_fusion: the GPU half skipped, no GPU: %s\n", driver.problem.c_str());
    return 77;
  }
  // hybra::cuda: Thrust brings a namespace ::cuda (libcu++) that `using namespace hybra` cannot hide.
  const Device gpu = hybra::cuda(0);
  Tensor ga = a.to(gpu), gb = b.to(gpu), gy({n}, DType::float32, gpu);

  // The Thrust path on cuda(0): the same calls, Thrust's CUDA backend.
  const double thrust_gpu_error = worst_difference(with_thrust::evaluate(relu(ga * gb + 2)).to_vector<float>(), expected);
  const double thrust_gpu_sum_error = relative_difference(with_thrust::sum(relu(ga * gb + 2)), expected_sum);

  // Compile time: the expression's kernel tree, its leaves pointing at cuda(0)'s memory.
  ga.wait_to_read();
  gb.wait_to_read();
  gy.wait_to_write();  // written below outside the engine: nothing else may use it meanwhile
  auto on_gpu = relu(ga * gb + 2);
  const float* leaves[] = {static_cast<const float*>(ga.raw_data()), static_cast<const float*>(gb.raw_data())};
  auto kernel = kernel::build<float>(on_gpu, leaves);
  kernels::evaluate<<<256, 256>>>(kernel, static_cast<float*>(gy.raw_data()), n);
  check(cudaGetLastError(), "launching the nvcc-compiled kernel");
  check(cudaDeviceSynchronize(), "running the nvcc-compiled kernel");
  const double nvcc_error = worst_difference(gy.to_vector<float>(), expected);

  // Run time: the same expression evaluated by hybra on cuda(0).
  const double nvrtc_error = worst_difference(Tensor(on_gpu).to_vector<float>(), expected);

  std::printf("relu(a * b + 2) on %lld elements on %s, one kernel each way: max |GPU - CPU| = %g (Thrust), %g (nvcc), "
              "%g (NVRTC); Thrust's fused sum's relative difference %g\n",
              static_cast<long long>(n), driver.gpus.front().name.c_str(), thrust_gpu_error, nvcc_error, nvrtc_error,
              thrust_gpu_sum_error);
  return thrust_gpu_error <= 1e-6 && nvcc_error <= 1e-6 && nvrtc_error <= 1e-6 && thrust_gpu_sum_error <= 1e-6 ? 0 : 1;
}
