// The GPU's reductions, argmax, softmax, cumsum, embedding, convolutions, pooling,
// batch_norm, copies between layouts and random fills without a GPU: the device code of kernels/ runs on the CPU
// (simt.hpp), launched in the steps backend/cuda/reduce.hpp and
// ops/conv_cuda.hpp plan for a GPU (a CPU GEMM standing in for cuBLAS), and
// must compute what the CPU ops compute; and every program NVRTC makes of
// it compiles for sm_90 with the entries the launches name.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <functional>
#include <numeric>
#include <hybra/eager.hpp>
#include <hybra/backend/cuda/layout.hpp>
#include <hybra/backend/cuda/random.hpp>
#include <hybra/ops/conv_backward.hpp>
#include <hybra/ops/pool_backward.hpp>
#include <string>
#include <type_traits>
#include <vector>

#include "simt.hpp"
// simt.hpp first: it defines the CUDA keywords these use.
#include <kernels/batch_norm.cuh>
#include <kernels/conv.cuh>
#include <kernels/copy.cuh>
#include <kernels/cumsum.cuh>
#include <kernels/embedding.cuh>
#include <kernels/pool.cuh>
#include <kernels/random.cuh>
#include <kernels/reduce.cuh>
#include <kernels/softmax.cuh>

using namespace hybra;
using backend::cuda::Reduction;

namespace {

constexpr Reduction all_reductions[] = {Reduction::sum, Reduction::mean, Reduction::max, Reduction::min,
                                        Reduction::argmax};
constexpr DType all_dtypes[] = {DType::float32, DType::float64, DType::int32, DType::int64, DType::uint8};

// f.operator()<P, In, Out>() with the policy and types backend/cuda/reduce.hpp
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
void simulate_reduce(const backend::cuda::ReducePlan& plan, const In* x, Out* out) {
  using Acc = typename P::acc;
  std::vector<std::max_align_t> scratch(static_cast<std::size_t>(plan.scratch_bytes) / sizeof(std::max_align_t) + 1);
  backend::cuda::run_reduce_plan(
      plan, x, out, scratch.data(), [&](const backend::cuda::ReduceStep& s, const void* src, void* dst) {
        auto run = [&]<bool FromAcc, bool ToAcc>() {
          using I = std::conditional_t<FromAcc, Acc, In>;
          using O = std::conditional_t<ToAcc, Acc, Out>;
          const I* xs = static_cast<const I*>(src);
          O* os = static_cast<O*>(dst);
          simt::launch(s.blocks, s.threads, [&] {
            if (s.columns)
              kernels::reduce_columns<P, I, O, FromAcc, ToAcc>(xs, os, s.O, s.R, s.I, s.len, plan.count);
            else
              kernels::reduce_rows<P, I, O, FromAcc, ToAcc>(xs, os, s.O, s.R, s.len, plan.count);
          });
        };
        if (s.from_acc && s.to_acc)
          run.template operator()<true, true>();
        else if (s.from_acc)
          run.template operator()<true, false>();
        else if (s.to_acc)
          run.template operator()<false, true>();
        else
          run.template operator()<false, false>();
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
    const auto plan = backend::cuda::plan_reduce(blocks, rd::gpu_acc_bytes(r, x.dtype()), sms, max_threads);
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
      {{5, 1024}, std::vector<std::int64_t>{1}},  // the longest rows a warp reduces
      {{3, 1025}, std::vector<std::int64_t>{1}},  // the shortest a block does
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
          CAPTURE(backend::cuda::detail::reduction_name(r));
          CAPTURE(name(d));
          CAPTURE(sms);
          check_close(simulated_reduction(r, x, c.axes, want, sms, sms == 1 ? 32 : 64), want);
          ++checked;
        }
      }
    }
  CHECK(checked == 440);
}

static_assert(kernels::warp_row_limit == backend::cuda::warp_row_elements);

TEST_CASE("cuda kernels: short rows take a warp each, up to 8 in a block; longer ones a block") {
  using Blocks = std::vector<std::array<std::int64_t, 3>>;
  const auto rows = backend::cuda::plan_reduce(Blocks{{37, 300, 1}}, 8, 132);
  REQUIRE(rows.steps.size() == 1);
  CHECK(rows.steps[0].threads == 256);
  CHECK(rows.steps[0].blocks == 5);  // 37 rows, 8 a block
  const auto few = backend::cuda::plan_reduce(Blocks{{3, 1024, 1}}, 8, 132);
  CHECK(few.steps[0].threads == 96);
  CHECK(few.steps[0].blocks == 1);
  const auto long_rows = backend::cuda::plan_reduce(Blocks{{3, 1025, 1}}, 8, 132);
  CHECK(long_rows.steps[0].threads == 256);
  CHECK(long_rows.steps[0].blocks == 3);
  const auto softmax = backend::cuda::plan_softmax(65536, 1024, 1, 132);
  CHECK(softmax.threads == 256);
  CHECK(softmax.blocks == 132 * 32);  // capped: the warps take turns
  CHECK(backend::cuda::plan_softmax(3, 1025, 1, 132).threads == 256);
  CHECK(backend::cuda::plan_softmax(3, 10, 1, 132).threads == 96);
}

