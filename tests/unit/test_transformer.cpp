// The pieces of a transformer: Dense on the last axis, options by name,
// layer_norm and LayerNorm, masked_softmax, embedding and Embedding, batched products in model files
// (MXNet's batch_dot), and an encoder layer that trains to the same losses
// eagerly and hybridized.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <string>
#include <hybra/hybra.hpp>
#include <vector>

#include "reference.hpp"

using namespace hybra;
namespace nn = hybra::nn;

namespace {
// The mean squared error of `steps` Adam steps on (x, target), each step's dropout masks set by its number.
std::vector<double> adam_losses(nn::HybridSequential& net, const Tensor& x, const Tensor& target, int steps) {
  Trainer trainer(net.collect_params(), "adam", {{"learning_rate", 0.01}});
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    seed(100 + step);
    Tensor loss;
    {
      autograd::record rec;
      const Tensor d = net(x) - target;
      loss = mean(d * d);
      loss.backward();
    }
    trainer.step(1);
    losses.push_back(loss.item<double>());
  }
  return losses;
}
}  // namespace

TEST_CASE("transformer: Dense on the last axis, by named options, is the product with each row of features") {
  nn::Dense dense({.units = 5, .activation = "relu", .flatten = false});
  dense.initialize();
  const Tensor x = random_normal({2, 3, 4});
  const Tensor y = dense(x);
  CHECK(y.shape() == Shape{2, 3, 5});
  CHECK(dense.weight().shape() == Shape{5, 4});
  const Tensor want = relu(matmul(x, transpose(dense.weight().data())) + dense.bias()->data());
  CHECK(test::max_rel_diff(y, want) <= 1e-6);
  dense.hybridize();
  CHECK(test::max_rel_diff(dense(x), y) <= 1e-6);
  CHECK(dense.settings() == "4 -> 5, relu, last axis");

  // The positional form is the same layer, flattening.
  nn::Dense flat(5, "relu", 12);
  CHECK(flat.settings() == "12 -> 5, relu");
  CHECK_THROWS_WITH_AS(nn::Dense({.units = 0}), doctest::Contains("units must be positive, not 0"), ValueError);
  CHECK_THROWS_WITH_AS(nn::Dense({.units = 2, .activation = "mish"}), doctest::Contains("unknown act_type 'mish'"),
                       ValueError);
}

