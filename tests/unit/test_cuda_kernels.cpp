// The GPU's reductions, argmax and softmax without a GPU: the device code of
// kernels/ runs on the CPU (simt.hpp), launched in the steps
// jit/cuda_reduce.hpp plans for a GPU, and must compute what the CPU ops
// compute; and every program NVRTC makes of it compiles for sm_90 with the
// entries the launches name.
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <hybra/eager.hpp>
#include <string>
#include <type_traits>
#include <vector>

#include "simt.hpp"
// simt.hpp first: it defines the CUDA keywords these use.
#include <kernels/reduce.cuh>
#include <kernels/softmax.cuh>

using namespace hybra;
using jit::Reduction;

namespace {

constexpr Reduction all_reductions[] = {Reduction::sum, Reduction::mean, Reduction::max, Reduction::min,
                                        Reduction::argmax};
constexpr DType all_dtypes[] = {DType::float32, DType::float64, DType::int32, DType::int64, DType::uint8};

// f.operator()<P, In, Out>() with the policy and types jit/cuda_reduce.hpp
// compiles reduction r of dtype d with.
template <class F>
void with_policy(Reduction r, DType d, F&& f) {
  dispatch(d, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using namespace hybra::kernels;
    constexpr bool real = std::is_floating_point_v<T>;
    switch (r) {
      case Reduction::sum:
        if constexpr (real) f.template operator()<reduce_sum<double>, T, T>();
        else f.template operator()<reduce_sum<unsigned long long>, T, long long>();
        return;
      case Reduction::mean: f.template operator()<reduce_mean, T, std::conditional_t<real, T, float>>(); return;
      case Reduction::max: f.template operator()<reduce_extreme<T, true>, T, T>(); return;
      case Reduction::min: f.template operator()<reduce_extreme<T, false>, T, T>(); return;
      case Reduction::argmax: f.template operator()<reduce_argmax<T>, T, long long>(); return;
    }
  });
}

// The plan's launches, each run by simt.hpp's threads.
template <class P, class In, class Out>
void simulate_reduce(const jit::ReducePlan& plan, const In* x, Out* out) {
  using Acc = typename P::acc;
  std::vector<std::max_align_t> scratch(static_cast<std::size_t>(plan.scratch_bytes) / sizeof(std::max_align_t) + 1);
  jit::run_reduce_plan(plan, x, out, scratch.data(), [&](const jit::ReduceStep& s, const void* src, void* dst) {
    auto run = [&]<bool FromAcc, bool ToAcc>() {
      using I = std::conditional_t<FromAcc, Acc, In>;
      using O = std::conditional_t<ToAcc, Acc, Out>;
      const I* xs = static_cast<const I*>(src);
      O* os = static_cast<O*>(dst);
      simt::launch(s.blocks, s.threads, [&] {
        if (s.columns) kernels::reduce_columns<P, I, O, FromAcc, ToAcc>(xs, os, s.O, s.R, s.I, s.len, plan.count);
        else kernels::reduce_rows<P, I, O, FromAcc, ToAcc>(xs, os, s.O, s.R, s.len, plan.count);
      });
    };
    if (s.from_acc && s.to_acc) run.template operator()<true, true>();
    else if (s.from_acc) run.template operator()<true, false>();
    else if (s.to_acc) run.template operator()<false, true>();
    else run.template operator()<false, false>();
  });
}

Tensor cpu_reduction(Reduction r, const Tensor& x, const std::optional<std::vector<std::int64_t>>& axes) {
  const Axes a = axes ? Axes(*axes) : Axes();
  switch (r) {
    case Reduction::sum: return sum(x, a);
    case Reduction::mean: return mean(x, a);
    case Reduction::max: return max(x, a);
    case Reduction::min: return min(x, a);
    case Reduction::argmax: return axes ? argmax(x, axes->front()) : argmax(x);
  }
  return {};
}

// What the GPU path computes for reduction r of x over axes, on a GPU of
// `sms` multiprocessors with blocks of at most max_threads.
Tensor simulated_reduction(Reduction r, const Tensor& x, const std::optional<std::vector<std::int64_t>>& axes,
                           const Tensor& like, int sms, unsigned max_threads) {
  namespace rd = detail::reduce;
  const auto mask = rd::axis_mask(x.shape(), axes, "test");
  const auto blocks = rd::passes(rd::collapse(x.shape(), mask));
  Tensor out(like.shape(), like.dtype());
  x.wait_to_read();  // raw_data() does not wait for the op computing x
  with_policy(r, x.dtype(), [&]<class P, class In, class Out>() {
    REQUIRE(sizeof(typename P::acc) == static_cast<std::size_t>(rd::gpu_acc_bytes(r, x.dtype())));
    REQUIRE(sizeof(Out) == size_of(like.dtype()));
    const auto plan = jit::plan_reduce(blocks, rd::gpu_acc_bytes(r, x.dtype()), sms, max_threads);
    simulate_reduce<P>(plan, static_cast<const In*>(x.raw_data()), static_cast<Out*>(out.raw_data()));
  });
  return out;
}

