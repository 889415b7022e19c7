// Autograd: every op's gradient against central finite differences (float64),
// eagerly (the tape) and symbolically (the gradient graph run by the
// interpreter); hybridized blocks against their eager selves.
#include <hybra/hybra.hpp>
#include <hybra/nn/loss.hpp>

#include <functional>

#include "reference.hpp"

using namespace hybra;
using test::max_rel_diff;

namespace {

// A test input: values spread away from the kinks of relu/abs/max.
Tensor input(const Shape& shape, int seed, double low = -2, double high = 2) {
  std::vector<double> v(static_cast<std::size_t>(checked_numel(shape)));
  for (std::size_t i = 0; i < v.size(); ++i) {
    const double t = static_cast<double>((i * 37 + static_cast<std::size_t>(seed) * 11 + 5) % 97) / 96.0;
    v[i] = low + (high - low) * (0.05 + 0.9 * t);
  }
  return array(v, shape);
}

// d(sum(head * f(inputs))) / d(inputs[k]) by central differences.
template <class F>
std::vector<double> numeric_gradient(F&& f, std::vector<Tensor> inputs, std::size_t k, const Tensor& head) {
  std::vector<double> x = inputs[k].to_vector<double>(), g(x.size());
  const double h = 1e-6;
  auto value = [&] {
    return sum(f(inputs) * head).template item<double>();
  };
  for (std::size_t i = 0; i < x.size(); ++i) {
    auto at = [&](double v) {
      auto moved = x;
      moved[i] = v;
      inputs[k] = array(moved, inputs[k].shape());
      return value();
    };
    g[i] = (at(x[i] + h) - at(x[i] - h)) / (2 * h);
  }
  return g;
}

// f written once over F (Tensor or Symbol), as a model's forward.
template <class F>
void check_gradients(F&& f, std::vector<Tensor> inputs, std::vector<bool> differentiable = {}) {
  if (differentiable.empty()) differentiable.assign(inputs.size(), true);
  Tensor head;
  {
    Tensor y = f(inputs);
    head = input(y.shape(), 7, 0.5, 1.5);
  }
  // Eager: the tape.
  std::vector<Tensor> leaves;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    leaves.push_back(inputs[k].copy());
    if (differentiable[k]) leaves.back().attach_grad();
  }
  {
    autograd::record rec;
    Tensor y = f(leaves);
    y.backward(head);
  }
  // Symbolic: the gradient graph of the same function.
  std::vector<Symbol> vars, wrt;
  std::unordered_map<std::string, Tensor> bound;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    vars.push_back(sym::var("x" + std::to_string(k), inputs[k].shape(), inputs[k].dtype()));
    bound.emplace("x" + std::to_string(k), inputs[k]);
    if (differentiable[k]) wrt.push_back(vars.back());
  }
  const Symbol y = f(vars);
  auto grads = autograd::grad({y}, {sym::constant(head)}, wrt);
  const auto symbolic = graph::run(graph::trace(grads), bound);

  for (std::size_t k = 0, s = 0; k < inputs.size(); ++k) {
    if (!differentiable[k]) continue;
    CAPTURE(k);
    const auto expected = numeric_gradient(f, inputs, k, head);
    CHECK(max_rel_diff(leaves[k].grad().to_vector<double>(), expected) < 1e-5);
    CHECK(max_rel_diff(symbolic[s++].to_vector<double>(), expected) < 1e-5);
  }
}

#define GRAD_CASE(name, body, ...)                                 \
  SUBCASE(name) {                                                  \
    check_gradients([](const auto& in) { return body; }, __VA_ARGS__); \
  }

template <class V>
using F = std::remove_cvref_t<decltype(std::declval<V>()[0])>;

}  // namespace

TEST_CASE("every op of the registry has a gradient rule, and only gradients' own ops lack one") {
  for (const auto& def : graph::detail::op_defs()) {
    CAPTURE(def.name);
    CHECK(autograd::has_rule_entry(def.name));
    CHECK(autograd::has_gradient(def.name) != def.gradient_only);
  }
}