TEST_CASE("cuda kernels: NaN wins max, min and argmax; argmax takes the first of equal maxima") {
  Tensor x = array<float>({1, 5, 5, 2, NAN, 3, NAN, 5}, {8});
  Tensor ties = array<double>({-1, 7, 3, 7, 7, 0}, {2, 3});
  for (Reduction r : {Reduction::max, Reduction::min, Reduction::argmax}) {
    CAPTURE(backend::cuda::detail::reduction_name(r));
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
  const auto plan = backend::cuda::plan_reduce(std::vector<std::array<std::int64_t, 3>>{{1, 1 << 20, 1}}, 8, 16);
  CHECK(plan.steps.size() == 2);  // the pieces (one block each, sixteen per multiprocessor), then the pieces' sum
  CHECK(plan.steps[0].blocks == 256);
  CHECK(got.item<float>() == sum(x).item<float>());
  CHECK(std::abs(got.item<float>() - 0.1f * (1 << 20)) <= 0.1f * (1 << 20) * 1e-6);
  const auto h100 = backend::cuda::plan_reduce(std::vector<std::array<std::int64_t, 3>>{{1, 1 << 26, 1}}, 8, 132);
  CHECK(h100.steps[0].blocks == 2112);  // an H100's 132 multiprocessors, sixteen blocks each
}

TEST_CASE("cuda kernels: softmax and log_softmax, planned for a GPU and run on simulated threads, are the CPU's") {
  for (DType d : {DType::float32, DType::float64})
    for (const auto& [shape, axis] : std::vector<std::pair<Shape, int>>{{{40, 10}, 1}, {{3, 700}, -1}, {{5, 9, 6}, 1},
                                                                      {{300, 4}, 0}, {{37, 50}, 1}, {{2, 1500}, 1}})
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
            const backend::cuda::SoftmaxLaunch launch = backend::cuda::plan_softmax(O, R, I, 1);
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

// Both block combines of kernels/reduce.cuh: the shared-memory tree, which
// the cases above run on simulated threads, and CUB's warp shuffles
// (HYBRA_CUDA_CUB), which simulated threads cannot run: NVRTC compiles them,
// and the rest of each kernel (loads, pieces, stores) is the code run above.
TEST_CASE("cuda kernels: every reduction and softmax program compiles for sm_90, with the entries its launches name") {
  REQUIRE_MESSAGE(backend::cuda::nvrtc().loaded(), "NVRTC (the CUDA toolkit) is needed: ", backend::cuda::nvrtc().problem());
  for (bool cub : {false, true}) {
    CAPTURE(cub);
    for (Reduction r : all_reductions)
      for (DType d : all_dtypes) {
        CAPTURE(backend::cuda::detail::reduction_name(r));
        CAPTURE(name(d));
        const std::string source = backend::cuda::cuda_reduce_program(r, d, cub);
        const Tensor like = cpu_reduction(r, zeros({2}, d), std::nullopt);
        CHECK(source.find("using Out = " + std::string(backend::cuda::cuda_type(like.dtype())) + ";") !=
              std::string::npos);
        const std::string ptx = backend::cuda::cuda_ptx(source, "reduce.cu");
        CHECK((ptx.find("shfl.sync") != std::string::npos) == cub);
        for (bool columns : {false, true})
          for (bool from_acc : {false, true})
            for (bool to_acc : {false, true})
              CHECK(ptx.find(".entry " + backend::cuda::detail::reduce_entry(
                                             r, d, {columns, from_acc, to_acc, 0, 0, 0, 0, 0, 0, 0, 0}, cub) +
                             "(") != std::string::npos);
      }
    for (DType d : {DType::float32, DType::float64})
      for (bool log : {false, true}) {
        const std::string ptx = backend::cuda::cuda_ptx(backend::cuda::cuda_softmax_program(log, d, cub), "softmax.cu");
        CHECK((ptx.find("shfl.sync") != std::string::npos) == cub);
        CHECK(ptx.find(".entry " + backend::cuda::softmax_entry(log, d, false, cub) + "(") != std::string::npos);
        CHECK(ptx.find(".entry " + backend::cuda::softmax_entry(log, d, true, cub) + "(") != std::string::npos);
      }
  }
}

namespace {

// got against want to within `relative` of want's largest magnitude (at
// least 1): the GPU's sums run in another order than the CPU's.
void check_near(const Tensor& got, const Tensor& want, double relative) {
  REQUIRE(got.shape() == want.shape());
  REQUIRE(got.dtype() == want.dtype());
  const auto g = got.to_vector<double>(), w = want.to_vector<double>();
  double scale = 1;
  for (double v : w)
    if (std::isfinite(v)) scale = std::max(scale, std::abs(v));
  int wrong = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const bool same = std::isnan(w[i]) ? std::isnan(g[i]) : std::abs(g[i] - w[i]) <= relative * scale;
    if (!same && wrong++ < 3) MESSAGE("element ", i, ": ", g[i], " instead of ", w[i]);
  }
  CHECK(wrong == 0);
}

double tolerance(DType d) { return d == DType::float32 ? 1e-5 : 1e-12; }

// cuBLAS's part, on the CPU: c = op(a) op(b) (+ c), row-major as
// backend::cuda::gemm takes its operands.
template <class T>
void cpu_gemm(const detail::nn::ConvStep& s, const T* a, const T* b, T* c) {
  for (std::int64_t i = 0; i < s.M; ++i)
    for (std::int64_t j = 0; j < s.N; ++j) {
      T sum = 0;
      for (std::int64_t k = 0; k < s.K; ++k)
        sum += (s.trans_a ? a[k * s.lda + i] : a[i * s.lda + k]) * (s.trans_b ? b[j * s.ldb + k] : b[k * s.ldb + j]);
      c[i * s.ldc + j] = s.accumulate ? c[i * s.ldc + j] + sum : sum;
    }
}

// A pass of the convolution g planned for a GPU (scratch under
// scratch_limit elements) and run on simulated threads: operands as the
// op takes them, the result of out_shape.
Tensor simulated_conv(detail::nn::ConvPass pass, const detail::nn::Conv2dGeometry& g,
                      const std::vector<Tensor>& operands, const Shape& out_shape, std::int64_t scratch_limit) {
  const DType d = operands[0].dtype();
  const bool bias = pass == detail::nn::ConvPass::forward && operands.size() == 3;
  const detail::nn::ConvPlan plan = detail::nn::plan_conv2d(pass, g, bias, 1, scratch_limit);
  Tensor out(out_shape, d);
  std::vector<const void*> in;
  for (const Tensor& t : operands) {
    t.wait_to_read();
    in.push_back(t.raw_data());
  }
  const auto geometry = std::bit_cast<kernels::conv_geometry>(g);
  dispatch(d, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_floating_point_v<T>) {
      std::vector<T> scratch(static_cast<std::size_t>(plan.scratch_elements) + 1);
      detail::nn::run_conv_plan(
          plan, in, out.raw_data(), scratch.data(), sizeof(T),
          [&](const detail::nn::ConvStep& s, void* a, void* b, void* c) {
            const T* x = static_cast<const T*>(a);
            T* y = static_cast<T*>(c);
            simt::launch(s.grid.blocks, s.grid.threads, [&] {
              switch (s.kernel) {
                case detail::nn::ConvKernel::im2col: kernels::im2col(x, y, geometry, s.images); break;
                case detail::nn::ConvKernel::conv_output:
                  kernels::conv_output(x, static_cast<const T*>(b), y, geometry, s.images);
                  break;
                case detail::nn::ConvKernel::filters_major: kernels::filters_major(x, y, geometry, s.images); break;
                case detail::nn::ConvKernel::col2im: kernels::col2im(x, y, geometry, s.images); break;
                case detail::nn::ConvKernel::fill_zero: kernels::fill_zero(y, s.images); break;
              }
            });
          },
          [&](const detail::nn::ConvStep& s, void* a, void* b, void* c) {
            cpu_gemm<T>(s, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(c));
          });
    }
  });
  return out;
}

