// Blocks, layers, parameters and initialisers, and hybridize(): captured once
// per input signature, then the plan runs without the user's forward, with
// the same numbers as eager execution; a data-parallel step on two devices
// at once, bit for bit as each device alone.
#include <doctest/doctest.h>

#include <cmath>
#include <hybra/hybra.hpp>
#include <limits>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "reference.hpp"

using namespace hybra;
namespace nn = hybra::nn;

namespace {

using test::max_rel_diff;

nn::HybridSequential chapter_mlp() {
  nn::HybridSequential net;
  net.add(nn::Dense(256, "relu"), nn::Dense(128, "relu"), nn::Dense(2));
  net.initialize();
  return net;
}

// The chapter's HybridNet: counts its forward calls and records F.
class HybridNet : public nn::HybridBlock<HybridNet> {
 public:
  HybridNet() : HybridBlock("hybridnet") {
    hidden = register_child(nn::Dense(4));
    output = register_child(nn::Dense(2));
  }
  template <class F>
  F hybrid_forward(const F& x) {
    ++calls;
    saw_symbol = std::is_same_v<F, Symbol>;
    return (*output)(relu((*hidden)(x)));
  }
  int calls = 0;
  bool saw_symbol = false;

 private:
  std::shared_ptr<nn::Dense> hidden, output;
};

class Doubler : public nn::Block {
 public:
  Doubler() : Block("doubler") {}
  Tensor forward(const Tensor& x) override { return x * 2; }
};

}  // namespace

TEST_CASE("the chapter's MLP gives the same numbers eagerly and hybridized") {
  auto net = chapter_mlp();
  for (std::int64_t batch : {1, 3, 64}) {
    CAPTURE(batch);
    Tensor x = random_normal({batch, 512});
    net.hybridize(false);
    Tensor eager = net(x);
    net.hybridize();
    Tensor hybrid = net(x);
    CHECK(hybrid.shape() == Shape{batch, 2});
    CHECK(max_rel_diff(eager, hybrid) <= 1e-6);
  }
  // The captured graph: three products, each bias-add + relu in its epilogue.
  std::string g = graph::to_string(net.plan().graph());
  CHECK(g.find("fully_connected(%0, %1, %2) epilogue[relu($0)] : (64, 256) float32") != std::string::npos);
  CHECK(g.find("fully_connected(%6, %7, %8) : (64, 2) float32") != std::string::npos);
  CHECK(net.captured() == 3);
}

TEST_CASE("hybridize captures once per input signature and never calls the forward again") {
  HybridNet net;
  net.initialize();
  Tensor x = random_normal({2, 3});
  Tensor eager1 = net(x);
  Tensor eager2 = net(x);
  CHECK(net.calls == 2);
  CHECK_FALSE(net.saw_symbol);
  net.hybridize();
  Tensor h1 = net(x), h2 = net(x), h3 = net(x);
  CHECK(net.calls == 3);  // one capture
  CHECK(net.saw_symbol);
  CHECK(max_rel_diff(eager1, h3) <= 1e-6);
  net(random_normal({2, 3}));
  CHECK(net.calls == 3);  // same signature, new values
  net(random_normal({5, 3}));
  CHECK(net.calls == 4);  // a new shape captures again
  net(random_normal({5, 3}, 0, 1, DType::float64));
  CHECK(net.calls == 5);  // and a new dtype
  {
    autograd::train_mode train;
    net(x);
  }
  CHECK(net.calls == 6);  // and the training mode
  net(x);
  CHECK(net.calls == 6);
  CHECK(net.captured() == 4);
}