TEST_CASE("elementwise gradients match finite differences, with broadcasting and scalars") {
  const Tensor a = input({2, 3}, 1), b = input({3}, 2), pos = input({2, 3}, 3, 0.5, 3), nz = input({3}, 4, 0.5, 2);
  GRAD_CASE("add", F<decltype(in)>(in[0] + in[1]), {a, b})
  GRAD_CASE("subtract", F<decltype(in)>(in[0] - in[1] * 2), {a, b})
  GRAD_CASE("multiply", F<decltype(in)>(in[0] * in[1]), {a, b})
  GRAD_CASE("divide", F<decltype(in)>(in[0] / in[1] + 1.5 / in[1]), {a, nz})
  GRAD_CASE("negative", F<decltype(in)>(-in[0]), {a})
  GRAD_CASE("exp", F<decltype(in)>(exp(in[0])), {a})
  GRAD_CASE("log", F<decltype(in)>(log(in[0])), {pos})
  GRAD_CASE("sqrt", F<decltype(in)>(sqrt(in[0])), {pos})
  GRAD_CASE("abs", F<decltype(in)>(abs(in[0])), {a})
  GRAD_CASE("tanh", F<decltype(in)>(tanh(in[0])), {a})
  GRAD_CASE("sigmoid", F<decltype(in)>(sigmoid(in[0])), {a})
  GRAD_CASE("relu", F<decltype(in)>(relu(in[0])), {a})
  GRAD_CASE("pow", F<decltype(in)>(pow(in[0], in[1])), {pos, b})
  GRAD_CASE("pow by a scalar", F<decltype(in)>(pow(in[0], 3)), {a})
  GRAD_CASE("maximum", F<decltype(in)>(maximum(in[0], in[1])), {a, b})
  GRAD_CASE("minimum", F<decltype(in)>(minimum(in[0], in[1])), {a, b})
  GRAD_CASE("softplus", F<decltype(in)>(softplus(in[0] * 4)), {a})
  GRAD_CASE("clip and relu6", F<decltype(in)>(clip(in[0], -1, 1.5) + relu6(in[0] * 4)), {a})
  GRAD_CASE("erf", F<decltype(in)>(erf(in[0])), {a})
  GRAD_CASE("gelu and gelu_tanh", F<decltype(in)>(gelu(in[0]) + gelu_tanh(in[0] * 2)), {a})
  GRAD_CASE("elu, selu and leaky_relu",
            F<decltype(in)>(elu(in[0], 0.5) + selu(in[0]) + leaky_relu(in[0], 0.2)), {a})
  GRAD_CASE("swish and silu", F<decltype(in)>(swish(in[0], 1.5) + silu(in[0])), {a})
  GRAD_CASE("where and comparisons", F<decltype(in)>(where(in[0] > in[1], in[0] * 3, in[1])), {a, b})
  GRAD_CASE("a fused chain", F<decltype(in)>(relu(in[0] * in[1] + 2) * sigmoid(in[0])), {a, b})
}

TEST_CASE("reduction, softmax and layout gradients match finite differences") {
  const Tensor x = input({2, 3, 4}, 1);
  GRAD_CASE("sum all", sum(in[0]), {x})
  GRAD_CASE("sum axes", sum(in[0], {0, 2}), {x})
  GRAD_CASE("sum keepdims", sum(in[0], 1, true), {x})
  GRAD_CASE("mean", mean(in[0], -1), {x})
  GRAD_CASE("max", max(in[0], 1), {x})
  GRAD_CASE("min keepdims", min(in[0], {0, 2}, true), {x})
  GRAD_CASE("softmax", softmax(in[0], 1), {x})
  GRAD_CASE("log_softmax", log_softmax(in[0]), {x})
  GRAD_CASE("cumsum", cumsum(in[0], 1), {x})
  GRAD_CASE("cumsum reversed", cumsum(in[0], -1, true), {x})
  GRAD_CASE("cumsum flattened", cumsum(in[0]), {x})
  GRAD_CASE("reshape", reshape(in[0], {4, -1}), {x})
  GRAD_CASE("flatten", flatten(in[0]), {x})
  GRAD_CASE("transpose", transpose(in[0], {2, 0, 1}), {x})
  GRAD_CASE("transpose reversed", transpose(in[0]), {x})
  GRAD_CASE("slice with a step", slice(in[0], 2, 3, 0, -2), {x})
  GRAD_CASE("slice", slice(in[0], 1, 1, std::nullopt), {x})
  GRAD_CASE("concat", concat(std::vector{in[0], in[1]}, 1), {x, input({2, 1, 4}, 5)})
  GRAD_CASE("broadcast_to", broadcast_to(in[0], {2, 3, 4}), {input({3, 1}, 6)})
}