struct ConvCase {
  Shape x, w;
  bool bias;
  Size2d stride, padding, dilation;
  std::int64_t groups;
};

}  // namespace

TEST_CASE("cuda kernels: conv2d and both its gradients, planned for a GPU and run on simulated threads, are the CPU's") {
  const std::vector<ConvCase> cases = {
      {{4, 1, 28, 28}, {6, 1, 5, 5}, true, 1, 2, 1, 1},      // LeNet's first layer
      {{4, 6, 14, 14}, {16, 6, 5, 5}, true, 1, 0, 1, 1},     // and its second
      {{3, 4, 9, 8}, {5, 4, 3, 3}, false, 2, 1, 1, 1},       // stride 2, padding
      {{2, 3, 10, 9}, {4, 3, 3, 2}, true, {1, 2}, {2, 1}, 2, 1},  // dilation, uneven stride and padding
      {{2, 4, 7, 7}, {6, 2, 3, 3}, true, 2, 1, 1, 2},        // two groups
      {{2, 3, 6, 6}, {3, 1, 3, 3}, false, 1, 1, 1, 3},       // depthwise
      {{2, 2, 10, 10}, {3, 2, 2, 2}, true, 3, 0, 1, 1},      // stride beyond the kernel: pixels no window reads
  };
  int checked = 0;
  for (const ConvCase& c : cases)
    for (DType d : {DType::float32, DType::float64}) {
      const Tensor x = sample(d, c.x, 3), w = sample(d, c.w, 4), b = sample(d, {c.w[0]}, 5);
      const auto g = detail::nn::conv2d_geometry(c.x, c.w, c.stride, c.padding, c.dilation, c.groups);
      const Tensor y = conv2d(x, w, c.bias ? b : Tensor{}, c.stride, c.padding, c.dilation, c.groups);
      const Tensor dy = sample(d, y.shape(), 6);
      const Tensor dx = conv2d_backward_data(dy, w, c.x, c.stride, c.padding, c.dilation, c.groups);
      const Tensor dw = conv2d_backward_weight(dy, x, c.w, c.stride, c.padding, c.dilation, c.groups);
      // All the images in one chunk, and one or two images a chunk (dW accumulates across chunks).
      const std::int64_t per_image = (g.C * g.KH * g.KW + g.F) * g.OH * g.OW;
      for (std::int64_t limit : {detail::nn::conv_scratch_elements, per_image, 2 * per_image + 1}) {
        CAPTURE(to_string(c.x));
        CAPTURE(to_string(c.w));
        CAPTURE(name(d));
        CAPTURE(limit);
        const std::vector<Tensor> forward = c.bias ? std::vector<Tensor>{x, w, b} : std::vector<Tensor>{x, w};
        check_near(simulated_conv(detail::nn::ConvPass::forward, g, forward, y.shape(), limit), y, tolerance(d));
        check_near(simulated_conv(detail::nn::ConvPass::backward_data, g, {dy, w}, c.x, limit), dx, tolerance(d));
        check_near(simulated_conv(detail::nn::ConvPass::backward_weight, g, {dy, x}, c.w, limit), dw, tolerance(d));
        ++checked;
      }
    }
  CHECK(checked == 42);
  // The plans: LeNet's first layer in one chunk is one im2col, one GEMM, one conv_output; two groups, two GEMMs.
  const auto lenet = detail::nn::conv2d_geometry({256, 1, 28, 28}, {6, 1, 5, 5}, 1, 2, 1, 1);
  const auto forward = detail::nn::plan_conv2d(detail::nn::ConvPass::forward, lenet, true, 132);
  REQUIRE(forward.steps.size() == 3);
  CHECK(forward.steps[1].gemm);
  CHECK(forward.steps[1].M == 6);
  CHECK(forward.steps[1].N == 256 * 28 * 28);
  CHECK(forward.steps[1].K == 25);
  const auto weight = detail::nn::plan_conv2d(detail::nn::ConvPass::backward_weight, lenet, false, 132, 31 * 784 * 100);
  REQUIRE(weight.steps.size() == 9);  // three chunks of at most 100 images: filters_major, im2col, a GEMM each
  CHECK(!weight.steps[2].accumulate);
  CHECK(weight.steps[5].accumulate);
  CHECK(weight.steps[8].accumulate);
}

TEST_CASE("cuda kernels: a convolution nothing contributes to is zeros, or the bias alone") {
  for (DType d : {DType::float32, DType::float64}) {
    CAPTURE(name(d));
    const Tensor w = sample(d, {0, 2, 3, 3}, 1), dy = zeros({2, 0, 3, 3}, d);
    const auto no_filters = detail::nn::conv2d_geometry({2, 2, 5, 5}, {0, 2, 3, 3}, 1, 0, 1, 1);
    check_near(simulated_conv(detail::nn::ConvPass::backward_data, no_filters, {dy, w}, {2, 2, 5, 5}, 1 << 20),
               zeros({2, 2, 5, 5}, d), 0);
    const auto no_images = detail::nn::conv2d_geometry({0, 2, 5, 5}, {4, 2, 3, 3}, 1, 0, 1, 1);
    check_near(simulated_conv(detail::nn::ConvPass::backward_weight, no_images,
                              {zeros({0, 4, 3, 3}, d), zeros({0, 2, 5, 5}, d)}, {4, 2, 3, 3}, 1 << 20),
               zeros({4, 2, 3, 3}, d), 0);
    const Tensor x = zeros({2, 0, 5, 5}, d), empty_w = zeros({3, 0, 3, 3}, d), b = sample(d, {3}, 2);
    const auto no_channels = detail::nn::conv2d_geometry(x.shape(), empty_w.shape(), 1, 0, 1, 1);
    check_near(simulated_conv(detail::nn::ConvPass::forward, no_channels, {x, empty_w, b}, {2, 3, 3, 3}, 1 << 20),
               conv2d(x, empty_w, b), 0);
  }
}