TEST_CASE("parameters are named as in Gluon and initialised when their shape is known") {
  auto net = chapter_mlp();
  const std::string p = net.prefix();  // hybridsequential<n>_, n counting the nets made so far
  CHECK(p.starts_with("hybridsequential"));
  CHECK(net.collect_params().keys() == std::vector<std::string>{p + "dense0_weight", p + "dense0_bias", p + "dense1_weight",
                                                                p + "dense1_bias", p + "dense2_weight", p + "dense2_bias"});
  const auto w0 = net.collect_params()[p + "dense0_weight"];
  CHECK(w0.shape() == Shape{256, 0});
  CHECK_THROWS_WITH_AS(w0.data(), doctest::Contains("is completed by the first forward call"), ValueError);
  net(random_normal({1, 512}));
  CHECK(w0.shape() == Shape{256, 512});
  CHECK(w0.data().shape() == Shape{256, 512});
  auto b0 = net.collect_params()[p + "dense0_bias"].data().to_vector<float>();
  CHECK(std::all_of(b0.begin(), b0.end(), [](float v) { return v == 0; }));
  nn::Dense known(3, "", 4);
  known.initialize();
  CHECK(known.weight().data().shape() == Shape{3, 4});
  CHECK_THROWS_WITH_AS(known(ones({2, 5})), doctest::Contains("does not match its declared shape (3, 4)"), ShapeError);
}

TEST_CASE("a new parameter value or input value is used by the next hybridized call") {
  nn::Dense dense(2, "", 2);
  dense.initialize(nn::init::One());
  dense.hybridize();
  Tensor x = array<float>({{1, 2}});
  CHECK(dense(x).to_vector<float>() == std::vector<float>{3, 3});
  dense.weight().set_data(array<float>({{1, 0}, {0, 1}}));  // a new tensor: the plan's held inputs change
  CHECK(dense(x).to_vector<float>() == std::vector<float>{1, 2});
  x.assign(array<float>({{3, 4}}));  // the held tensor, written in place: read when the call runs
  CHECK(dense(x).to_vector<float>() == std::vector<float>{3, 4});
  CHECK(dense(array<float>({{5, 6}})).to_vector<float>() == std::vector<float>{5, 6});
  CHECK(dense(transpose(array<float>({{7}, {8}}))).to_vector<float>() == std::vector<float>{7, 8});  // copied contiguous
}

TEST_CASE("initialisers: ranges, statistics and seeding") {
  auto values = [](const nn::Initializer& init, Shape shape, std::uint64_t seed) {
    Generator g(seed);
    return init(shape, DType::float32, cpu(), g).to_vector<double>();
  };
  auto u = values(nn::init::Uniform(0.07), {100, 100}, 1);
  CHECK(*std::max_element(u.begin(), u.end()) < 0.07);
  CHECK(*std::min_element(u.begin(), u.end()) >= -0.07);
  auto n = values(nn::init::Normal(0.5), {200, 200}, 2);
  double mean = 0, var = 0;
  for (double v : n) mean += v / static_cast<double>(n.size());
  for (double v : n) var += (v - mean) * (v - mean) / static_cast<double>(n.size());
  CHECK(std::abs(mean) < 0.01);
  CHECK(std::abs(std::sqrt(var) - 0.5) < 0.01);
  auto x = values(nn::init::Xavier(), {64, 192}, 3);
  const double bound = std::sqrt(3.0 / 128);
  CHECK(*std::max_element(x.begin(), x.end()) < bound);
  CHECK(*std::max_element(x.begin(), x.end()) > 0.9 * bound);
  CHECK(values(nn::init::Zero(), {3}, 0) == std::vector<double>(3, 0));
  CHECK(values(nn::init::Constant(2.5), {2}, 0) == std::vector<double>(2, 2.5));
  CHECK(values(nn::init::Normal(), {10}, 7) == values(nn::init::Normal(), {10}, 7));
  CHECK_THROWS_AS(nn::init::Xavier("cauchy"), ValueError);
  CHECK_THROWS_AS(values(nn::init::Xavier(), {5}, 0), ShapeError);
  // A seeded model is reproducible.
  auto weights = [] {
    seed(42);
    nn::Dense d(3, "", 4);
    d.initialize(nn::init::Xavier());
    return d.weight().data().to_vector<float>();
  };
  CHECK(weights() == weights());
}