TEST_CASE("product and layer gradients match finite differences") {
  GRAD_CASE("matmul", matmul(in[0], in[1]), {input({2, 3}, 1), input({3, 4}, 2)})
  GRAD_CASE("matmul batched and broadcast", matmul(in[0], in[1]), {input({2, 1, 2, 3}, 1), input({3, 3, 2}, 2)})
  GRAD_CASE("matmul vector", matmul(in[0], in[1]), {input({3}, 1), input({3, 4}, 2)})
  GRAD_CASE("matmul by a vector", matmul(in[0], in[1]), {input({2, 3}, 1), input({3}, 2)})
  GRAD_CASE("dot", dot(in[0], in[1]), {input({2, 3}, 1), input({3, 4}, 2)})
  GRAD_CASE("dot n-d", dot(in[0], in[1]), {input({2, 2, 3}, 1), input({2, 3, 2}, 2)})
  GRAD_CASE("dot of vectors", dot(in[0], in[1]), {input({3}, 1), input({3}, 2)})
  GRAD_CASE("fully_connected", fully_connected(in[0], in[1], in[2]), {input({2, 2, 3}, 1), input({4, 6}, 2), input({4}, 3)})
  GRAD_CASE("fully_connected without bias", fully_connected(in[0], in[1]), {input({3, 5}, 1), input({2, 5}, 2)})
  GRAD_CASE("conv2d", conv2d(in[0], in[1], in[2], 1, 1), {input({2, 2, 5, 5}, 1), input({3, 2, 3, 3}, 2), input({3}, 3)})
  GRAD_CASE("conv2d strided, dilated, grouped", conv2d(in[0], in[1], F<decltype(in)>{}, 2, 1, 2, 2),
            {input({1, 4, 7, 6}, 1), input({2, 2, 2, 3}, 2)})
  GRAD_CASE("max_pool2d", max_pool2d(in[0], 2, 2), {input({2, 2, 4, 6}, 1)})
  GRAD_CASE("max_pool2d overlapping, padded", max_pool2d(in[0], 3, 2, 1), {input({1, 2, 5, 5}, 1)})
  GRAD_CASE("avg_pool2d", avg_pool2d(in[0], 3, 2, 1, false), {input({1, 2, 5, 6}, 1)})
  GRAD_CASE("avg_pool2d counting the padding", avg_pool2d(in[0], 2, 1, 1), {input({1, 1, 4, 4}, 1)})
  GRAD_CASE("global pools", F<decltype(in)>(global_avg_pool2d(in[0]) + global_max_pool2d(in[0])), {input({2, 3, 3, 2}, 1)})
  GRAD_CASE("batch_norm", batch_norm(in[0], in[1], in[2], in[3], in[4], 1e-3),
            {input({2, 3, 2, 2}, 1), input({3}, 2), input({3}, 3), input({3}, 4), input({3}, 5, 0.5, 2)},
            {true, true, true, false, false})
  GRAD_CASE("softmax cross-entropy", nn::SoftmaxCrossEntropyLoss{}(in[0], in[1]),
            {input({4, 5}, 1), array<double>({0, 3, 4, 1})}, {true, false})
  GRAD_CASE("L2 loss", nn::L2Loss{}(in[0], in[1]), {input({4, 3}, 1), input({4, 3}, 2)})
}

TEST_CASE("elu's and gelu's gradients are finite where e^x overflows") {
  Tensor x = array<float>({100, -100, 0.5f});
  x.attach_grad();
  {
    autograd::record rec;
    Tensor y = sum(elu(x) + gelu(x));
    y.backward();
  }
  const auto g = x.grad().to_vector<float>();
  CHECK(g[0] == doctest::Approx(2));
  CHECK(std::abs(g[1]) < 1e-30);  // e^-100, a float32 denormal
  // elu's 1 and gelu's Phi(x) + x phi(x) at 0.5.
  CHECK(g[2] == doctest::Approx(1 + 0.6914624613 + 0.5 * 0.3520653268).epsilon(1e-6));
}