namespace {

struct PoolCase {
  Shape x;
  Size2d kernel, stride, padding;
  bool count_include_pad;
  PoolingConvention convention = PoolingConvention::valid;
};

// A pooling (or its gradient) of geometry g on simulated threads, launched
// as ops/conv_cuda.hpp launches it.
template <bool Max>
Tensor simulated_pool(const detail::nn::Pool2dGeometry& g, const Tensor& x, const Tensor* dy, bool count_include_pad) {
  const DType d = x.dtype();
  const bool per_window = Max && dy && detail::nn::disjoint_windows(g);
  // Zeroed where the launch zeroes dx first; else NaN, which every element written replaces.
  const Shape shape = dy ? x.shape() : Shape{g.N, g.C, g.OH, g.OW};
  Tensor out = per_window ? zeros(shape, d) : full(shape, NAN, d);
  out.wait_to_write();
  x.wait_to_read();
  if (dy) dy->wait_to_read();
  const auto geometry = std::bit_cast<kernels::pool_geometry>(g);
  dispatch(d, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_floating_point_v<T>) {
      const T* xs = static_cast<const T*>(x.raw_data());
      T* ys = static_cast<T*>(out.raw_data());
      const backend::cuda::ElementwiseGrid grid =
          backend::cuda::grid_over(per_window ? g.N * g.C * g.OH * g.OW : out.size(), 1);
      simt::launch(grid.blocks, grid.threads, [&] {
        const T* dys = dy ? static_cast<const T*>(dy->raw_data()) : nullptr;
        if (per_window) kernels::max_pool2d_backward_disjoint<T>(dys, xs, ys, geometry);
        else if (dy) kernels::pool2d_backward<T, Max>(dys, xs, ys, geometry, count_include_pad);
        else kernels::pool2d<T, Max>(xs, ys, geometry, count_include_pad);
      });
    }
  });
  return out;
}

// Pooling cases of x, max and average, forward and backward, against the CPU.
void check_pools(const Tensor& x, const PoolCase& c, bool global, std::uint64_t seed_value) {
  const DType d = x.dtype();
  const Size2d kernel = global ? Size2d(c.x[2], c.x[3]) : c.kernel;
  const Size2d stride = global ? Size2d(1) : c.stride, padding = global ? Size2d(0) : c.padding;
  const bool include_pad = global || c.count_include_pad;
  const auto g = detail::nn::pool2d_geometry("test", c.x, kernel, stride, padding, c.convention);
  for (bool max : {true, false}) {
    CAPTURE(max);
    const Tensor y = global ? (max ? global_max_pool2d(x) : global_avg_pool2d(x))
                            : (max ? max_pool2d(x, kernel, stride, padding, c.convention)
                                   : avg_pool2d(x, kernel, stride, padding, include_pad, c.convention));
    const Tensor dy = sample(d, y.shape(), seed_value);
    const Tensor dx = pool2d_backward(dy, x, max, kernel, stride, padding, include_pad, c.convention);
    if (max) {
      check_near(simulated_pool<true>(g, x, nullptr, include_pad), y, 0);  // a maximum is exact
      check_near(simulated_pool<true>(g, x, &dy, include_pad), dx, 0);    // and so its gradient, summed in the CPU's order
    } else {
      check_near(simulated_pool<false>(g, x, nullptr, include_pad), y, tolerance(d));
      check_near(simulated_pool<false>(g, x, &dy, include_pad), dx, 0);
    }
  }
}

}  // namespace

TEST_CASE("cuda kernels: max and average pooling and their gradients, run on simulated threads, are the CPU's") {
  const std::vector<PoolCase> cases = {
      {{2, 3, 28, 28}, 2, 2, 0, true},         // LeNet's
      {{2, 3, 9, 9}, 2, 2, 0, true},           // an odd size: the last row and column are in no window
      {{2, 2, 9, 10}, 3, 2, 1, true},          // overlapping windows, padding
      {{2, 2, 9, 10}, 3, 2, 1, false},         // average over the input only
      {{1, 2, 7, 8}, {2, 3}, {1, 2}, {1, 1}, false},
      {{1, 1, 6, 6}, 3, 1, 0, true},
      // pooling_convention full: last windows past the padded input, not counted by an average
      {{2, 2, 10, 9}, 3, 2, 1, true, PoolingConvention::full},
      {{1, 2, 7, 8}, {2, 3}, {1, 2}, {1, 1}, false, PoolingConvention::full},
      {{2, 2, 9, 9}, 2, 2, 0, true, PoolingConvention::full},
  };
  int checked = 0;
  for (DType d : {DType::float32, DType::float64}) {
    for (const PoolCase& c : cases) {
      CAPTURE(to_string(c.x));
      CAPTURE(c.kernel);
      CAPTURE(c.count_include_pad);
      CAPTURE(name(d));
      check_pools(sample(d, c.x, 8), c, false, 9);
      ++checked;
    }
    for (const Shape& shape : {Shape{2, 3, 7, 7}, Shape{1, 2, 1, 5}}) {
      CAPTURE(to_string(shape));
      check_pools(sample(d, shape, 10), {shape, 1, 1, 0, true}, true, 11);
      ++checked;
    }
  }
  CHECK(checked == 22);
}

TEST_CASE("cuda kernels: a max pool's gradient goes to each window's first maximum; NaN wins, its first one") {
  for (DType d : {DType::float32, DType::float64}) {
    CAPTURE(name(d));
    // Few distinct values: most windows hold their maximum more than once.
    const Tensor ties = random_uniform({2, 2, 8, 9}, 0, 3, DType::float64).astype(DType::int32).astype(d);
    for (const PoolCase& c : {PoolCase{{2, 2, 8, 9}, 3, 1, 0, true}, PoolCase{{2, 2, 8, 9}, 2, 2, 0, true},
                              PoolCase{{2, 2, 8, 9}, 3, 2, 1, true}})
      check_pools(ties, c, false, 12);
    check_pools(ties, {{2, 2, 8, 9}, 1, 1, 0, true}, true, 13);
    Tensor nans = sample(d, {1, 1, 4, 4}, 14);
    nans = where(array<double>({0, 1, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0}, {1, 1, 4, 4}) > 0,
                 full({1, 1, 4, 4}, NAN, d), nans);
    check_pools(nans, {{1, 1, 4, 4}, 2, 2, 0, true}, false, 15);
    check_pools(nans, {{1, 1, 4, 4}, 3, 1, 1, true}, false, 15);
  }
}