Tensor sample(DType d, const Shape& shape, std::uint64_t seed_value) {
  seed(seed_value);
  if (is_floating(d)) return random_normal(shape, 0, 3, d);
  const double low = d == DType::uint8 ? 0 : -1000;
  return random_uniform(shape, low, 1000, DType::float64).astype(d);
}

void check_close(const Tensor& got, const Tensor& want) {
  REQUIRE(got.shape() == want.shape());
  REQUIRE(got.dtype() == want.dtype());
  const auto g = got.to_vector<double>(), w = want.to_vector<double>();
  int wrong = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double tolerance = want.dtype() == DType::float32 ? 1e-6 * std::max(1.0, std::abs(w[i]))
                             : is_floating(want.dtype())    ? 1e-12 * std::max(1.0, std::abs(w[i]))
                                                            : 0.0;
    const bool same = std::isnan(w[i]) ? std::isnan(g[i]) : std::abs(g[i] - w[i]) <= tolerance;
    if (!same && wrong++ < 3) MESSAGE("element ", i, ": ", g[i], " instead of ", w[i]);
  }
  CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("cuda kernels: every reduction of every dtype, planned for a GPU and run on simulated threads, is the CPU's") {
  struct Case {
    Shape shape;
    std::optional<std::vector<std::int64_t>> axes;
  };
  const std::vector<Case> cases = {
      {{10000}, std::nullopt},        // one row in pieces, then the pieces
      {{37, 300}, std::vector<std::int64_t>{1}},   // rows; more rows than blocks on one multiprocessor
      {{300, 37}, std::vector<std::int64_t>{0}},   // columns in pieces
      {{5000, 3}, std::vector<std::int64_t>{0}},   // few columns: many pieces
      {{6, 5, 7, 4}, std::vector<std::int64_t>{0, 2}},  // interleaved axes: two passes
      {{6, 5, 7, 4}, std::vector<std::int64_t>{3}},
      {{1, 9, 1}, std::vector<std::int64_t>{1}},
  };
  int checked = 0;
  for (const Case& c : cases)
    for (Reduction r : all_reductions) {
      if (r == Reduction::argmax && c.axes && c.axes->size() > 1) continue;
      for (DType d : all_dtypes) {
        const Tensor x = sample(d, c.shape, 17);
        const Tensor want = cpu_reduction(r, x, c.axes);
        for (int sms : {1, 8}) {
          CAPTURE(to_string(c.shape));
          CAPTURE(jit::detail::reduction_name(r));
          CAPTURE(name(d));
          CAPTURE(sms);
          check_close(simulated_reduction(r, x, c.axes, want, sms, sms == 1 ? 32 : 64), want);
          ++checked;
        }
      }
    }
  CHECK(checked == 340);
}

TEST_CASE("cuda kernels: NaN wins max, min and argmax; argmax takes the first of equal maxima") {
  Tensor x = array<float>({1, 5, 5, 2, NAN, 3, NAN, 5}, {8});
  Tensor ties = array<double>({-1, 7, 3, 7, 7, 0}, {2, 3});
  for (Reduction r : {Reduction::max, Reduction::min, Reduction::argmax}) {
    CAPTURE(jit::detail::reduction_name(r));
    check_close(simulated_reduction(r, x, std::nullopt, cpu_reduction(r, x, std::nullopt), 1, 32),
                cpu_reduction(r, x, std::nullopt));
  }
  const Tensor first = simulated_reduction(Reduction::argmax, ties, std::vector<std::int64_t>{1},
                                           argmax(ties, 1), 1, 32);
  CHECK(first.to_vector<std::int64_t>() == std::vector<std::int64_t>{1, 0});
  CHECK(argmax(ties, 1).to_vector<std::int64_t>() == std::vector<std::int64_t>{1, 0});
}