TEST_CASE("transformer: layer_norm and LayerNorm normalise each sample over an axis, with learned scale and shift") {
  const Tensor x = reshape(array<double>({1, 2, 3, 4, 1e8, 1e8 + 2, 1e8 + 4, 1e8 + 6}), {2, 4});
  const Tensor gamma = array<double>({1, 2, 1, 1}), beta = array<double>({0, 0, 0, 1});
  const auto y = Tensor(layer_norm(x, gamma, beta, -1, 1e-5)).to_vector<double>();
  // Row 0: mean 2.5, variance 1.25; row 1 the same spread around 1e8 + 3 (no cancellation), doubled.
  const auto expect = [](double centred, double var) { return centred / std::sqrt(var + 1e-5); };
  const std::vector<double> want{expect(-1.5, 1.25),     2 * expect(-0.5, 1.25), expect(0.5, 1.25),
                                 expect(1.5, 1.25) + 1, expect(-3, 5),          2 * expect(-1, 5),
                                 expect(1, 5),          expect(3, 5) + 1};
  CHECK(test::max_rel_diff(y, want) <= 1e-9);
  // Over axis 0, gamma and beta broadcast along it.
  const Tensor one = ones({2}, DType::float64), zero = zeros({2}, DType::float64);
  const auto columns = Tensor(layer_norm(x, one, zero, 0)).to_vector<double>();
  CHECK(std::abs(columns[0] + 1) < 1e-6);
  CHECK(std::abs(columns[4] - 1) < 1e-6);

  CHECK_THROWS_WITH_AS(layer_norm(x, ones({3}), zeros({4}), -1),
                       doctest::Contains("gamma of shape (3,) for input (2, 4), whose axis -1 has 4 elements"),
                       ShapeError);
  CHECK_THROWS_AS(layer_norm(x, gamma, beta, 2), AxisError);
  CHECK_THROWS_AS(layer_norm(x, gamma, beta, -1, 0), ValueError);

  // The layer: eager = hybridized, and its gradients: each row's normalised
  // values sum to zero whatever the input, so d sum(y) / dx = 0; d/dgamma is
  // the column sums of the normalised values, d/dbeta the row count.
  nn::LayerNorm norm;
  norm.initialize();
  Tensor v = random_normal({3, 6});
  v.attach_grad();
  Tensor eager;
  {
    autograd::record rec;
    eager = norm(v);
    sum(eager).backward();
  }
  CHECK(norm.gamma().shape() == Shape{6});
  for (float g : v.grad().to_vector<float>()) CHECK(std::abs(g) < 1e-5);
  CHECK(norm.beta().grad().to_vector<float>() == std::vector<float>(6, 3));
  CHECK(test::max_rel_diff(norm.gamma().grad(), sum(eager, 0)) <= 1e-5);
  norm.hybridize();
  CHECK(test::max_rel_diff(norm(v), eager) <= 1e-5);
  CHECK(norm.settings() == "6 channels, eps 1e-05");
  nn::LayerNorm fixed({.center = false, .scale = false});
  CHECK(fixed.gamma().grad_req() == "null");
  CHECK(fixed.beta().grad_req() == "null");
  CHECK_THROWS_AS(nn::LayerNorm({.epsilon = 0}), ValueError);
}

TEST_CASE("transformer: masked_softmax spreads each row over its unmasked elements, and a fully masked row is 0") {
  const Tensor x = reshape(array<float>({1, 2, 1000, 3, 5, 6, 7, 8}), {2, 4});
  const Tensor mask = reshape(array<std::uint8_t>({1, 1, 0, 1, 0, 0, 0, 0}), {2, 4});
  Tensor y;
  {
    autograd::record rec;
    Tensor xv = x;
    xv.attach_grad();
    y = masked_softmax(xv, mask);
    sum(y * array<float>({1, 2, 3, 4})).backward();
    for (float g : xv.grad().to_vector<float>()) CHECK(std::isfinite(g));
    const auto g = xv.grad().to_vector<float>();
    CHECK(g[2] == 0);
    CHECK(std::vector<float>(g.begin() + 4, g.end()) == std::vector<float>(4, 0));
  }
  const auto got = y.to_vector<float>();
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  CHECK(got[0] == doctest::Approx(std::exp(1.0) / z));
  CHECK(got[1] == doctest::Approx(std::exp(2.0) / z));
  CHECK(got[2] == 0);  // its 1000 would take all the mass unmasked
  CHECK(got[3] == doctest::Approx(std::exp(3.0) / z));
  CHECK(std::vector<float>(got.begin() + 4, got.end()) == std::vector<float>(4, 0));
  CHECK_THROWS_WITH_AS(masked_softmax(ones({2}, DType::int32), ones({2})),
                       doctest::Contains("input of dtype int32 is not floating"), DTypeError);
  // The mask broadcasts (one row for both), and captured it is the same.
  const Tensor row_mask = array<std::uint8_t>({1, 1, 0, 1});
  const Symbol xs = sym::var("x", Shape{2, 4}), ms = sym::var("m", Shape{4}, DType::uint8);
  const Tensor want = masked_softmax(x, row_mask);
  const graph::Graph g = graph::trace({masked_softmax(xs, ms)});
  CHECK(test::max_rel_diff(graph::run(g, {{"x", x}, {"m", row_mask}})[0], want) <= 1e-6);
  std::vector<Tensor> inputs;
  for (int v : g.vars()) inputs.push_back(g.nodes[static_cast<std::size_t>(v)].name == "x" ? x : row_mask);
  const jit::Plan plan(graph::optimize(g), cpu(), false, "masked softmax");
  CHECK(test::max_rel_diff(plan(inputs)[0], want) <= 1e-6);
}