TEST_CASE("cuda kernels: batch_norm on simulated threads is the CPU's, along any axis") {
  for (DType d : {DType::float32, DType::float64})
    for (const auto& [shape, axis] : std::vector<std::pair<Shape, std::int64_t>>{{{3, 4, 5, 2}, 1}, {{6, 5}, -1},
                                                                                  {{2, 3, 4}, 0}}) {
      CAPTURE(name(d));
      CAPTURE(to_string(shape));
      const auto a = static_cast<std::size_t>(axis < 0 ? axis + static_cast<std::int64_t>(shape.size()) : axis);
      const std::int64_t C = shape[a];
      const Tensor x = sample(d, shape, 20), gamma = sample(d, {C}, 21), beta = sample(d, {C}, 22);
      const Tensor mean = sample(d, {C}, 23), var = abs(sample(d, {C}, 24)) + 0.5;
      const Tensor want = batch_norm(x, gamma, beta, mean, var, 1e-3, axis);
      std::int64_t outer = 1, inner = 1;
      for (std::size_t k = 0; k < shape.size(); ++k) {
        if (k < a) outer *= shape[k];
        if (k > a) inner *= shape[k];
      }
      Tensor got(shape, d);
      for (const Tensor& t : {x, gamma, beta, mean, var}) t.wait_to_read();
      dispatch(d, [&](auto tag) {
        using T = typename decltype(tag)::type;
        if constexpr (std::is_floating_point_v<T>) {
          auto p = [](const Tensor& t) { return static_cast<const T*>(t.raw_data()); };
          const backend::cuda::ElementwiseGrid grid = backend::cuda::grid_over(x.size(), 1);
          simt::launch(grid.blocks, grid.threads, [&] {
            kernels::batch_norm(p(x), p(gamma), p(beta), p(mean), p(var), static_cast<T*>(got.raw_data()), outer, C,
                                inner, 1e-3);
          });
        }
      });
      check_near(got, want, tolerance(d));
    }
}

// cumsum of x, laid out as b, by one of kernels/cumsum.cuh's kernels on
// simulated threads, in a tensor of the shape and dtype of `like` (the CPU's).
Tensor simulated_cumsum(detail::cumsum::Kernel k, const Tensor& x, const Tensor& like, detail::cumsum::Block b,
                        bool reverse, unsigned blocks, unsigned threads, std::int64_t chunk = 0) {
  Tensor got(like.shape(), like.dtype());
  x.wait_to_read();
  dispatch(x.dtype(), [&](auto tag) {
    using In = typename decltype(tag)::type;
    using Out = std::conditional_t<std::is_floating_point_v<In>, In, std::int64_t>;
    const auto* in = static_cast<const In*>(x.raw_data());
    auto* out = static_cast<Out*>(got.raw_data());
    if (k == detail::cumsum::Kernel::by_chunks) {
      const std::int64_t columns = b.outer * b.inner;
      std::vector<Out> totals(static_cast<std::size_t>(columns * ((b.R + chunk - 1) / chunk)));
      simt::launch(blocks, threads,
                   [&] { kernels::cumsum_chunk_totals(in, totals.data(), b.outer, b.R, b.inner, reverse, chunk); });
      simt::launch(blocks, threads, [&] { kernels::cumsum_chunk_carries(totals.data(), columns, b.R, chunk); });
      simt::launch(blocks, threads,
                   [&] { kernels::cumsum_chunks(in, totals.data(), out, b.outer, b.R, b.inner, reverse, chunk); });
      return;
    }
    simt::launch(blocks, threads, [&] {
      if (k == detail::cumsum::Kernel::by_block) kernels::cumsum_by_block(in, out, b.outer, b.R, b.inner, reverse);
      else kernels::cumsum_by_thread(in, out, b.outer, b.R, b.inner, reverse);
    });
  });
  return got;
}

TEST_CASE("cuda kernels: cumsum by thread on simulated threads is the CPU's, bit for bit, in every dtype and direction") {
  for (DType d : all_dtypes)
    for (const auto& [shape, axis] : std::vector<std::pair<Shape, std::optional<std::int64_t>>>{
             {{3, 4, 5}, 1}, {{6, 7}, -1}, {{5, 2}, 0}, {{2, 3, 4}, std::nullopt}})
      for (bool reverse : {false, true}) {
        CAPTURE(name(d));
        CAPTURE(to_string(shape));
        CAPTURE(reverse);
        const Tensor x = sample(d, shape, 30);
        const Tensor want = cumsum(x, axis, reverse);
        const auto b = detail::cumsum::block(shape, axis);
        const backend::cuda::ElementwiseGrid grid = backend::cuda::grid_over(b.outer * b.inner, 1);
        const Tensor got =
            simulated_cumsum(detail::cumsum::Kernel::by_thread, x, want, b, reverse, grid.blocks, grid.threads);
        CHECK(got.to_vector<double>() == want.to_vector<double>());
      }
}

static_assert(kernels::scan_block_threads == detail::cumsum::block_threads);

// Rows of many tiles, a last tile part-full, fewer blocks than columns (the
// grid's stride), columns strided by inner, and blocks smaller than the
// GPU's: the tree scans any block.
TEST_CASE("cuda kernels: cumsum by block on simulated threads is the CPU's (integers exactly, floats to rounding)") {
  for (DType d : all_dtypes)
    for (const auto& [shape, axis] : std::vector<std::pair<Shape, std::optional<std::int64_t>>>{
             {{3, 1000}, 1}, {{1500}, std::nullopt}, {{2, 600, 3}, 1}, {{700, 2}, 0}, {{12, 300}, 1}, {{4, 5}, 1}})
      for (bool reverse : {false, true})
        for (unsigned threads : {32u, 64u}) {
          CAPTURE(name(d));
          CAPTURE(to_string(shape));
          CAPTURE(reverse);
          CAPTURE(threads);
          Tensor x = sample(d, shape, 31);
          if (is_floating(d)) x = where(reshape(arange(0, static_cast<double>(x.size())), shape) == 7, full({}, NAN, d), x);
          const Tensor want = cumsum(x, axis, reverse);
          const auto b = detail::cumsum::block(shape, axis);
          const Tensor got = simulated_cumsum(detail::cumsum::Kernel::by_block, x, want, b, reverse,
                                              detail::cumsum::by_block_count(b, 1), threads);
          // Rounding errors grow with the running sum, not with the value: to scale.
          if (is_floating(d)) check_near(got, want, tolerance(d));
          else CHECK(got.to_vector<std::int64_t>() == want.to_vector<std::int64_t>());
        }
}