TEST_CASE("containers: Sequential runs Blocks eagerly, HybridConcurrent concatenates, and a Block refuses capture") {
  nn::Sequential seq;
  auto dense = std::make_shared<nn::Dense>(3, "tanh", 4);
  seq.add(Doubler(), dense);
  seq.initialize(nn::init::One());
  seq.hybridize();  // the Dense is hybridized; the Doubler stays eager
  Tensor x = ones({2, 4});
  CHECK(max_rel_diff(seq(x), full({2, 3}, std::tanh(8.0))) <= 1e-6);
  CHECK(dense->hybridized());
  CHECK(dense->captured() == 1);

  nn::HybridConcurrent both(1);
  both.add(nn::Dense(2, "relu", 3), nn::Dense(5, "", 3), nn::Flatten());
  both.initialize();
  Tensor in = random_normal({4, 3});
  Tensor eager = both(in);
  CHECK(eager.shape() == Shape{4, 10});
  both.hybridize();
  CHECK(max_rel_diff(both(in), eager) <= 1e-6);

  Doubler plain;
  CHECK_THROWS_WITH_AS(plain(sym::var("data", Shape{2})),
                       doctest::Contains("block 'doubler1' is a Block, not a HybridBlock: its forward is eager-only C++"),
                       ValueError);
}

TEST_CASE("Activation, Flatten and Dropout layers, eager and hybridized") {
  nn::HybridSequential net;
  net.add(nn::Flatten(), nn::Activation("softrelu"), nn::Dropout(0.5), nn::Activation("sigmoid"));
  Tensor x = random_normal({4, 2, 3});
  Tensor eager = net(x);
  CHECK(eager.shape() == Shape{4, 6});
  CHECK(max_rel_diff(eager, eval(sigmoid(log(exp(reshape(x, {4, 6})) + 1)))) <= 1e-6);
  net.hybridize();
  CHECK(max_rel_diff(net(x), eager) <= 1e-6);  // predicting: dropout is the identity

  nn::Dropout drop(0.5);
  Tensor ones_in = ones({1000});
  autograd::train_mode train;
  auto dropped = drop(ones_in).to_vector<float>();
  const auto zeros_count = std::count(dropped.begin(), dropped.end(), 0.0f);
  CHECK(zeros_count > 400);
  CHECK(zeros_count < 600);
  CHECK(std::all_of(dropped.begin(), dropped.end(), [](float v) { return v == 0 || v == 2; }));
  drop.hybridize();
  auto a = drop(ones_in).to_vector<float>(), b = drop(ones_in).to_vector<float>();
  CHECK(a != b);  // a captured dropout draws a new mask every call
  CHECK(std::count(a.begin(), a.end(), 0.0f) > 400);

  // A call reserves its masks on the calling thread, in the order the eager
  // block draws them: seeded, the hybridized net drops what the eager one
  // does, whatever the calling thread draws while the plan runs.
  nn::HybridSequential twin;
  twin.add(nn::Dropout(0.5), nn::Dropout(0.3));
  auto draw_sequence = [&] {
    seed(5);
    std::vector<Tensor> drawn;  // read only at the end, so that calls and draws overlap
    for (int call = 0; call < 3; ++call) {
      drawn.push_back(twin(ones_in));
      drawn.push_back(random_normal({64}));
    }
    std::vector<std::vector<float>> r;
    for (const auto& t : drawn) r.push_back(t.to_vector<float>());
    return r;
  };
  const auto eager_draws = draw_sequence();
  twin.hybridize();
  CHECK(draw_sequence() == eager_draws);
  CHECK_THROWS_AS(nn::Dropout(1.5), ValueError);
  CHECK_THROWS_AS(nn::Activation("swish"), ValueError);
}