TEST_CASE("dropout's gradient follows the mask the forward drew") {
  Tensor x = input({200}, 1, 0.5, 2);
  x.attach_grad();
  Tensor y;
  {
    autograd::record rec;
    y = dropout(x, 0.25);
    y.backward();
  }
  const auto yv = y.to_vector<double>(), g = x.grad().to_vector<double>();
  int dropped = 0;
  for (std::size_t i = 0; i < yv.size(); ++i) {
    CHECK(g[i] == doctest::Approx(yv[i] != 0 ? 1 / 0.75 : 0));
    dropped += yv[i] == 0;
  }
  CHECK(dropped > 20);
  CHECK(dropped < 80);
}

TEST_CASE("backward accumulates over uses, writes or adds to buffers, and rejects what was not recorded") {
  Tensor x = array<double>({1, 2, 3});
  x.attach_grad();
  {
    autograd::record rec;
    Tensor y = x * x + x;  // x used three times
    y.backward();
  }
  CHECK(x.grad().to_vector<double>() == std::vector<double>{3, 5, 7});
  {
    autograd::record rec;
    Tensor y = x * 2;
    y.backward();
  }
  CHECK(x.grad().to_vector<double>() == std::vector<double>{2, 2, 2});  // "write" replaces

  Tensor z = array<double>({1, 2});
  z.attach_grad("add");
  for (int i = 0; i < 2; ++i) {
    autograd::record rec;
    Tensor y = z * 3;
    y.backward();
  }
  CHECK(z.grad().to_vector<double>() == std::vector<double>{6, 6});
  {
    autograd::record rec;
    Tensor y = x.astype(DType::float32) * 4;  // through a conversion and back to x's dtype
    y.backward();
  }
  CHECK(x.grad().dtype() == DType::float64);
  CHECK(x.grad().to_vector<double>() == std::vector<double>{4, 4, 4});

  Tensor plain = array<double>({1, 2});
  CHECK_THROWS_WITH_AS(plain.backward(), doctest::Contains("was not recorded"), ValueError);
  CHECK_THROWS_WITH_AS(plain.grad(), doctest::Contains("attach_grad"), ValueError);
  Tensor outside = x * 2;  // not inside record: nothing is taped
  CHECK_THROWS_WITH_AS(outside.backward(), doctest::Contains("was not recorded"), ValueError);
  {
    autograd::record rec;
    Tensor y = x * 2;
    CHECK_THROWS_WITH_AS(y.backward(ones({2})), doctest::Contains("does not match head of shape (3,)"), ShapeError);
  }
}

TEST_CASE("pause stops recording; detach cuts the graph") {
  Tensor x = array<double>({1, 2});
  x.attach_grad();
  autograd::record rec;
  Tensor y;
  {
    autograd::pause p;
    CHECK_FALSE(autograd::is_recording());
    y = x * 5;
  }
  CHECK(autograd::is_recording());
  CHECK_FALSE(autograd::requires_grad(y));
  Tensor z = x.detach() * 2 + x;
  z.backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{1, 1});
}

namespace {
struct SmallNet : nn::HybridBlock<SmallNet> {
  nn::Parameter w1, b1, w2;
  SmallNet()
      : HybridBlock("smallnet"),
        w1(register_parameter("w1", {4, 3}, DType::float64)),
        b1(register_parameter("b1", {4}, DType::float64)),
        w2(register_parameter("w2", {2, 4}, DType::float64)) {}
  template <class F>
  F hybrid_forward(const F& x) {
    F h = tanh(fully_connected(x, w1.as<F>(), b1.as<F>()));
    return F(fully_connected(h, w2.as<F>()) * 2 + sum(h, 1, true));
  }
};

std::vector<std::vector<double>> gradients_of(nn::HybridBase& net, const Tensor& x, const Tensor& label) {
  {
    autograd::record rec;
    Tensor loss = nn::SoftmaxCrossEntropyLoss{}(net(x), label);
    loss.backward();
  }
  std::vector<std::vector<double>> g;
  for (const auto& p : net.collect_params()) g.push_back(p.grad().to_vector<double>());
  return g;
}
}  // namespace