// Chunks that do not end on a tile, a last chunk part-full, fewer blocks
// than chunks (the grid's stride), columns strided by inner, and a NaN
// that must reach every later sum of its column and none before it.
TEST_CASE("cuda kernels: cumsum by chunks on simulated threads is the CPU's (integers exactly, floats to rounding)") {
  for (DType d : all_dtypes)
    for (const auto& [shape, axis] : std::vector<std::pair<Shape, std::optional<std::int64_t>>>{
             {{5000}, std::nullopt}, {{2, 3000}, 1}, {{1200, 3}, 0}, {{2, 700, 2}, 1}})
      for (bool reverse : {false, true})
        for (const auto& [threads, chunk] : {std::pair{32u, std::int64_t{300}}, {64u, std::int64_t{1024}}}) {
          CAPTURE(name(d));
          CAPTURE(to_string(shape));
          CAPTURE(reverse);
          CAPTURE(chunk);
          Tensor x = sample(d, shape, 32);
          if (is_floating(d)) x = where(reshape(arange(0, static_cast<double>(x.size())), shape) == 7, full({}, NAN, d), x);
          const Tensor want = cumsum(x, axis, reverse);
          const Tensor got = simulated_cumsum(detail::cumsum::Kernel::by_chunks, x, want,
                                              detail::cumsum::block(shape, axis), reverse, 5, threads, chunk);
          if (is_floating(d)) check_near(got, want, tolerance(d));
          else CHECK(got.to_vector<std::int64_t>() == want.to_vector<std::int64_t>());
        }
}

static_assert(kernels::scan_block_threads * kernels::scan_items == detail::cumsum::tile_rows);

TEST_CASE("cuda kernels: cumsum takes a block per long row or few long columns, chunks of a few very long ones, else a thread") {
  using detail::cumsum::Kernel;
  const auto kernel = [](Shape shape, std::optional<std::int64_t> axis) {
    return detail::cumsum::kernel_for(detail::cumsum::block(shape, axis), 132);
  };
  CHECK(kernel({1 << 22}, std::nullopt) == Kernel::by_chunks);
  CHECK(kernel({16 * 1024}, std::nullopt) == Kernel::by_chunks);
  CHECK(kernel({16 * 1024 - 1}, std::nullopt) == Kernel::by_block);  // under 16 tiles: one block keeps up
  CHECK(kernel({528, 1 << 16}, 1) == Kernel::by_chunks);  // 528 rows: half the 1056 block slots of 132 SMs
  CHECK(kernel({529, 1 << 16}, 1) == Kernel::by_block);
  CHECK(kernel({4096, 1024}, 1) == Kernel::by_block);
  CHECK(kernel({4096, 1024}, 0) == Kernel::by_block);    // 1024 columns: a thread each would fill no GPU
  CHECK(kernel({1 << 16, 64}, 1) == Kernel::by_thread);  // short rows
  CHECK(kernel({1024, 1 << 16}, 0) == Kernel::by_thread);  // enough columns, read side by side
  CHECK(kernel({8, 255}, 1) == Kernel::by_thread);
  // Enough chunks to fill the block slots, each of whole tiles.
  CHECK(detail::cumsum::chunk_rows(detail::cumsum::block({1 << 26}, std::nullopt), 132) == 63 * 1024);
  CHECK(detail::cumsum::chunk_rows(detail::cumsum::block({16 * 1024 + 1}, std::nullopt), 132) == 1024);
  CHECK(detail::cumsum::chunk_rows(detail::cumsum::block({4, 1 << 20}, 1), 132) == 4 * 1024);
}

TEST_CASE("cuda kernels: both cumsum programs compile for sm_90 in every dtype, with the entries their launches name") {
  REQUIRE_MESSAGE(backend::cuda::nvrtc().loaded(), "NVRTC (the CUDA toolkit) is needed: ", backend::cuda::nvrtc().problem());
  using detail::cumsum::Kernel;
  for (DType d : all_dtypes)
    for (const auto& [k, cub] : {std::pair{Kernel::by_thread, false}, {Kernel::by_block, false}, {Kernel::by_block, true}}) {
      CAPTURE(name(d));
      CAPTURE(cub);
      const std::string program = detail::cumsum::program_name(d, k, cub);
      CHECK(detail::cumsum::program_name(d, Kernel::by_chunks, cub) == detail::cumsum::program_name(d, Kernel::by_block, cub));
      const std::string ptx = backend::cuda::cuda_ptx(detail::cumsum::cuda_program(d, k, cub), program + ".cu");
      const std::vector<std::string> entries =
          k == Kernel::by_thread ? std::vector<std::string>{program}
                                 : std::vector<std::string>{detail::cumsum::entry(d, "by_block", cub),
                                                            detail::cumsum::entry(d, "chunk_totals", cub),
                                                            detail::cumsum::entry(d, "chunk_carries", cub),
                                                            detail::cumsum::entry(d, "by_chunks", cub)};
      for (const std::string& e : entries) CHECK_MESSAGE(ptx.find(".entry " + e + "(") != std::string::npos, e);
      CHECK((ptx.find("shfl.sync") != std::string::npos) == cub);  // CUB's BlockScan scans its warps by shuffles
    }
}

TEST_CASE("cuda kernels: every convolution, pooling and batch_norm program compiles for sm_90, with the entries its launches name") {
  REQUIRE_MESSAGE(backend::cuda::nvrtc().loaded(), "NVRTC (the CUDA toolkit) is needed: ", backend::cuda::nvrtc().problem());
  for (DType d : {DType::float32, DType::float64}) {
    CAPTURE(name(d));
    const std::string conv = backend::cuda::cuda_ptx(detail::nn::cuda_conv_program(d), "conv.cu");
    for (detail::nn::ConvKernel k :
         {detail::nn::ConvKernel::im2col, detail::nn::ConvKernel::conv_output, detail::nn::ConvKernel::filters_major,
          detail::nn::ConvKernel::col2im, detail::nn::ConvKernel::fill_zero})
      CHECK(conv.find(".entry " + detail::nn::conv_entry(k, d) + "(") != std::string::npos);
    const std::string pool = backend::cuda::cuda_ptx(detail::nn::cuda_pool_program(d), "pool.cu");
    for (bool max : {false, true})
      for (bool backward : {false, true})
        CHECK(pool.find(".entry " + detail::nn::pool_entry(max, backward, d) + "(") != std::string::npos);
    CHECK(pool.find(".entry " + detail::nn::disjoint_max_pool_backward_entry(d) + "(") != std::string::npos);
    const std::string bn = backend::cuda::cuda_ptx(detail::nn::cuda_batch_norm_program(d), "batch_norm.cu");
    CHECK(bn.find(".entry " + detail::nn::batch_norm_entry(d) + "(") != std::string::npos);
  }
}