TEST_CASE("transformer: an encoder layer trains to the same losses eagerly and hybridized, and exports") {
  auto make = [](bool norm_first) {
    nn::HybridSequential net;
    net.add(nn::TransformerEncoderLayer(
                {.units = 8, .heads = 2, .hidden = 16, .dropout = 0.1, .activation = "gelu", .norm_first = norm_first}),
            nn::Dense(1, "", 40));  // in_units given: no draw deferred to the first call
    seed(11);
    net.initialize();
    return net;
  };
  seed(12);
  const Tensor x = random_normal({4, 5, 8});
  const Tensor target = reshape(mean(x, {1, 2}), {4, 1});
  for (bool norm_first : {false, true}) {
    CAPTURE(norm_first);
    auto eager = make(norm_first), hybrid = make(norm_first);
    hybrid.hybridize();
    CHECK(test::max_rel_diff(hybrid(x), eager(x)) <= 1e-5);
    const auto eager_losses = adam_losses(eager, x, target, 12), hybrid_losses = adam_losses(hybrid, x, target, 12);
    CHECK(test::max_rel_diff(eager_losses, hybrid_losses) <= 1e-4);
    CHECK(hybrid_losses.back() < 0.5 * hybrid_losses.front());
  }

  // Exported, its batched products are MXNet's batch_dot, read back as matmul.
  test::ScratchDir dir;
  auto net = make(false);
  net.hybridize();
  const Tensor want = net(x);
  net.export_model(dir / "encoder");
  std::ifstream json(dir / "encoder-symbol.json");
  const std::string text{std::istreambuf_iterator<char>(json), {}};
  CHECK(text.find("\"batch_dot\"") != std::string::npos);
  auto imported = nn::SymbolBlock::imports(dir / "encoder-symbol.json", {"data"}, dir / "encoder-0000.params");
  CHECK(test::max_rel_diff(imported(x), want) <= 1e-6);

  CHECK_THROWS_WITH_AS(nn::MultiHeadAttention({.units = 8, .heads = 3}),
                       doctest::Contains("heads 3 must be positive and divide units (8)"), ValueError);
  nn::MultiHeadAttention attention({.units = 8, .heads = 2});
  attention.initialize();
  CHECK_THROWS_WITH_AS(attention(ones({2, 8})), doctest::Contains("input (2, 8) is not (batch, tokens, 8)"),
                       ShapeError);
}

TEST_CASE("transformer: a mask keeps a query from the keys it masks, in attention and the encoder layer") {
  seed(21);
  nn::MultiHeadAttention attention({.units = 8, .heads = 2});
  nn::TransformerEncoderLayer layer({.units = 8, .heads = 2, .hidden = 16, .dropout = 0});
  attention.initialize();
  layer.initialize();
  const Tensor x = random_normal({2, 5, 8});
  // Batch 0 may not attend to token 3; batch 1 attends to everything.
  const Tensor mask = reshape(array<std::uint8_t>({1, 1, 1, 0, 1, 1, 1, 1, 1, 1}), {2, 1, 5});
  Tensor changed = x.copy();
  slice(slice(changed, 0, 0, 1), 1, 3, 4).assign(ones({1, 1, 8}) * 7);
  for (nn::HybridBase* block : {static_cast<nn::HybridBase*>(&attention), static_cast<nn::HybridBase*>(&layer)}) {
    CAPTURE(block->name());
    auto call = [&](const Tensor& in) {
      return block == &attention ? attention(in, mask) : layer(in, mask);
    };
    const Tensor eager = call(x), moved = call(changed);
    CHECK(eager.shape() == x.shape());
    // Every token's output but token 3's own is blind to token 3 of batch 0.
    for (std::int64_t t : {0, 1, 2, 4})
      CHECK(test::max_rel_diff(slice(moved, 1, t, t + 1), slice(eager, 1, t, t + 1)) <= 1e-5);
    CHECK(test::max_rel_diff(slice(moved, 0, 1, 2), slice(eager, 0, 1, 2)) <= 1e-6);
    block->hybridize();
    CHECK(test::max_rel_diff(call(x), eager) <= 1e-5);
  }
  // Unmasked, it is the one-input forward.
  CHECK(test::max_rel_diff(attention(x, ones({2, 5, 5}, DType::uint8)), attention(x)) <= 1e-6);
  CHECK_THROWS_WITH_AS(attention(x, ones({2, 5})),
                       doctest::Contains("mask (2, 5) for input (2, 5, 8) is not (2, 5 or 1, 5)"), ShapeError);
}