TEST_CASE("a hybridized block's backward is its compiled gradient graph and equals the eager one") {
  SmallNet net;
  net.initialize(nn::init::Normal(0.5));
  const Tensor x = input({5, 3}, 1), label = array<double>({0, 1, 1, 0, 1});
  const auto eager = gradients_of(net, x, label);
  net.hybridize();
  const auto hybrid = gradients_of(net, x, label);
  const auto again = gradients_of(net, x, label);
  REQUIRE(eager.size() == 3);
  for (std::size_t k = 0; k < eager.size(); ++k) {
    CHECK(max_rel_diff(hybrid[k], eager[k]) < 1e-12);
    CHECK(hybrid[k] == again[k]);
  }
  CHECK(net.captured() == 1);

  // Dropout inside a hybridized block: the backward reads the forward's
  // saved values and recomputes nothing, so it sees the mask the forward drew.
  nn::HybridSequential seq;
  seq.add(nn::Dense(6, "relu", 4), nn::Dropout(0.5), nn::Dense(2, "", 6));
  seq.initialize(nn::init::Normal(0.5));
  seq.hybridize();
  Tensor xin = input({8, 4}, 2).astype(DType::float32);
  xin.attach_grad();
  {
    autograd::record rec;
    Tensor out = seq(xin);
    out.backward();
  }
  bool any = false;
  for (float v : xin.grad().to_vector<float>()) {
    CHECK(std::isfinite(v));
    any = any || v != 0;
  }
  CHECK(any);
  const Symbol d = sym::var("data", Shape{8, 4});
  const graph::Graph g = graph::trace({Symbol(dropout(relu(d), 0.5) * 3)});
  const autograd::TrainingGraphs pair = autograd::training_graphs(g, {true});
  CHECK(pair.saved >= 1);
  for (const auto& n : pair.backward.nodes) CHECK(n.op != "dropout");
  CHECK(pair.forward.outputs.size() == 1 + pair.saved);

  // relu's gradient reads its result, so in training too a product keeps the
  // relu as its epilogue and the forward saves no pre-activation.
  const Symbol features = sym::var("x", Shape{8, 4}), weight = sym::var("w", Shape{6, 4}), bias = sym::var("b", Shape{6});
  const autograd::TrainingGraphs dense =
      autograd::training_graphs(graph::trace({relu(fully_connected(features, weight, bias))}), {true, true, true});
  const std::string forward = graph::to_string(graph::optimize(dense.forward));
  CHECK_MESSAGE(forward.find("fully_connected(%0, %1, %2) epilogue[relu($0)]") != std::string::npos, forward);
}