namespace {

// src copied into dst by the GPU's copy kernel on simulated threads, through
// the layout backend/cuda/layout.hpp makes of their views.
void simulated_copy(const Tensor& src, const Tensor& dst) {
  src.wait_to_read();
  dst.wait_to_write();
  const backend::cuda::LayoutCopy copy(src, dst, 0, "test", 1);
  dispatch(src.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    simt::launch(copy.grid.blocks, copy.grid.threads, [&] {
      kernels::copy_between_layouts(static_cast<const T*>(src.raw_data()), static_cast<T*>(dst.raw_data()),
                                    std::bit_cast<kernels::copy_layout>(copy.layout), copy.count);
    });
  });
}

}  // namespace

TEST_CASE("cuda kernels: a copy between any two views, run on simulated threads, writes what assign writes") {
  const Tensor x = sample(DType::float32, {4, 5, 6}, 30);
  const Tensor i = sample(DType::int64, {4, 5, 6}, 31);
  // (source view, destination view of a fresh buffer of shape `into`)
  struct Case {
    const char* what;
    Tensor src;
    Shape into;
    std::function<Tensor(const Tensor&)> dst;
  };
  const std::vector<Case> cases = {
      {"gather a transpose", transpose(x, {2, 0, 1}), {6, 4, 5}, [](const Tensor& t) { return t; }},
      {"a reversed slice into a slice", slice(x, 1, std::nullopt, std::nullopt, -2), {4, 9, 6},
       [](const Tensor& t) { return slice(t, 1, 2, 8, 2); }},
      {"a broadcast row into a transpose", broadcast_to(slice(x, 0, 0, 1), {3, 5, 6}), {6, 5, 3},
       [](const Tensor& t) { return transpose(t); }},
      {"a part of a concat along the last axis", i, {4, 5, 10}, [](const Tensor& t) { return slice(t, 2, 3, 9); }},
      {"a 0-d tensor", sum(x), {}, [](const Tensor& t) { return t; }},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    const Tensor want = zeros(c.into, c.src.dtype()), got = zeros(c.into, c.src.dtype());
    c.dst(want).assign(c.src);
    simulated_copy(c.src, c.dst(got));
    check_close(got, want);
  }
}

TEST_CASE("cuda kernels: a copy's layout merges the axes both sides walk alike, and refuses more than it takes") {
  const Tensor x = zeros({2, 3, 4, 5});
  CHECK(backend::cuda::copy_layout(x.shape(), x.strides(), x.strides(), "copy").axes == 1);  // contiguous: one run
  const Tensor t = transpose(x, {0, 1, 3, 2});
  CHECK(backend::cuda::copy_layout(t.shape(), t.strides(), contiguous_strides(t.shape()), "copy").axes == 3);
  const Tensor seven = transpose(zeros({2, 2, 2, 2, 2, 2, 2}), {6, 5, 4, 3, 2, 1, 0});
  CHECK_THROWS_WITH_AS(
      backend::cuda::copy_layout(seven.shape(), seven.strides(), contiguous_strides(seven.shape()), "copy"),
      doctest::Contains("copy: a copy of shape (2, 2, 2, 2, 2, 2, 2)"), ShapeError);
}

TEST_CASE("cuda kernels: the copy program compiles for sm_90, with an entry for each element width") {
  REQUIRE_MESSAGE(backend::cuda::nvrtc().loaded(), "NVRTC (the CUDA toolkit) is needed: ", backend::cuda::nvrtc().problem());
  const std::string ptx = backend::cuda::cuda_ptx(backend::cuda::cuda_copy_program(), "copy.cu");
  for (std::size_t width : {1, 4, 8})
    CHECK(ptx.find(".entry " + backend::cuda::copy_entry(width) + "(") != std::string::npos);
}

TEST_CASE("cuda kernels: random fills on simulated threads draw what the CPU draws, from the same counter blocks") {
  for (DType d : {DType::float32, DType::float64})
    for (bool normal : {false, true}) {
      CAPTURE(name(d));
      CAPTURE(normal);
      Generator cpu_draws(11), gpu_draws(11);
      cpu_draws.advance(5);  // a generator part way through its stream
      gpu_draws.advance(5);
      const Shape shape{7, 13};  // an odd count: the last pair's second value is dropped
      const Tensor want = normal ? random_normal(shape, 0.5, 2, d, cpu(), cpu_draws)
                                 : random_uniform(shape, -1, 3, d, cpu(), cpu_draws);
      Tensor got(shape, d);
      const std::uint64_t first = gpu_draws.advance(Generator::blocks_for(got.size()));
      const kernels::draw_params p{first, gpu_draws.key()[0], gpu_draws.key()[1], normal ? 0.5 : -1.0, normal ? 2.0 : 3.0};
      const backend::cuda::ElementwiseGrid grid = backend::cuda::grid_over(Generator::blocks_for(got.size()), 1);
      dispatch(d, [&](auto tag) {
        using T = typename decltype(tag)::type;
        if constexpr (std::is_floating_point_v<T>) {
          simt::launch(grid.blocks, grid.threads, [&] {
            if (normal) kernels::random_fill<T, true>(static_cast<T*>(got.raw_data()), got.size(), p);
            else kernels::random_fill<T, false>(static_cast<T*>(got.raw_data()), got.size(), p);
          });
        }
      });
      CHECK(got.to_vector<double>() == want.to_vector<double>());  // the same code: the same bits
      CHECK(cpu_draws.advance(0) == gpu_draws.advance(0));
    }
}

TEST_CASE("cuda kernels: dropout on simulated threads keeps and scales what the CPU's dropout does") {
  autograd::train_mode training;
  for (DType d : {DType::float32, DType::float64}) {
    CAPTURE(name(d));
    const Tensor x = sample(d, {5, 7}, 40);  // odd count
    Generator gen(21);
    gen.advance(3);
    const kernels::draw_params p{gen.advance(0), gen.key()[0], gen.key()[1], 0, 0};
    Tensor want;
    {
      generator_scope scope(gen);
      want = dropout(x, 0.3);
    }
    for (bool from_plan : {false, true}) {
      CAPTURE(from_plan);
      Tensor got(x.shape(), d);
      x.wait_to_read();
      const backend::cuda::ElementwiseGrid grid = backend::cuda::grid_over(Generator::blocks_for(x.size()), 1);
      dispatch(d, [&](auto tag) {
        using T = typename decltype(tag)::type;
        if constexpr (std::is_floating_point_v<T>) {
          simt::launch(grid.blocks, grid.threads, [&] {
            kernels::dropout(static_cast<const T*>(x.raw_data()), static_cast<T*>(got.raw_data()), x.size(),
                             from_plan ? kernels::draw_params{} : p, from_plan ? &p : nullptr, 0.3);
          });
        }
      });
      CHECK(got.to_vector<double>() == want.to_vector<double>());
    }
  }
}