TEST_CASE("transformer: embedding picks rows of its table, and its gradient adds dy into the rows it picked") {
  const Tensor table = reshape(arange(0, 12, 1, DType::float64), {4, 3});
  // Any index dtype; floats hold whole numbers (MXNet's data are float32).
  for (DType d : {DType::int64, DType::int32, DType::uint8, DType::float32}) {
    CAPTURE(name(d));
    const Tensor indices = reshape(array<std::int64_t>({3, 0, 3, 1}), {2, 2}).astype(d);
    const Tensor y = embedding(indices, table);
    CHECK(y.shape() == Shape{2, 2, 3});
    CHECK(y.dtype() == DType::float64);
    CHECK(y.to_vector<double>() == std::vector<double>{9, 10, 11, 0, 1, 2, 9, 10, 11, 3, 4, 5});
  }
  // Row 3 is picked twice: its gradient is the sum of both rows of dy; row 2 is picked by none.
  Tensor w = table.copy();
  w.attach_grad();
  const Tensor indices = array<std::int64_t>({3, 0, 3, 1});
  const Tensor weights = reshape(arange(1, 13, 1, DType::float64), {4, 3});
  {
    autograd::record rec;
    Tensor loss = sum(embedding(indices, w) * weights);
    loss.backward();
  }
  CHECK(w.grad().to_vector<double>() == std::vector<double>{4, 5, 6, 10, 11, 12, 0, 0, 0, 1 + 7, 2 + 8, 3 + 9});

  // The same through a captured graph, forward and backward.
  auto x = sym::var("x", Shape{4}, DType::int64), t = sym::var("t", Shape{4, 3}, DType::float64);
  const Symbol picked = embedding(x, t);
  CHECK(picked.shape() == Shape{4, 3});
  CHECK(graph::run(graph::trace({picked}), {{"x", indices}, {"t", table}})[0].to_vector<double>() ==
        Tensor(embedding(indices, table)).to_vector<double>());
}