TEST_CASE("BatchNorm trains on batch statistics and moves its running statistics, eagerly and hybridized alike") {
  auto make = [] {
    auto net = std::make_shared<nn::HybridSequential>();
    net->add(nn::Conv2D(3, 3, 1, 1, 1, 1, "", true, 2, DType::float64),
             nn::BatchNorm(1, 0.8, 1e-5, true, true, 3, DType::float64), nn::Dense(2, "", 75, true, DType::float64));
    net->initialize(nn::init::Normal(0.5));
    return net;
  };
  const Tensor x = input({4, 2, 5, 5}, 3), label = array<double>({0, 1, 1, 0});
  auto eager = make(), hybrid = make();
  for (const auto& [key, p] : eager->structured_params()) {
    for (const auto& [other, q] : hybrid->structured_params())
      if (key == other) nn::Parameter(q).set_data(p.data().copy());
  }
  hybrid->hybridize();
  std::vector<std::vector<double>> grads[2], running[2];
  for (int k = 0; k < 2; ++k) {
    auto& net = k == 0 ? *eager : *hybrid;
    for (int step = 0; step < 2; ++step) {
      autograd::record rec;
      Tensor loss = nn::SoftmaxCrossEntropyLoss{}(net(x), label);
      loss.backward();
    }
    for (const auto& [key, p] : net.structured_params()) {
      if (p.grad_req() == "null") running[k].push_back(p.data().to_vector<double>());
      else grads[k].push_back(p.grad().to_vector<double>());
    }
  }
  REQUIRE(running[0].size() == 2);
  // Two steps from mean 0 / var 1 with momentum 0.8: the statistics moved.
  CHECK(running[0][0] != std::vector<double>(3, 0.0));
  for (std::size_t i = 0; i < running[0].size(); ++i) CHECK(max_rel_diff(running[0][i], running[1][i]) < 1e-12);
  for (std::size_t i = 0; i < grads[0].size(); ++i) {
    CAPTURE(i);
    CAPTURE(grads[0][i]);
    CAPTURE(grads[1][i]);
    CHECK(max_rel_diff(grads[0][i], grads[1][i]) < 1e-10);
  }

  // The training form against its definition, element by element, and its
  // gradients against central differences of the block itself.
  {
    nn::BatchNorm bn(1, 0.9, 1e-3, true, true, 3, DType::float64);
    bn.initialize();
    bn.gamma().set_data(array<double>({0.5, -1.5, 2}));
    bn.beta().set_data(array<double>({0.25, 0, -1}));
    const Tensor xb = input({2, 3, 2, 3}, 5), head = input({2, 3, 2, 3}, 9, 0.5, 1.5);
    const auto v = xb.to_vector<double>();
    const double gamma[] = {0.5, -1.5, 2}, beta[] = {0.25, 0, -1};
    std::vector<double> expected(v.size());
    for (std::size_t c = 0; c < 3; ++c) {
      auto at = [&](std::size_t n, std::size_t i) { return n * 18 + c * 6 + i; };
      double m = 0, var = 0;
      for (std::size_t n = 0; n < 2; ++n)
        for (std::size_t i = 0; i < 6; ++i) m += v[at(n, i)] / 12;
      for (std::size_t n = 0; n < 2; ++n)
        for (std::size_t i = 0; i < 6; ++i) var += (v[at(n, i)] - m) * (v[at(n, i)] - m) / 12;
      for (std::size_t n = 0; n < 2; ++n)
        for (std::size_t i = 0; i < 6; ++i)
          expected[at(n, i)] = (v[at(n, i)] - m) / std::sqrt(var + 1e-3) * gamma[c] + beta[c];
    }
    Tensor leaf = xb.copy();
    leaf.attach_grad();
    Tensor y;
    {
      autograd::record rec;
      y = bn(leaf);
      Tensor(y * head).backward();
    }
    CHECK(max_rel_diff(y.to_vector<double>(), expected) < 1e-12);
    auto trained = [&](std::vector<Tensor> in) {
      autograd::train_mode train;
      bn.gamma().set_data(in[1]);
      bn.beta().set_data(in[2]);
      return bn(in[0]);
    };
    const std::vector<Tensor> point{xb, array<double>({0.5, -1.5, 2}), array<double>({0.25, 0, -1})};
    const Tensor dgamma = bn.gamma().grad().copy(), dbeta = bn.beta().grad().copy();
    CHECK(max_rel_diff(leaf.grad().to_vector<double>(), numeric_gradient(trained, point, 0, head)) < 1e-6);
    CHECK(max_rel_diff(dgamma.to_vector<double>(), numeric_gradient(trained, point, 1, head)) < 1e-6);
    CHECK(max_rel_diff(dbeta.to_vector<double>(), numeric_gradient(trained, point, 2, head)) < 1e-6);
    // The op the block's training form is made of names what does not fit.
    const Tensor c3 = array<double>({1, 1, 1}), c2 = array<double>({1, 1});
    CHECK_THROWS_WITH_AS(batch_norm_training(xb, c3, c3, c2, c3), doctest::Contains("mean of shape (2,)"), ShapeError);
    CHECK_THROWS_WITH_AS(batch_norm_training(xb, c3, c3, c3, c3, 0.0), doctest::Contains("eps 0 must be positive"),
                         ValueError);
    CHECK_THROWS_WITH_AS(batch_norm_training(xb, c3, c3, c3, c3, 1e-5, 4), doctest::Contains("axis"), Error);
  }

  // The batch mean of the first channel after one eager step from zero: 0.2 * batch mean.
  auto fresh = make();
  Tensor conv_out = (*fresh->children()[0])(x);
  const double batch_mean = mean(slice(conv_out, 1, 0, 1)).item<double>();
  {
    autograd::train_mode train;
    (*fresh)(x);
  }
  auto bn = std::dynamic_pointer_cast<nn::BatchNorm>(fresh->children()[1]);
  CHECK(bn->running_mean().data().to_vector<double>()[0] == doctest::Approx(0.2 * batch_mean));
  // Predicting uses the running statistics, so it differs from training mode.
  CHECK(max_rel_diff((*fresh)(x), [&] {
          autograd::train_mode train;
          return (*fresh)(x);
        }()) > 1e-3);
}