TEST_CASE("cuda kernels: the random program compiles for sm_90, with an entry per draw and dtype, and dropout's") {
  REQUIRE_MESSAGE(backend::cuda::nvrtc().loaded(), "NVRTC (the CUDA toolkit) is needed: ", backend::cuda::nvrtc().problem());
  const std::string ptx = backend::cuda::cuda_ptx(backend::cuda::cuda_random_program(), "random.cu");
  for (DType d : {DType::float32, DType::float64})
    for (bool normal : {false, true}) {
      const std::size_t entry = ptx.find(".entry " + backend::cuda::random_entry(normal, d) + "(");
      REQUIRE(entry != std::string::npos);
      // A uniform is low + (high - low) u rounded one operation at a time, as
      // on the CPU: no fused multiply-add (the normals' log, cos and sin have theirs).
      if (!normal) CHECK(ptx.substr(entry, ptx.find(".entry", entry + 1) - entry).find("fma.rn.f64") == std::string::npos);
    }
  for (DType d : {DType::float32, DType::float64})
    CHECK(ptx.find(".entry " + backend::cuda::dropout_entry(d) + "(") != std::string::npos);
}

// embedding's gather and scatter-add on simulated threads (a grid smaller
// than the elements: the grid's stride), against the CPU op: rows picked
// twice add both rows of dy; a bad index (not whole, negative, past the
// last row) leaves a zero row, adds nowhere, and is the one report.
TEST_CASE("cuda kernels: embedding's gather and scatter-add on simulated threads are the CPU's; a bad index is reported") {
  const Tensor table = reshape(arange(0, 15, 1, DType::float64) * 0.5, {5, 3});
  const Tensor dy = reshape(arange(0, 18, 1, DType::float64), {6, 3});
  table.wait_to_read();
  dy.wait_to_read();
  for (DType d : {DType::int64, DType::int32, DType::uint8, DType::float32}) {
    CAPTURE(name(d));
    const Tensor indices = array<std::int64_t>({4, 0, 2, 4, 1, 3}).astype(d);
    const Tensor want = embedding(indices, table), want_grad = embedding_backward(indices, dy, 5);
    Tensor y({6, 3}, DType::float64), grad = zeros({5, 3}, DType::float64);
    kernels::bad_input_report report{};
    indices.wait_to_read();
    grad.wait_to_read();  // its zeros are an engine op: written before the simulated threads add into it
    dispatch(d, [&](auto tag) {
      using I = typename decltype(tag)::type;
      const auto* idx = static_cast<const I*>(indices.raw_data());
      simt::launch(2, 4, [&] {
        kernels::embedding_gather(idx, static_cast<const double*>(table.raw_data()), static_cast<double*>(y.raw_data()),
                                  6, 5, 3, &report, 7);
      });
      simt::launch(2, 4, [&] {
        kernels::embedding_scatter_add(idx, static_cast<const double*>(dy.raw_data()),
                                       static_cast<double*>(grad.raw_data()), 6, 5, 3, &report, 7);
      });
    });
    CHECK(y.to_vector<double>() == want.to_vector<double>());
    CHECK(grad.to_vector<double>() == want_grad.to_vector<double>());
    CHECK(report.op == 0u);
  }
  for (const float bad : {5.0f, -1.0f, 2.5f}) {
    CAPTURE(bad);
    const std::vector<float> indices{1, bad, 2};
    std::vector<double> y(9, -1), grad(15, 0);
    kernels::bad_input_report report{};
    simt::launch(1, 4, [&] {
      kernels::embedding_gather(indices.data(), static_cast<const double*>(table.raw_data()), y.data(), 3, 5, 3, &report,
                                7);
    });
    CHECK(report.op == 7u);
    CHECK(report.value == bad);
    CHECK(report.position == 1);
    CHECK(report.bound == 5);
    CHECK(std::vector<double>(y.begin() + 3, y.begin() + 6) == std::vector<double>(3, 0.0));
    CHECK(y[0] == 1.5);
    report = {};
    simt::launch(1, 4, [&] {
      kernels::embedding_scatter_add(indices.data(), static_cast<const double*>(dy.raw_data()), grad.data(), 3, 5, 3,
                                     &report, 9);
    });
    CHECK(report.op == 9u);
    CHECK(std::accumulate(grad.begin(), grad.end(), 0.0) == (0 + 1 + 2) + (6 + 7 + 8));
  }
}

TEST_CASE("cuda kernels: embedding's program compiles for sm_90 for every index dtype and float table, with both entries") {
  REQUIRE_MESSAGE(backend::cuda::nvrtc().loaded(), "NVRTC (the CUDA toolkit) is needed: ", backend::cuda::nvrtc().problem());
  for (DType index : all_dtypes)
    for (DType table : {DType::float32, DType::float64}) {
      CAPTURE(name(index));
      CAPTURE(name(table));
      const std::string program = detail::embedding::program_name(index, table);
      const std::string ptx = backend::cuda::cuda_ptx(detail::embedding::cuda_program(index, table), program + ".cu");
      for (const char* kernel : {"gather", "scatter_add"})
        CHECK(ptx.find(".entry " + detail::embedding::entry(index, table, kernel) + "(") != std::string::npos);
      CHECK(ptx.find("atom.global.add") != std::string::npos);
    }
  // A 16-bit table is gathered as it is, by the gather alone (its gradient is summed in float32).
  for (DType table : {DType::float16, DType::bfloat16}) {
    CAPTURE(name(table));
    const std::string program = detail::embedding::program_name(DType::int64, table);
    const std::string ptx = backend::cuda::cuda_ptx(detail::embedding::cuda_program(DType::int64, table), program + ".cu");
    CHECK(ptx.find(".entry " + detail::embedding::entry(DType::int64, table, "gather") + "(") != std::string::npos);
    CHECK(ptx.find("scatter_add") == std::string::npos);
  }
}
