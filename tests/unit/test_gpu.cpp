// On a real GPU: what cuda(0) computes against what the CPU computes, for
// every elementwise op of the table in every dtype it keeps, a long fused
// expression, broadcast operands and views, products through cuBLAS(Lt),
// reductions, argmax and softmax (eager and in a replayed plan),
// convolutions, pooling and their gradients and batch_norm (eager, and in a
// captured residual block, decomposed into a convolution's epilogue), the chapter's
// MLP (eager and hybridized, replayed as a CUDA graph) and LeNet (trained on
// cuda(0)), a captured
// elementwise graph, copies between the host and GPUs, and the caching
// allocator.
// Run by ctest's `gpu_ops` (label `gpu`: hybra_gpu_tests --no-skip -ts=gpu);
// with no GPU it prints "no GPU:" and the reason, which ctest reports as a
// skip (scripts/gpu.sh fails on a skip).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <hybra/hybra.hpp>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "training.hpp"

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

// The net `build` makes, on device d, hybridized or not; its weights are
// drawn at its first call, on the host, from seed `draws`, whatever the device.
template <class Build>
nn::HybridSequential net_on(Build build, Device d, bool hybridized, std::uint64_t draws) {
  nn::HybridSequential net;
  build(net);
  net.initialize(nn::init::Xavier(), d);
  if (hybridized) net.hybridize();
  seed(draws);
  return net;
}

// Trains the net `build` makes for `steps` SGD steps on (X, y), on the CPU,
// then on cuda(0) eager and hybridized, and checks that the GPU's weights
// end within 1e-4 of the CPU's.
template <class Build>
void check_trains_like_cpu(Build build, const Tensor& X, const Tensor& y, int steps, std::uint64_t draws) {
  auto train = [&](Device d, bool hybridized) {
    nn::HybridSequential net = net_on(build, d, hybridized, draws);
    test::train_steps(net, X.to(d), y.to(d), steps);
    std::vector<std::vector<float>> weights;
    for (const auto& p : net.collect_params()) weights.push_back(p.data().to_vector<float>());
    return weights;
  };
  const auto want = train(cpu(), false);
  for (bool hybridized : {false, true}) {
    CAPTURE(hybridized);
    const auto got = train(cuda(0), hybridized);
    REQUIRE(got.size() == want.size());
    int wrong = 0;
    for (std::size_t k = 0; k < got.size(); ++k) {
      int wrong_here = 0;
      double worst = 0;
      for (std::size_t i = 0; i < got[k].size(); ++i) {
        const double d = std::abs(got[k][i] - want[k][i]);
        wrong_here += !(d <= 1e-4);
        worst = std::max(worst, d);
      }
      if (wrong_here) MESSAGE("parameter ", k, ": ", wrong_here, " of ", got[k].size(), " differ, by up to ", worst);
      wrong += wrong_here;
    }
    CHECK(wrong == 0);
  }
}

// One training step of the net `build` makes, on cuda(0) and on the CPU:
// the output, the loss, then each parameter's value and gradient, in the
// order the step makes them, each within `tolerance` of the largest CPU
// value of its kind. The first that differs is where a wrong training run
// goes wrong.
template <class Build>
void check_step_like_cpu(Build build, const Tensor& X, const Tensor& y, std::uint64_t draws, double tolerance) {
  auto step = [&](Device d, bool hybridized) {
    nn::HybridSequential net = net_on(build, d, hybridized, draws);
    const nn::SoftmaxCrossEntropyLoss loss_fn;
    Tensor out, loss;
    {
      autograd::record rec;
      out = net(X.to(d));
      loss = loss_fn(out, y.to(d));
    }
    loss.backward();
    std::vector<std::pair<std::string, std::vector<double>>> values{{"output", out.to_vector<double>()},
                                                                     {"loss", loss.to_vector<double>()}};
    for (const auto& p : net.collect_params()) values.emplace_back(p.name(), p.data().to_vector<double>());
    for (const auto& p : net.collect_params()) values.emplace_back("gradient of " + p.name(), p.grad().to_vector<double>());
    return values;
  };
  const auto want = step(cpu(), false);
  for (bool hybridized : {false, true}) {
    CAPTURE(hybridized);
    const auto got = step(cuda(0), hybridized);
    REQUIRE(got.size() == want.size());
    for (std::size_t k = 0; k < got.size(); ++k) {
      CAPTURE(want[k].first);
      const auto &g = got[k].second, &c = want[k].second;
      REQUIRE(g.size() == c.size());
      double scale = 0, worst = 0;
      std::size_t at = 0;
      for (double v : c) scale = std::max(scale, std::abs(v));
      for (std::size_t i = 0; i < g.size(); ++i)
        if (!(std::abs(g[i] - c[i]) <= worst)) worst = std::abs(g[i] - c[i]), at = i;
      if (!(worst <= tolerance * std::max(scale, 1e-30)))
        MESSAGE(want[k].first, ": differs by up to ", worst, " (at ", at, ": ", g[at], " against ", c[at],
                "), its largest value is ", scale);
      CHECK(worst <= tolerance * std::max(scale, 1e-30));
    }
  }
}

