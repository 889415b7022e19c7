// On a real GPU: what cuda(0) computes against what the CPU computes, for
// every elementwise op of the table in every dtype it keeps, a long fused
// expression, copies between the host and GPUs, and the caching allocator.
// Run by ctest's `gpu_ops` (label `gpu`: hybra_tests --no-skip -ts=gpu);
// with no GPU it prints "no GPU:" and the reason, which ctest reports as a
// skip (scripts/gpu.sh fails on a skip).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <hybra/hybra.hpp>
#include <tuple>
#include <vector>

using namespace hybra;

namespace {

bool gpu_present() {
  const auto& s = backend::cuda::driver_status();
  if (s.gpus.empty()) std::printf("no GPU: %s\n", s.problem.c_str());
  return !s.gpus.empty();
}

// Operands every op of the table is defined on: positive, away from zero.
Tensor operand(DType dtype, std::uint64_t seed_value) {
  seed(seed_value);
  Tensor u = random_uniform({4099}, 0.25, 4.0, DType::float64);
  return (is_floating(dtype) ? u : Tensor(u * 2 + 1)).astype(dtype);
}

template <class Op>
void check_op_on_gpu(DType dtype, int& checked) {
  Tensor a = operand(dtype, 1), b = operand(dtype, 2), c = operand(dtype, 3);
  auto on = [](Device d, const Tensor& x) { return x.to(d); };
  auto expression = [&](Device d) {
    if constexpr (Op::arity == 1) return apply_op<Op>(on(d, a));
    else if constexpr (Op::arity == 2) return apply_op<Op>(on(d, a), on(d, b));
    else return apply_op<Op>(on(d, c) - 2, on(d, a), on(d, b));
  };
  bool same_dtype = dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return std::is_same_v<kernel::result_t<decltype(expression(cpu())), T>, T>;
  });
  if (!same_dtype) return;
  CAPTURE(Op::name);
  CAPTURE(name(dtype));
  const std::vector<double> want = Tensor(expression(cpu())).to_vector<double>();
  const std::vector<double> got = Tensor(expression(cuda(0))).to_vector<double>();
  REQUIRE(got.size() == want.size());
  int wrong = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double tolerance = is_floating(dtype) ? 4e-6 * std::max(1.0, std::abs(want[i])) : 0.0;
    wrong += !(std::abs(got[i] - want[i]) <= tolerance);
  }
  CHECK(wrong == 0);
  ++checked;
}

}  // namespace

TEST_SUITE("gpu" * doctest::skip()) {
  TEST_CASE("gpu: every elementwise op, in every dtype it keeps, computes on cuda(0) what it computes on the CPU") {
    if (!gpu_present()) return;
    int checked = 0;
    for (DType dtype : {DType::float32, DType::float64, DType::int32, DType::int64, DType::uint8})
      [&]<class... Ops>(std::tuple<Ops...>*) {
        (check_op_on_gpu<Ops>(dtype, checked), ...);
      }(static_cast<op::elementwise_ops*>(nullptr));
    MESSAGE(checked, " op/dtype pairs checked on ", backend::cuda::driver_status().gpus.front().name);
    CHECK(checked >= 80);
  }

  TEST_CASE("gpu: a long fused expression and copies between the host and GPUs") {
    if (!gpu_present()) return;
    seed(5);
    const std::int64_t n = (1 << 22) + 3;
    Tensor a = random_uniform({n}, -2, 2), b = random_uniform({n}, -2, 2);
    auto chain = [](const Tensor& x, const Tensor& y) { return tanh(relu(x * y + 2) - x / 3 * y + sigmoid(x) * 0.5f); };
    const std::vector<float> want = Tensor(chain(a, b)).to_vector<float>();
    Tensor ga = a.to(cuda(0)), gb = b.to(cuda(0));
    const std::vector<float> got = Tensor(chain(ga, gb)).to_vector<float>();
    double worst = 0;
    for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, double(std::abs(got[i] - want[i])));
    CHECK(worst <= 1e-5);
    CHECK(ga.copy().to_vector<float>() == a.to_vector<float>());
    const int gpus = static_cast<int>(backend::cuda::driver_status().gpus.size());
    for (int g = 1; g < gpus; ++g) CHECK(ga.to(cuda(g)).to_vector<float>() == a.to_vector<float>());
  }

  TEST_CASE("gpu: freed memory is reused, and running out is an OutOfMemory naming the GPU") {
    if (!gpu_present()) return;
    auto& memory = backend::cuda::gpu(0).memory();
    { Tensor t({1 << 20}, DType::float32, cuda(0)); }
    const auto allocations = memory.stats().driver_allocations;
    { Tensor t({1 << 20}, DType::float32, cuda(0)); }
    CHECK(memory.stats().driver_allocations == allocations);
    const auto total = static_cast<std::int64_t>(backend::cuda::driver_status().gpus.front().memory);
    CHECK_THROWS_WITH_AS(Tensor({total}, DType::float64, cuda(0)), doctest::Contains("out of memory on cuda(0)"),
                         OutOfMemory);
  }
}