TEST_CASE("nn: the activation layers of current models, eager and hybridized, and PReLU's learned slopes") {
  nn::HybridSequential net;
  net.add(nn::Dense(6, "gelu"), nn::GELU("tanh"), nn::LeakyReLU(0.1), nn::ELU(0.5), nn::SELU(), nn::Swish(2),
          nn::SiLU(), nn::Activation("silu"), nn::PReLU(), nn::Dense(3, "selu"));
  net.initialize();
  const Tensor x = random_normal({4, 5});
  const Tensor eager = net(x);
  CHECK(eager.shape() == Shape{4, 3});
  net.hybridize();
  CHECK(max_rel_diff(net(x), eager) <= 1e-6);

  nn::PReLU prelu(3);
  prelu.initialize();
  Tensor v = reshape(array<float>({-4, 2, -1, 3, 5, -2}), {1, 3, 2});
  Tensor y;
  {
    autograd::record rec;
    y = prelu(v);
    sum(y).backward();
  }
  CHECK(y.to_vector<float>() == std::vector<float>{-1, 2, -0.25f, 3, 5, -0.5f});
  // d/d alpha_c: the sum of channel c's negative inputs.
  CHECK(prelu.alpha().grad().to_vector<float>() == std::vector<float>{-4, -1, -2});
  prelu.hybridize();
  CHECK(prelu(v).to_vector<float>() == y.to_vector<float>());
  CHECK_THROWS_WITH_AS(prelu(ones({2, 4})), doctest::Contains("input (2, 4) has no axis 1 of its 3 channels"),
                       ShapeError);

  CHECK_THROWS_WITH_AS(nn::GELU("fast"), doctest::Contains("approximation is 'erf' or 'tanh', not 'fast'"),
                       ValueError);
  CHECK_THROWS_AS(nn::LeakyReLU(std::nan("")), ValueError);
  CHECK_THROWS_AS(nn::PReLU(0), ValueError);
  CHECK_THROWS_WITH_AS(nn::Activation("mish"), doctest::Contains("unknown act_type 'mish'"), ValueError);
  // Every name a layer accepts when made has an expression, eager and captured.
  for (std::string_view act : activation_names) {
    CAPTURE(act);
    nn::Activation layer{std::string(act)};
    const Tensor eager = layer(v);
    layer.hybridize();
    CHECK(max_rel_diff(layer(v), eager) <= 1e-6);
  }
}

TEST_CASE("nn: a network prints as its tree of blocks, and summary tabulates output shapes and parameters") {
  nn::HybridSequential net;
  net.add(nn::Conv2D(6, 5, 1, 2, 1, 1, "relu"), nn::MaxPool2D(2), nn::BatchNorm(), nn::Flatten(),
          nn::Dense(10, "", 0, false));
  net.initialize();
  std::ostringstream printed;
  printed << net;
  CHECK(printed.str() ==
        "HybridSequential(\n"
        "  (conv0): Conv2D(? -> 6, kernel (5, 5), padding (2, 2), relu)\n"
        "  (pool0): MaxPool2D(size (2, 2), stride (2, 2))\n"
        "  (batchnorm0): BatchNorm(? channels, eps 1e-05, momentum 0.9)\n"
        "  (flatten0): Flatten()\n"
        "  (dense0): Dense(? -> 10, no bias)\n"
        ")");
  net.hybridize();
  const Tensor x = zeros({2, 1, 8, 8});
  const auto rows = nn::summary_rows(net, x);
  REQUIRE(rows.size() == 6);
  CHECK(rows[0].depth == 0);
  CHECK(rows[0].type == "HybridSequential");
  CHECK(rows[0].output == Shape{2, 10});
  CHECK(rows[1].depth == 1);
  CHECK(rows[1].name == "conv0");
  CHECK(rows[1].output == Shape{2, 6, 8, 8});
  CHECK(rows[1].params == 6 * 25 + 6);
  CHECK(rows[3].params == 4 * 6);         // gamma, beta and the two running statistics
  CHECK(rows[5].params == 6 * 4 * 4 * 10);  // no bias
  std::ostringstream table;
  nn::summary(net, x, table);
  CHECK(table.str().find("  dense0 (Dense)") != std::string::npos);
  CHECK(table.str().find("parameters: 1140 (trained 1128, not trained 12)") != std::string::npos);
  // Summarised eagerly, the net stays hybridized; the shapes it completed now print.
  CHECK(net.hybridized());
  CHECK(net.captured() == 0);
  printed.str("");
  printed << net;
  CHECK(printed.str().find("Conv2D(1 -> 6,") != std::string::npos);
  CHECK(printed.str().find("BatchNorm(6 channels,") != std::string::npos);
  CHECK(printed.str().find("Dense(96 -> 10, no bias)") != std::string::npos);
  // A summary that fails leaves the next call as it was: captured.
  CHECK_THROWS_AS(nn::summary_rows(net, zeros({2, 3})), ShapeError);
  CHECK(net(x).shape() == Shape{2, 10});
  CHECK(net.captured() == 1);

  HybridNet user;
  printed.str("");
  printed << user;
  CHECK(printed.str() == "HybridNet(\n  (dense0): Dense(? -> 4)\n  (dense1): Dense(? -> 2)\n)");
}