// LeNet-5 as train_lenet builds it, and a batch for it: 32 images of noise and random labels.
void lenet(nn::HybridSequential& net) {
  net.add(nn::Conv2D(6, 5, 1, 2, 1, 1, "relu"), nn::MaxPool2D(2), nn::Conv2D(16, 5, 1, 0, 1, 1, "relu"),
          nn::MaxPool2D(2), nn::Flatten(), nn::Dense(120, "relu"), nn::Dense(84, "relu"), nn::Dense(10));
}
std::pair<Tensor, Tensor> lenet_batch() {
  seed(4);
  Tensor X = random_normal({32, 1, 28, 28}, 0, 1);
  return {X, random_uniform({32}, 0, 10).astype(DType::int32).astype(DType::float32)};
}

template <class Op>
void check_op_on_gpu(DType dtype, int& checked) {
  const Tensor a = operand(dtype, 1), b = operand(dtype, 2), c = operand(dtype, 3);
  // The op on copies of a, b and c on device d (a condition first for where).
  auto expression = [](const Tensor& x, const Tensor& y, const Tensor& z) {
    if constexpr (Op::arity == 1) return apply_op<Op>(x);
    else if constexpr (Op::arity == 2) return apply_op<Op>(x, y);
    else return apply_op<Op>(z - 2, x, y);
  };
  auto compute = [&](Device d) {
    const Tensor x = a.to(d), y = b.to(d), z = c.to(d);
    return Tensor(expression(x, y, z));
  };
  const bool same_dtype = dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return std::is_same_v<kernel::result_t<decltype(expression(a, b, c)), T>, T>;
  });
  if (!same_dtype) return;
  CAPTURE(Op::name);
  CAPTURE(name(dtype));
  const std::vector<double> want = compute(cpu()).template to_vector<double>();
  const std::vector<double> got = compute(cuda(0)).template to_vector<double>();
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

  TEST_CASE("gpu: products through cuBLAS(Lt) and the chapter's MLP, eager and hybridized, against the CPU") {
    if (!gpu_present()) return;
    auto close = [](const Tensor& on_gpu, const Tensor& on_cpu, double tolerance) {
      const auto g = on_gpu.to_vector<double>(), c = on_cpu.to_vector<double>();
      REQUIRE(g.size() == c.size());
      double worst = 0;
      for (std::size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::abs(g[i] - c[i]));
      CHECK(worst <= tolerance);
    };
    seed(9);
    Tensor a = random_uniform({3, 64, 96}, -1, 1), b = random_uniform({96, 80}, -1, 1);
    close(matmul(a.to(cuda(0)), b.to(cuda(0))), matmul(a, b), 1e-4);
    close(matmul(transpose(b.to(cuda(0))), transpose(a.to(cuda(0)), {0, 2, 1})),
          matmul(transpose(b), transpose(a, {0, 2, 1})), 1e-4);
    Tensor x = random_uniform({32, 96}, -1, 1), w = random_uniform({80, 96}, -1, 1), bias = random_uniform({80}, -1, 1);
    close(fully_connected(x.to(cuda(0)), w.to(cuda(0)), bias.to(cuda(0))), fully_connected(x, w, bias), 1e-4);

    auto mlp = [] {
      nn::HybridSequential net;
      net.add(nn::Dense(256, "relu"), nn::Dense(128, "relu"), nn::Dense(2));
      return net;
    };
    nn::HybridSequential on_cpu = mlp(), on_gpu = mlp();
    on_cpu.initialize(nn::init::Uniform(), cpu());
    on_gpu.initialize(nn::init::Uniform(), cuda(0));
    Tensor input = random_normal({4, 512}, 0, 1);
    seed(21);  // the weights are drawn at the first call, on the host, for either device
    Tensor want = on_cpu(input);
    seed(21);
    const Tensor gpu_input = input.to(cuda(0));
    close(on_gpu(gpu_input), want, 1e-4);
    // Hybridized: cuBLASLt's bias + ReLU epilogues, then CUDA graph replays,
    // also after the input changes (copied into the plan's buffer).
    on_gpu.hybridize();
    for (int call = 0; call < 3; ++call) close(on_gpu(gpu_input), want, 1e-4);
    CHECK(on_gpu.plan().graphs_recorded() == 1);
    Tensor other = random_normal({4, 512}, 0, 1);
    close(on_gpu(other.to(cuda(0))), on_cpu(other), 1e-4);
    close(on_gpu(gpu_input), want, 1e-4);
    CHECK(on_gpu.plan().graphs_recorded() == 2);
  }

  TEST_CASE("gpu: an eager expression's scalars are the call's, not those of the expression type's first call") {
    if (!gpu_present()) return;
    seed(12);
    const Tensor a = random_uniform({1000}, -1, 1), ga = a.to(cuda(0));
    auto update = [](const Tensor& x, float rate, double decay) { return x * rate - decay * x + 1; };
    for (const auto& [rate, decay] : std::vector<std::pair<float, double>>{{0.5f, 0.1}, {2.0f, -3.0}, {-1.0f, 0.0}}) {
      CAPTURE(rate);
      const auto got = Tensor(update(ga, rate, decay)).to_vector<float>(), want = Tensor(update(a, rate, decay)).to_vector<float>();
      int wrong = 0;
      for (std::size_t i = 0; i < want.size(); ++i) wrong += !(std::abs(got[i] - want[i]) <= 1e-6f * (1 + std::abs(want[i])));
      CHECK(wrong == 0);
    }
  }

  TEST_CASE("gpu: broadcast operands, views and a hybridized elementwise graph against the CPU") {
    if (!gpu_present()) return;
    seed(4);
    Tensor a = random_uniform({5, 7}, -1, 1), b = random_uniform({7}, -1, 1), c = random_uniform({7, 5}, -1, 1);
    Tensor ga = a.to(cuda(0)), gb = b.to(cuda(0)), gc = c.to(cuda(0));
    auto close = [](const Tensor& on_gpu, const Tensor& on_cpu) {
      const auto x = on_gpu.to_vector<float>(), y = on_cpu.to_vector<float>();
      REQUIRE(x.size() == y.size());
      for (std::size_t i = 0; i < x.size(); ++i) CHECK(x[i] == doctest::Approx(y[i]).epsilon(1e-5));
    };
    close(relu(ga * gb + transpose(gc)) - 0.5f, relu(a * b + transpose(c)) - 0.5f);
    CHECK(transpose(gc).contiguous().to_vector<float>() == transpose(c).contiguous().to_vector<float>());
    auto A = sym::var("a", Shape{5, 7}), B = sym::var("b", Shape{7});
    const auto g = graph::optimize(graph::trace({tanh(A * B + 1), exp(A) - B}));
    jit::Plan on_gpu(g, cuda(0), false, "gpu plan"), on_cpu(g, cpu(), false, "cpu plan");
    const auto want = on_cpu({a, b});
    for (int call = 0; call < 3; ++call) {
      const auto outputs = on_gpu({ga, gb});
      for (std::size_t k = 0; k < outputs.size(); ++k) close(outputs[k], want[k]);
    }
    CHECK(on_gpu.graphs_recorded() == 1);
  }

  TEST_CASE("gpu: views written, concat, slice's gradient, dot and random draws on cuda(0) against the CPU") {
    if (!gpu_present()) return;
    seed(6);
    const Tensor a = random_uniform({4, 3, 5}, -1, 1), b = random_uniform({4, 2, 5}, -1, 1, DType::float32);
    const Tensor ga = a.to(cuda(0)), gb = b.to(cuda(0));
    auto same = [](const Tensor& on_gpu, const Tensor& on_cpu) {
      CHECK(on_gpu.shape() == on_cpu.shape());
      CHECK(on_gpu.to_vector<double>() == on_cpu.to_vector<double>());
    };
    same(concat({ga, gb}, 1), concat({a, b}, 1));
    same(concat({transpose(ga), transpose(gb)}, 1), concat({transpose(a), transpose(b)}, 1));  // (5,3,4) and (5,2,4)
    Tensor into = zeros({5, 3, 4}), g_into = zeros({5, 3, 4}, DType::float32, cuda(0));
    slice(transpose(into), 0, 1, std::nullopt, 2).assign(slice(a, 0, 1, std::nullopt, 2) * 2);
    slice(transpose(g_into), 0, 1, std::nullopt, 2).assign(slice(ga, 0, 1, std::nullopt, 2) * 2);
    same(g_into, into);
    same(slice_backward(ga, {4, 7, 5}, 1, 1, 7, 2), slice_backward(a, {4, 7, 5}, 1, 1, 7, 2));
    const Tensor w = random_uniform({5, 6}, -1, 1);
    const auto d = dot(ga, w.to(cuda(0))).to_vector<float>(), want = dot(a, w).to_vector<float>();
    for (std::size_t i = 0; i < want.size(); ++i) CHECK(d[i] == doctest::Approx(want[i]).epsilon(1e-5));
    // The same counter blocks give the same uniforms, and normals within a few units in the last place.
    for (DType t : {DType::float32, DType::float64}) {
      seed(9);
      const Tensor u = random_uniform({1001}, -2, 3, t, cuda(0)), n = random_normal({1001}, 1, 2, t, cuda(0));
      seed(9);
      same(u, random_uniform({1001}, -2, 3, t));
      const auto gn = n.to_vector<double>(), cn = random_normal({1001}, 1, 2, t).to_vector<double>();
      for (std::size_t i = 0; i < cn.size(); ++i) CHECK(gn[i] == doctest::Approx(cn[i]).epsilon(t == DType::float32 ? 1e-6 : 1e-14));
    }
    // Dropout keeps the same elements, eager and as a replayed plan's step.
    autograd::train_mode training;
    seed(10);
    const Tensor on_gpu = dropout(ga, 0.4);
    seed(10);
    same(on_gpu, dropout(a, 0.4));
    auto v = sym::var("v", Shape{4, 3, 5});
    const auto g = graph::optimize(graph::trace({dropout(v, 0.4) + 1}));
    jit::Plan gpu_plan(g, cuda(0), true, "gpu dropout"), cpu_plan(g, cpu(), true, "cpu dropout");
    for (int call = 0; call < 3; ++call) {
      seed(11 + call);
      const Tensor got = gpu_plan({ga})[0];
      seed(11 + call);
      same(got, cpu_plan({a})[0]);
    }
    CHECK(gpu_plan.graphs_recorded() == 1);
  }

  // Rows picked many times add by atomics: to rounding. A bad index the
  // kernel finds is the next wait's IndexError, and the GPU works on.
  TEST_CASE("gpu: embedding and its gradient on cuda(0) against the CPU; a bad index is raised at the next wait") {
    if (!gpu_present()) return;
    seed(12);
    const Tensor table = random_uniform({50, 24}, -1, 1), dy = random_uniform({8, 40, 24}, -1, 1);
    for (DType d : {DType::int64, DType::int32, DType::float32}) {
      CAPTURE(name(d));
      const Tensor ids = random_uniform({8, 40}, 0, 50).astype(DType::int64).astype(d);
      const Tensor g_ids = ids.to(cuda(0));
      CHECK(Tensor(embedding(g_ids, table.to(cuda(0)))).to_vector<float>() == Tensor(embedding(ids, table)).to_vector<float>());
      const auto got = embedding_backward(g_ids, dy.to(cuda(0)), 50).to_vector<float>();
      const auto want = embedding_backward(ids, dy, 50).to_vector<float>();
      for (std::size_t i = 0; i < want.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5));
    }
    const Tensor bad = array<std::int64_t>({3, 50, 1}).to(cuda(0));
    CHECK_THROWS_WITH_AS(Tensor(embedding(bad, table.to(cuda(0)))).wait_to_read(),
                         doctest::Contains("embedding: index 50 (element 1 of the indices, flattened) is not one of the 50 rows"),
                         IndexError);
    CHECK(Tensor(embedding(array<std::int64_t>({49}).to(cuda(0)), table.to(cuda(0)))).to_vector<float>() ==
          Tensor(slice(table, 0, 49, 50)).to_vector<float>());
  }

  TEST_CASE("gpu: reductions, argmax, cumsum, softmax and log_softmax of every dtype on cuda(0) against the CPU") {
    if (!gpu_present()) return;
    auto same = [](const Tensor& on_gpu, const Tensor& on_cpu) {
      REQUIRE(on_gpu.dtype() == on_cpu.dtype());
      REQUIRE(on_gpu.shape() == on_cpu.shape());
      const auto g = on_gpu.to_vector<double>(), c = on_cpu.to_vector<double>();
      int wrong = 0;
      for (std::size_t i = 0; i < g.size(); ++i) {
        const double tolerance = on_cpu.dtype() == DType::float32 ? 2e-6 * std::max(1.0, std::abs(c[i]))
                                 : is_floating(on_cpu.dtype())    ? 1e-12 * std::max(1.0, std::abs(c[i]))
                                                                  : 0.0;
        wrong += std::isnan(c[i]) ? !std::isnan(g[i]) : !(std::abs(g[i] - c[i]) <= tolerance);
      }
      CHECK(wrong == 0);
    };
    // Rows of 10, 77 and 1000 leave a block's last warp part-full, or fill
    // it: both block combines (the tree, CUB's warp shuffles) must agree.
    const std::vector<std::pair<Shape, std::vector<std::int64_t>>> cases = {
        {{1 << 22}, {0}}, {{256, 10}, {1}}, {{256, 10}, {0}}, {{64, 6, 24, 24}, {0, 2, 3}}, {{5000, 3}, {0}},
        {{300, 77}, {1}}, {{7, 1000}, {1}}};
    for (bool cub : {false, true}) {
      const backend::cuda::CubBlockCombineScope combine(cub);
      CAPTURE(cub);
      for (DType d : {DType::float32, DType::float64, DType::int32, DType::int64, DType::uint8})
        for (const auto& [shape, axes] : cases) {
          CAPTURE(name(d));
          CAPTURE(to_string(shape));
          seed(11);
          const Tensor values = (is_floating(d) ? random_normal(shape, 0, 3, DType::float64)
                                                : random_uniform(shape, 0, 200, DType::float64))
                                    .astype(d);
          const Tensor on_gpu = values.to(cuda(0));
          same(sum(on_gpu, Axes(axes)), sum(values, Axes(axes)));
          same(mean(on_gpu, Axes(axes)), mean(values, Axes(axes)));
          same(max(on_gpu, Axes(axes)), max(values, Axes(axes)));
          same(min(on_gpu, Axes(axes), true), min(values, Axes(axes), true));
          same(argmax(on_gpu, axes.front()), argmax(values, axes.front()));
          same(argmax(on_gpu), argmax(values));
          // Whole numbers add exactly in any order, so a block's scan must
          // give the CPU's sums bit for bit, as the thread per column does.
          const Tensor whole = is_floating(d) ? values.astype(DType::int32).astype(d) : values;
          same(cumsum(whole.to(cuda(0)), axes.front()), cumsum(whole, axes.front()));
          same(cumsum(whole.to(cuda(0)), axes.back(), true), cumsum(whole, axes.back(), true));
          if (is_floating(d)) {
            same(softmax(on_gpu, axes.front()), softmax(values, axes.front()));
            same(log_softmax(on_gpu * 100, axes.back()), log_softmax(values * 100, axes.back()));
          }
        }
    }
  }

  TEST_CASE("gpu: a captured graph's reductions, argmax and softmax (of views too), replayed as a CUDA graph, against the CPU") {
    if (!gpu_present()) return;
    seed(12);
    const Tensor x = random_normal({256, 10}, 0, 3), big = random_normal({1 << 20}, 0, 1);
    const Tensor label = argmax(x * -1, 1);
    auto X = sym::var("x", Shape{256, 10}), B = sym::var("b", Shape{1 << 20}), L = sym::var("l", Shape{256}, DType::int64);
    const auto logits = X * 2 + 1;
    const auto g = graph::optimize(graph::trace(
        {softmax(logits), log_softmax(logits, 0), argmax(logits, 1), sum(X, 0), mean(exp(X) * 0.5f), max(B), sum(B),
         softmax(slice(X, 1, 0, 10, 3)), sum(transpose(X), 1),  // views, gathered before their launches
         cumsum(X, 1), cumsum(transpose(X), 1, true) * 2,
         flatten(transpose(X)) * 2,  // a reshape of a view: a copy launch
         sum((argmax(X, 1) == L) * 3 + 1) + sum(argmax(X, 0) != 4),  // integer chains: int64 kernels
         where(sum(X, 1) > 1, L, L * 2) / 3}));  // mixed dtypes: the conversions launches, then a float32 kernel
    jit::Plan on_gpu(g, cuda(0), false, "gpu classifier"), on_cpu(g, cpu(), false, "cpu classifier");
    REQUIRE(on_gpu.replays_graph());
    const auto want = on_cpu({x, big, label});
    const Tensor gx = x.to(cuda(0)), gbig = big.to(cuda(0)), glabel = label.to(cuda(0));
    for (int call = 0; call < 3; ++call) {
      const auto got = on_gpu({gx, gbig, glabel});
      REQUIRE(got.size() == want.size());
      for (std::size_t k = 0; k < got.size(); ++k) {
        CAPTURE(k);
        REQUIRE(got[k].dtype() == want[k].dtype());
        const auto a = got[k].to_vector<double>(), b = want[k].to_vector<double>();
        REQUIRE(a.size() == b.size());
        // Sums in another order differ by rounding of their largest terms
        // (a running sum near zero after large ones): to the output's scale.
        double scale = 0;
        for (double v : b) scale = std::max(scale, std::abs(v));
        for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-5).scale(scale));
      }
    }
    CHECK(on_gpu.graphs_recorded() == 1);
  }

  TEST_CASE("gpu: a residual block's batch_norm, decomposed into its convolution's epilogue, replayed as a CUDA graph, against the CPU") {
    if (!gpu_present()) return;
    seed(13);
    std::unordered_map<std::string, Tensor> values{{"x", random_normal({4, 3, 12, 12})},
                                                   {"w1", random_normal({8, 3, 3, 3})},
                                                   {"w2", random_normal({8, 3, 1, 1})}};
    auto bn = [&](const Symbol& v, const std::string& id) {
      std::vector<Symbol> p;
      for (const char* part : {"gamma", "beta", "mean", "var"}) {
        const std::string key = id + part;
        values.emplace(key, random_uniform({8}, part == std::string("var") ? 0.25 : -0.5, 1.25));
        p.push_back(sym::var(key, Shape{8}));
      }
      return batch_norm(v, p[0], p[1], p[2], p[3]);
    };
    auto X = sym::var("x", Shape{4, 3, 12, 12});
    auto W1 = sym::var("w1", Shape{8, 3, 3, 3}), W2 = sym::var("w2", Shape{8, 3, 1, 1});
    const auto g = graph::optimize(graph::trace({relu(bn(conv2d(X, W1, {}, 1, 1), "a") + bn(conv2d(X, W2), "b"))}));
    for (const auto& n : g.nodes) CHECK(n.op != "batch_norm");
    jit::Plan on_gpu(g, cuda(0), false, "gpu residual block"), on_cpu(g, cpu(), false, "cpu residual block");
    REQUIRE(on_gpu.replays_graph());
    std::vector<Tensor> in, gpu_in;
    for (int v : g.vars()) {
      in.push_back(values.at(g.nodes[static_cast<std::size_t>(v)].name));
      gpu_in.push_back(in.back().to(cuda(0)));
    }
    const auto want = on_cpu(in)[0].to_vector<double>();
    double scale = 0;
    for (double v : want) scale = std::max(scale, std::abs(v));
    for (int call = 0; call < 3; ++call) {
      const auto got = on_gpu(gpu_in)[0].to_vector<double>();
      REQUIRE(got.size() == want.size());
      for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5).scale(scale));
    }
    CHECK(on_gpu.graphs_recorded() == 1);
  }

  TEST_CASE("gpu: converting between every pair of dtypes on cuda(0) gives the CPU's values") {
    if (!gpu_present()) return;
    const DType dtypes[] = {DType::float32, DType::float64, DType::int32,   DType::int64,
                            DType::uint8,   DType::float16, DType::bfloat16};
    seed(5);
    const Tensor values = random_uniform({3, 1000}, 0, 250, DType::float64);  // every dtype holds them
    for (DType from : dtypes)
      for (DType to : dtypes) {
        CAPTURE(name(from));
        CAPTURE(name(to));
        const Tensor x = values.astype(from), on_gpu = x.to(cuda(0));
        CHECK(on_gpu.astype(to).to_vector<double>() == x.astype(to).to_vector<double>());
        CHECK(transpose(on_gpu).astype(to).to_vector<double>() == transpose(x).astype(to).to_vector<double>());
      }
  }

  TEST_CASE("gpu: float16 and bfloat16 on cuda(0): the CPU's conversions, ops and a mixed-precision step") {
    if (!gpu_present()) return;
    for (DType d : {DType::float16, DType::bfloat16}) {
      CAPTURE(name(d));
      seed(41);
      const Tensor x = random_uniform({64, 96}, -2, 2, DType::float64), w = random_uniform({32, 96}, -1, 1, d);
      const Tensor b = random_uniform({32}, -1, 1, d);
      const Tensor xh = x.astype(d), xg = xh.to(cuda(0)), wg = w.to(cuda(0)), bg = b.to(cuda(0));
      // Conversions round the same bits on both devices (one rounding from float64 too).
      CHECK(x.to(cuda(0)).astype(d).to(cpu()).to_vector<float>() == xh.to_vector<float>());
      CHECK(xg.astype(DType::int32).to_vector<int>() == xh.astype(DType::int32).to_vector<int>());
      // Ops compute in float32 on the GPU too, so they agree with the CPU to float32's rounding, then one rounding.
      const auto close = [](const Tensor& got, const Tensor& want, double tolerance) {
        REQUIRE(got.dtype() == want.dtype());
        const std::vector<double> g = got.to(cpu()).to_vector<double>(), c = want.to_vector<double>();
        REQUIRE(g.size() == c.size());
        int far = 0;
        for (std::size_t i = 0; i < g.size(); ++i) far += std::abs(g[i] - c[i]) > tolerance * (1 + std::abs(c[i]));
        CHECK(far == 0);
      };
      const double ulp = d == DType::float16 ? 1.0 / 1024 : 1.0 / 128;
      close(tanh(xg * 2 + 1), tanh(xh * 2 + 1), ulp);
      close(softmax(xg), softmax(xh), ulp);
      close(sum(xg, {1}), sum(xh, {1}), ulp);
      // Dense on tensor cores, accumulating in float32.
      close(fully_connected(xg, wg, bg), fully_connected(xh, w, b), 2 * ulp);
      // embedding gathers the table's own bits.
      const Tensor ids = array<std::int64_t>({31, 0, 7, 7});
      CHECK(embedding(ids.to(cuda(0)), wg).to_vector<float>() == embedding(ids, w).to_vector<float>());
    }
    // One mixed-precision step of a float16 MLP on cuda(0) against the same step on the CPU.
    auto step = [](Device device) {
      seed(42);
      nn::HybridSequential net;
      net.add(nn::Dense({.units = 32, .activation = "relu"}), nn::Dense({.units = 4}));
      net.initialize(nn::init::Xavier(), device);
      net(zeros({1, 16}, DType::float32, device));
      net.cast(DType::float16);
      Trainer trainer(net.collect_params(), "sgd", {{"learning_rate", 0.1}, {"multi_precision", 1}});
      optim::LossScaler scaler({.init_scale = 128});  // the default 65536 overflows this loss's gradients: skipped
      const Tensor x = random_uniform({8, 16}, -1, 1).astype(DType::float16).to(device);
      {
        autograd::record r;
        scaler.scale(sum(net(x) * net(x))).backward();
      }
      CHECK(trainer.step(8, scaler));
      return net.collect_params().begin()->data().to(cpu()).astype(DType::float32).to_vector<float>();
    };
    const std::vector<float> on_gpu = step(cuda(0)), on_cpu = step(cpu());
    REQUIRE(on_gpu.size() == on_cpu.size());
    for (std::size_t i = 0; i < on_gpu.size(); ++i) CHECK(on_gpu[i] == doctest::Approx(on_cpu[i]).epsilon(0.01).scale(0.01));
  }

  TEST_CASE("gpu: an MLP trained on cuda(0), eager and hybridized, ends with the CPU's weights") {
    if (!gpu_present()) return;
    seed(3);
    const Tensor X = random_normal({64, 20}, 0, 1), y = random_uniform({64}, 0, 10).astype(DType::int32).astype(DType::float32);
    check_trains_like_cpu([](nn::HybridSequential& net) { net.add(nn::Dense(32, "relu"), nn::Dense(10)); }, X, y, 5, 8);
  }

  TEST_CASE("gpu: conv2d, pooling, their gradients and batch_norm on cuda(0) against the CPU") {
    if (!gpu_present()) return;
    int checked = 0;
    auto same = [&](const Tensor& on_gpu, const Tensor& on_cpu, double tolerance) {
      CHECK(on_gpu.device() == cuda(0));
      REQUIRE(on_gpu.shape() == on_cpu.shape());
      const auto g = on_gpu.to_vector<double>(), c = on_cpu.to_vector<double>();
      double scale = 1;
      for (double v : c) scale = std::max(scale, std::abs(v));
      int wrong = 0;
      for (std::size_t i = 0; i < g.size(); ++i) wrong += !(std::abs(g[i] - c[i]) <= tolerance * scale);
      CHECK(wrong == 0);
      ++checked;
    };
    struct Conv {
      Shape x, w;
      bool bias;
      Size2d stride, padding, dilation;
      std::int64_t groups;
    };
    const std::vector<Conv> convs = {{{64, 1, 28, 28}, {6, 1, 5, 5}, true, 1, 2, 1, 1},
                                     {{64, 6, 14, 14}, {16, 6, 5, 5}, true, 1, 0, 1, 1},
                                     {{3, 4, 9, 8}, {6, 2, 3, 3}, false, 2, 1, 1, 2},
                                     {{2, 3, 10, 9}, {4, 3, 3, 2}, true, {1, 2}, {2, 1}, 2, 1}};
    for (DType d : {DType::float32, DType::float64}) {
      CAPTURE(name(d));
      const double tolerance = d == DType::float32 ? 1e-5 : 1e-12;
      seed(21);
      for (const Conv& c : convs) {
        CAPTURE(to_string(c.x));
        const Tensor x = random_normal(c.x, 0, 1, d), w = random_normal(c.w, 0, 1, d), b = random_normal({c.w[0]}, 0, 1, d);
        const Tensor y = conv2d(x, w, c.bias ? b : Tensor{}, c.stride, c.padding, c.dilation, c.groups);
        same(conv2d(x.to(cuda(0)), w.to(cuda(0)), c.bias ? b.to(cuda(0)) : Tensor{}, c.stride, c.padding, c.dilation,
                    c.groups),
             y, tolerance);
        const Tensor dy = random_normal(y.shape(), 0, 1, d);
        same(conv2d_backward_data(dy.to(cuda(0)), w.to(cuda(0)), c.x, c.stride, c.padding, c.dilation, c.groups),
             conv2d_backward_data(dy, w, c.x, c.stride, c.padding, c.dilation, c.groups), tolerance);
        same(conv2d_backward_weight(dy.to(cuda(0)), x.to(cuda(0)), c.w, c.stride, c.padding, c.dilation, c.groups),
             conv2d_backward_weight(dy, x, c.w, c.stride, c.padding, c.dilation, c.groups), tolerance);
      }
      // Few distinct values: windows hold their maximum more than once, and the gradient goes to the first.
      const Tensor x = random_uniform({4, 3, 13, 14}, 0, 4, DType::float64).astype(DType::int32).astype(d);
      const Tensor gx = x.to(cuda(0));
      const PoolingConvention valid = PoolingConvention::valid, full = PoolingConvention::full;
      for (const auto& [kernel, stride, padding, cv] :
           std::vector<std::tuple<Size2d, Size2d, Size2d, PoolingConvention>>{
               {2, 2, 0, valid}, {3, 2, 1, valid}, {{2, 3}, {1, 2}, {1, 1}, valid}, {2, 2, 0, full}, {3, 2, 1, full}}) {
        CAPTURE(kernel);
        CAPTURE(std::string(name(cv)));
        const Tensor m = max_pool2d(x, kernel, stride, padding, cv);
        same(max_pool2d(gx, kernel, stride, padding, cv), m, 0);
        const Tensor dm = random_normal(m.shape(), 0, 1, d);
        same(pool2d_backward(dm.to(cuda(0)), gx, true, kernel, stride, padding, true, cv),
             pool2d_backward(dm, x, true, kernel, stride, padding, true, cv), 0);
        for (bool include_pad : {true, false}) {
          same(avg_pool2d(gx, kernel, stride, padding, include_pad, cv),
               avg_pool2d(x, kernel, stride, padding, include_pad, cv), tolerance);
          same(pool2d_backward(dm.to(cuda(0)), gx, false, kernel, stride, padding, include_pad, cv),
               pool2d_backward(dm, x, false, kernel, stride, padding, include_pad, cv), tolerance);
        }
      }
      same(global_max_pool2d(gx), global_max_pool2d(x), 0);
      same(global_avg_pool2d(gx), global_avg_pool2d(x), tolerance);
      const Tensor gamma = random_normal({3}, 0, 1, d), beta = random_normal({3}, 0, 1, d);
      const Tensor mean = random_normal({3}, 0, 1, d), var = random_uniform({3}, 0.5, 2, d);
      same(batch_norm(gx, gamma.to(cuda(0)), beta.to(cuda(0)), mean.to(cuda(0)), var.to(cuda(0))),
           batch_norm(x, gamma, beta, mean, var), tolerance);
    }
    // Per dtype: 3 per convolution, 6 per pooling window, 3 more.
    CHECK(checked == 2 * (4 * 3 + 5 * 6 + 3));
  }

  TEST_CASE("gpu: LeNet trained on cuda(0), eager and hybridized, ends with the CPU's weights") {
    if (!gpu_present()) return;
    const auto [X, y] = lenet_batch();
    check_trains_like_cpu(lenet, X, y, 4, 9);
  }

  TEST_CASE("gpu: one training step of LeNet on cuda(0), eager and hybridized, gives the CPU's output, loss and gradients") {
    if (!gpu_present()) return;
    const auto [X, y] = lenet_batch();
    check_step_like_cpu(lenet, X, y, 9, 1e-5);
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