TEST_CASE("cuda kernels: a whole-tensor sum of 2^20 float32 in pieces is correct to float32 rounding") {
  const Tensor x = full({1 << 20}, 0.1, DType::float32);
  const Tensor got = simulated_reduction(Reduction::sum, x, std::nullopt, sum(x), 16, 256);
  const auto plan = jit::plan_reduce(std::vector<std::array<std::int64_t, 3>>{{1, 1 << 20, 1}}, 8, 16);
  CHECK(plan.steps.size() == 2);  // the pieces (one block each, four per multiprocessor), then the pieces' sum
  CHECK(plan.steps[0].blocks == 64);
  CHECK(got.item<float>() == sum(x).item<float>());
  CHECK(std::abs(got.item<float>() - 0.1f * (1 << 20)) <= 0.1f * (1 << 20) * 1e-6);
  const auto h100 = jit::plan_reduce(std::vector<std::array<std::int64_t, 3>>{{1, 1 << 26, 1}}, 8, 132);
  CHECK(h100.steps[0].blocks == 528);  // an H100's 132 multiprocessors, four blocks each
}

TEST_CASE("cuda kernels: softmax and log_softmax, planned for a GPU and run on simulated threads, are the CPU's") {
  for (DType d : {DType::float32, DType::float64})
    for (const auto& [shape, axis] : std::vector<std::pair<Shape, int>>{{{40, 10}, 1}, {{3, 700}, -1}, {{5, 9, 6}, 1},
                                                                      {{300, 4}, 0}})
      for (bool log : {false, true}) {
        Tensor x = sample(d, shape, 5) * 100;  // large values: exp would overflow without the maximum subtracted
        const Tensor want = log ? log_softmax(x, axis) : softmax(x, axis);
        x.wait_to_read();
        std::int64_t O = 1, I = 1;
        const auto ax = static_cast<std::size_t>(axis < 0 ? axis + static_cast<int>(shape.size()) : axis);
        for (std::size_t k = 0; k < shape.size(); ++k) {
          if (k < ax) O *= shape[k];
          if (k > ax) I *= shape[k];
        }
        const std::int64_t R = shape[ax];
        Tensor got(shape, d);
        dispatch(d, [&](auto tag) {
          using T = typename decltype(tag)::type;
          if constexpr (std::is_floating_point_v<T>) {
            const T* xs = static_cast<const T*>(x.raw_data());
            T* ys = static_cast<T*>(got.raw_data());
            const jit::SoftmaxLaunch launch = jit::plan_softmax(O, R, I, 1);
            simt::launch(launch.blocks, launch.threads, [&] {
              if (!launch.columns) log ? kernels::softmax_rows<true>(xs, ys, O, R) : kernels::softmax_rows<false>(xs, ys, O, R);
              else log ? kernels::softmax_columns<true>(xs, ys, O, R, I) : kernels::softmax_columns<false>(xs, ys, O, R, I);
            });
          }
        });
        CAPTURE(to_string(shape));
        CAPTURE(axis);
        CAPTURE(log);
        check_close(got, want);
      }
}

TEST_CASE("cuda kernels: every reduction and softmax program compiles for sm_90, with the entries its launches name") {
  REQUIRE_MESSAGE(backend::cuda::nvrtc().loaded(), "NVRTC (the CUDA toolkit) is needed: ", backend::cuda::nvrtc().problem());
  for (Reduction r : all_reductions)
    for (DType d : all_dtypes) {
      CAPTURE(jit::detail::reduction_name(r));
      CAPTURE(name(d));
      const std::string source = jit::cuda_reduce_program(r, d);
      const Tensor like = cpu_reduction(r, zeros({2}, d), std::nullopt);
      CHECK(source.find("using Out = " + std::string(jit::cuda_type(like.dtype())) + ";") != std::string::npos);
      const std::string ptx = jit::cuda_ptx(source, "reduce.cu");
      for (bool columns : {false, true})
        for (bool from_acc : {false, true})
          for (bool to_acc : {false, true})
            CHECK(ptx.find(".entry " + jit::detail::reduce_entry(r, d, {columns, from_acc, to_acc, 0, 0, 0, 0, 0, 0, 0, 0})) !=
                  std::string::npos);
    }
  for (DType d : {DType::float32, DType::float64})
    for (bool log : {false, true}) {
      const std::string ptx = jit::cuda_ptx(jit::cuda_softmax_program(log, d), "softmax.cu");
      CHECK(ptx.find(".entry " + jit::softmax_entry(log, d, false)) != std::string::npos);
      CHECK(ptx.find(".entry " + jit::softmax_entry(log, d, true)) != std::string::npos);
    }
}