TEST_CASE("bad input to a hybridized block: a clear error, from the call") {
  auto net = chapter_mlp();
  net.hybridize();
  net(random_normal({1, 512}));
  CHECK_THROWS_WITH_AS(net(random_normal({1, 300})), doctest::Contains("does not match its declared shape (256, 512)"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(net(random_normal({1, 512}, 0, 1, DType::float32, cpu(1))),
                       doctest::Contains("_weight' has no copy on cpu(1) (it lives on cpu(0)); initialize its block on that device"),
                       DeviceError);
  CHECK_THROWS_AS(net(Tensor{}), ValueError);
}

TEST_CASE("nn: accuracy, top-k accuracy and cross-entropy accumulate over batches, as Gluon's metrics") {
  const Tensor preds = reshape(array({0.1f, 0.7f, 0.2f, 0.5f, 0.3f, 0.2f, 0.2f, 0.2f, 0.6f, 0.3f, 0.4f, 0.3f}), {4, 3});
  const Tensor labels = array({1, 1, 2, 0});
  nn::Accuracy accuracy;
  nn::TopKAccuracy top2(2);
  nn::CrossEntropy cross_entropy;
  CHECK(std::isnan(accuracy.get().second));  // nothing seen yet
  for (nn::EvalMetric* m : {static_cast<nn::EvalMetric*>(&accuracy), static_cast<nn::EvalMetric*>(&top2),
                            static_cast<nn::EvalMetric*>(&cross_entropy)})
    m->update(labels, preds);
  CHECK(accuracy.get() == std::pair<std::string, double>{"accuracy", 0.5});  // rows 0 and 2
  CHECK(top2.get() == std::pair<std::string, double>{"top_k_accuracy_2", 1.0});
  const double ce = -(std::log(0.7) + std::log(0.3) + std::log(0.6) + std::log(0.3)) / 4;
  CHECK(cross_entropy.get().second == doctest::Approx(ce).epsilon(1e-6));
  // A second batch adds to the first; labels of another dtype are read as indices.
  accuracy.update(array({2.0, 0.0}), reshape(array({0.0, 0.0, 1.0, 0.9, 0.1, 0.0}), {2, 3}));
  CHECK(accuracy.get().second == doctest::Approx(4.0 / 6));
  accuracy.reset();
  CHECK(std::isnan(accuracy.get().second));
  // A NaN score of the label is a miss; a NaN elsewhere outranks the label.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  accuracy.update(array({0, 0}), reshape(array({nan, 1.0f, 1.0f, nan}), {2, 2}));
  CHECK(accuracy.get().second == 0);
}

TEST_CASE("nn: a metric given labels and predictions that do not match says which and why") {
  nn::Accuracy accuracy;
  const Tensor preds = zeros({4, 3});
  CHECK_THROWS_WITH_AS(accuracy.update(zeros({4, 1}), preds),
                       "accuracy: labels must be (N) and preds (N, C), not labels (4, 1) and preds (4, 3)", ShapeError);
  CHECK_THROWS_WITH_AS(accuracy.update(array({0, 1, 3, 0}), preds),
                       "accuracy: label 3 of sample 2 is not a class index in [0, 3)", ValueError);
  CHECK_THROWS_WITH_AS(accuracy.update(array({0.0, 1.5, 0.0, 0.0}), preds),
                       "accuracy: label 1.5 of sample 1 is not a class index in [0, 3)", ValueError);
  CHECK(std::isnan(accuracy.get().second));  // a rejected batch adds nothing
}

namespace {
// Two inputs and two outputs: attention weights over the last axis, masked,
// and the weighted sum; with one input, the projection alone.
class MaskedPool : public nn::HybridBlock<MaskedPool> {
 public:
  MaskedPool() : HybridBlock("maskedpool") { dense = register_child(nn::Dense({.units = 4, .flatten = false})); }
  template <class F>
  std::tuple<F, F> hybrid_forward(const F& x, const F& mask) {
    const F weights = masked_softmax((*dense)(x), mask);
    return {sum(F(weights * x), -1), weights};
  }
  template <class F>
  F hybrid_forward(const F& x) {
    return (*dense)(x);
  }
  std::shared_ptr<nn::Dense> dense;
};

// Only two inputs, and a parent that calls it inside its own graph.
class PooledTwice : public nn::HybridBlock<PooledTwice> {
 public:
  PooledTwice() : HybridBlock("pooledtwice") { pool = register_child(MaskedPool()); }
  template <class F>
  F hybrid_forward(const F& x, const F& mask) {
    auto [pooled, weights] = (*pool)(x, mask);
    return F(pooled * 2);
  }
  std::shared_ptr<MaskedPool> pool;
};
}  // namespace

TEST_CASE("nn: a block of several inputs and outputs, eager, hybridized, differentiated, exported and nested") {
  MaskedPool block;
  block.initialize();
  const Tensor x = random_normal({2, 3, 4});
  const Tensor mask = reshape(array<std::uint8_t>({1, 1, 0, 1, 1, 1, 1, 0}), {2, 1, 4});
  auto [pooled, weights] = block(x, mask);
  CHECK(pooled.shape() == Shape{2, 3});
  CHECK(weights.shape() == Shape{2, 3, 4});
  CHECK(weights.to_vector<float>()[2] == 0);
  CHECK(block(x).shape() == Shape{2, 3, 4});  // the one-input overload
  CHECK(block.input_names() == std::vector<std::string>{"data"});

  auto gradients = [&] {
    autograd::record rec;
    auto [p, w] = block(x, mask);
    sum(p).backward();
    return block.dense->weight().grad().to_vector<float>();
  };
  const auto eager_grad = gradients();
  block.hybridize();
  auto [hp, hw] = block(x, mask);
  CHECK(max_rel_diff(hp, pooled) <= 1e-6);
  CHECK(max_rel_diff(hw, weights) <= 1e-6);
  CHECK(test::max_rel_diff(std::vector<double>(eager_grad.begin(), eager_grad.end()),
                           [&] {
                             const auto g = gradients();
                             return std::vector<double>(g.begin(), g.end());
                           }()) <= 1e-5);
  CHECK(block(x).shape() == Shape{2, 3, 4});
  CHECK(block.captured() == 3);  // two inputs (predicting, then recording), one input

  test::ScratchDir dir;
  block(x, mask);
  block.export_model(dir / "pool");
  auto imported = nn::SymbolBlock::imports(dir / "pool-symbol.json", {"data0", "data1"}, dir / "pool-0000.params");
  const auto outs = imported({x, mask});
  REQUIRE(outs.size() == 2);
  CHECK(max_rel_diff(outs[0], pooled) <= 1e-6);
  CHECK(max_rel_diff(outs[1], weights) <= 1e-6);

  PooledTwice parent;
  parent.initialize();
  const Tensor eager = parent(x, mask);
  parent.hybridize();
  CHECK(max_rel_diff(parent(x, mask), eager) <= 1e-6);
  CHECK(parent.input_names() == std::vector<std::string>{"data0", "data1"});

  // Through Block's one-input interface (a container's call) it says what it takes.
  nn::HybridSequential net;
  net.add(PooledTwice());
  net.initialize();
  CHECK_THROWS_WITH_AS(net(x), doctest::Contains("takes 2 inputs, not 1"), ValueError);
  net.hybridize();
  CHECK_THROWS_WITH_AS(net(x), doctest::Contains("takes 2 inputs, not 1"), ValueError);
}

TEST_CASE("nn: layers take their options by name, Gluon's keywords, as the same layers made positionally") {
  CHECK(nn::Conv2D({.channels = 6, .kernel_size = 5, .padding = 2, .activation = "relu"}).settings() ==
        nn::Conv2D(6, 5, 1, 2, 1, 1, "relu").settings());
  nn::Conv2D grouped({.channels = 4, .kernel_size = {3, 1}, .strides = 2, .groups = 2, .use_bias = false,
                      .in_channels = 2});
  CHECK(grouped.weight().shape() == Shape{4, 1, 3, 1});
  CHECK(!grouped.bias());
  CHECK(nn::MaxPool2D({.pool_size = 3, .strides = 2, .ceil_mode = true}).settings() ==
        "size (3, 3), stride (2, 2), ceil mode");
  CHECK(nn::AvgPool2D({.pool_size = 2, .padding = 1, .count_include_pad = false}).settings() ==
        nn::AvgPool2D(2, 0, 1, false).settings());
  nn::BatchNorm norm({.momentum = 0.5, .epsilon = 1e-3, .center = false});
  CHECK(norm.settings() == nn::BatchNorm(1, 0.5, 1e-3).settings());
  CHECK(norm.beta().grad_req() == "null");
  CHECK_THROWS_WITH_AS(nn::Conv2D({.channels = 4}), doctest::Contains("kernel_size (0, 0) must be positive"),
                       ValueError);
}

// A kernel whose results depend on which thread runs it, on its device's
// share of the cores at that moment, or on what runs beside it gives wrong
// answers without an error; two devices stepping at once against each alone
// shows any such kernel among a model's. `make` gives the model, its
// parameters initialised on both devices.
namespace {
template <class Make>
void check_each_device_steps_as_alone(Make make, const Tensor& X, const Tensor& y) {
  const std::vector<Device> devices{cpu(0), cpu(1)};
  const auto xs = split_and_load(X, devices), ys = split_and_load(y, devices);
  for (bool hybridized : {false, true}) {
    CAPTURE(hybridized);
    hybra::seed(11);
    nn::HybridSequential net = make(devices);
    if (hybridized) net.hybridize();
    const nn::SoftmaxCrossEntropyLoss loss_fn;
    // The gradients of the parts in `parts`, their steps run at the same time.
    auto gradients = [&](const std::vector<std::size_t>& parts) {
      std::vector<Tensor> losses;
      {
        autograd::record rec;
        for (std::size_t k : parts) losses.push_back(loss_fn(net(xs[k]), ys[k]));
      }
      for (Tensor& l : losses) l.backward();
      std::vector<std::vector<float>> got;
      for (std::size_t k : parts)
        for (const auto& p : net.collect_params())
          if (p.grad_req() != "null") got.push_back(p.grad(devices[k]).to_vector<float>());
      return got;
    };
    auto alone = gradients({0});
    const auto second = gradients({1});
    alone.insert(alone.end(), second.begin(), second.end());
    for (int round = 0; round < 6; ++round) {
      CAPTURE(round);
      const auto together = gradients({0, 1});
      REQUIRE(together.size() == alone.size());
      for (std::size_t i = 0; i < alone.size(); ++i) {
        CAPTURE(i);
        CHECK(together[i] == alone[i]);
      }
    }
  }
}
}  // namespace

TEST_CASE("nn: a data-parallel step on two CPU devices gives each the gradients it gives alone, bit for bit") {
  SUBCASE("ResNet-18") {
    // Width 8: its last stage (64 channels) reaches oneDNN where it is built in.
    check_each_device_steps_as_alone(
        [](const std::vector<Device>& devices) {
          nn::HybridSequential net = nn::model_zoo::resnet18(10, 8);
          net.initialize(nn::init::Xavier(), devices);
          return net;
        },
        random_normal({16, 1, 16, 16}), random_uniform({16}, 0, 10).astype(DType::int32));
  }
  SUBCASE("a transformer encoder: embedding, attention, layer norm, GELU") {
    // Products of 32 x 64 and more reach OpenBLAS; no dropout, whose masks
    // are drawn in the order the devices ask.
    check_each_device_steps_as_alone(
        [](const std::vector<Device>& devices) {
          nn::HybridSequential net;
          net.add(nn::Embedding({.input_dim = 50, .output_dim = 32}),
                  nn::TransformerEncoderLayer({.units = 32, .heads = 4, .hidden = 64, .dropout = 0,
                                               .activation = "gelu"}),
                  nn::Dense(10, "", 16 * 32));
          net.initialize(nn::init::Xavier(), devices);
          return net;
        },
        random_uniform({8, 16}, 0, 50).astype(DType::int32).astype(DType::float32),
        random_uniform({8}, 0, 10).astype(DType::int32));
  }
}