TEST_CASE("transformer: an index that is not a row of the table is an IndexError naming it and its place") {
  const Tensor table = ones({4, 3});
  for (const auto& [bad, text] : std::vector<std::pair<float, std::string>>{
           {4, "index 4 (element 1"}, {-1, "index -1 (element 1"}, {1.5f, "index 1.5 (element 1"}}) {
    CAPTURE(bad);
    const Tensor indices = array<float>({0, bad, 2});
    CHECK_THROWS_WITH_AS(Tensor(embedding(indices, table)).wait_to_read(),
                         doctest::Contains(("embedding: " + text + " of the indices, flattened) is not one of the 4 rows").c_str()),
                         IndexError);
    CHECK_THROWS_WITH_AS(embedding_backward(indices, ones({3, 3}), 4).wait_to_read(),
                         doctest::Contains(("embedding_backward: " + text).c_str()), IndexError);
  }
  CHECK_THROWS_WITH_AS(embedding(array<float>({0}), ones({4})),
                       doctest::Contains("embedding: the table must be 2-d (rows, width), not of shape (4,)"), ShapeError);
  CHECK_THROWS_WITH_AS(embedding(array<float>({0}), ones({4, 2}, DType::int32)),
                       doctest::Contains("embedding: the table's dtype is int32; it must be a float dtype"), DTypeError);
  CHECK_THROWS_WITH_AS(embedding_backward(array<float>({0, 1}), ones({3, 2}), 4),
                       doctest::Contains("dy of shape (3, 2) for indices of shape (2,)"), ShapeError);
  CHECK_THROWS_WITH_AS(nn::Embedding({.input_dim = 0, .output_dim = 4}),
                       doctest::Contains("input_dim and output_dim must be positive, not 0 and 4"), ValueError);

  // Hybridized, the plan's op fails the same way.
  nn::Embedding layer({.input_dim = 4, .output_dim = 2});
  layer.initialize();
  layer.hybridize();
  CHECK_THROWS_WITH_AS(layer(array<float>({0, 9})).wait_to_read(), doctest::Contains("index 9 (element 1"), IndexError);
  CHECK_NOTHROW(layer(array<float>({0, 3})).wait_to_read());
}

// Tokens (float32 indices, as Gluon's data) through Embedding, a transformer
// encoder layer and a Dense: trained eager and hybridized to the same losses;
// the table's rows no token picks keep their values; exported as MXNet's
// Embedding and imported back.
TEST_CASE("transformer: Embedding trains eager = hybridized under an encoder layer, and exports as MXNet's Embedding") {
  auto make = [] {
    nn::HybridSequential net;
    net.add(nn::Embedding({.input_dim = 12, .output_dim = 8}),
            nn::TransformerEncoderLayer({.units = 8, .heads = 2, .hidden = 16, .dropout = 0}), nn::Dense(1, "", 40));
    seed(31);
    net.initialize();
    return net;
  };
  const Tensor tokens = reshape(array<float>({1, 5, 2, 9, 5, 3, 3, 0, 7, 1, 2, 2, 9, 8, 6, 1, 0, 0, 4, 5}), {4, 5});
  const Tensor target = reshape(array<float>({1, -1, 0.5, 0}), {4, 1});
  auto eager = make(), hybrid = make();
  hybrid.hybridize();
  const Tensor before = static_cast<nn::Embedding&>(*eager.children()[0]).weight().data().copy();
  const auto eager_losses = adam_losses(eager, tokens, target, 10), hybrid_losses = adam_losses(hybrid, tokens, target, 10);
  CHECK(test::max_rel_diff(eager_losses, hybrid_losses) <= 1e-4);
  CHECK(hybrid_losses.back() < 0.5 * hybrid_losses.front());
  // Token 10 and 11 appear nowhere: Adam leaves their rows (zero gradients, zero moments) as they were.
  const Tensor after = static_cast<nn::Embedding&>(*eager.children()[0]).weight().data();
  CHECK(test::max_rel_diff(slice(after, 0, 10, 12), slice(before, 0, 10, 12)) == 0);
  CHECK(test::max_rel_diff(slice(after, 0, 0, 10), slice(before, 0, 0, 10)) > 1e-3);

  test::ScratchDir dir;
  const Tensor want = hybrid(tokens);
  hybrid.export_model(dir / "tokens");
  std::ifstream json(dir / "tokens-symbol.json");
  const std::string text{std::istreambuf_iterator<char>(json), {}};
  CHECK(text.find("\"Embedding\"") != std::string::npos);
  CHECK(text.find("\"input_dim\": \"12\"") != std::string::npos);
  auto imported = nn::SymbolBlock::imports(dir / "tokens-symbol.json", {"data"}, dir / "tokens-0000.params");
  CHECK(test::max_rel_diff(imported(tokens), want) <= 1e-6);
  CHECK(static_cast<nn::Embedding&>(*hybrid.children()[0]).settings() == "12 -> 8");
}
