// Model files: export_model writes the captured graph and its parameters in
// MXNet's formats, SymbolBlock::imports runs them with none of the model's
// code (same numbers, re-optimised), save/load_parameters move weights
// between blocks by names that survive wrapping. Every op of the registry
// has an MXNet spelling.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <hybra/hybra.hpp>
#include <string>

#include "reference.hpp"

using namespace hybra;
namespace nn = hybra::nn;
namespace fs = std::filesystem;

namespace {

using test::ScratchDir;

std::string slurp(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

bool same_values(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && a.to_vector<double>() == b.to_vector<double>();
}

nn::HybridSequential small_mlp() {
  nn::HybridSequential net;
  net.add(nn::Dense(8, "relu"), nn::Dense(3));
  net.initialize();
  return net;
}

// Arithmetic with scalars on both sides, a comparison and a reduction: the
// MXNet spellings of the elementwise ops (broadcast_*, _*_scalar, _r*_scalar).
class ScalarMath : public nn::HybridBlock<ScalarMath> {
 public:
  ScalarMath() : HybridBlock("scalarmath") {}
  template <class F>
  F hybrid_forward(const F& x) {
    F y = relu(x * 2 - 1) / (3 - x) + (x > 0.5) + (1 < x) + pow(2, x);
    return softmax(sum(y, 1, true) * y, -1);
  }
};

}  // namespace

TEST_CASE("export_model writes MXNet's symbol JSON and NDArray-list params") {
  ScratchDir dir;
  auto net = small_mlp();
  CHECK_THROWS_WITH_AS(net.export_model(dir / "m"), doctest::Contains("no graph has been captured"), ValueError);
  net.hybridize();
  net(random_normal({2, 5}));
  net.export_model(dir / "m", 7);
  const std::string json = slurp(dir / "m-symbol.json");
  for (const char* key : {"\"nodes\"", "\"arg_nodes\"", "\"node_row_ptr\"", "\"heads\"", "\"mxnet_version\"",
                          "\"FullyConnected\"", "\"num_hidden\": \"8\"", "\"relu\""})
    CHECK_MESSAGE(json.find(key) != std::string::npos, key);
  auto params = io::load_ndarray_list(dir / "m-0007.params");
  REQUIRE(params.size() == 4);
  CHECK(params[0].first == net.collect_params().keys()[0].insert(0, "arg:"));
  CHECK(same_values(params[0].second, net.collect_params()[net.collect_params().keys()[0]].data()));
}

TEST_CASE("an exported model imports with the same outputs and re-optimised plan") {
  ScratchDir dir;
  auto net = small_mlp();
  net.hybridize();
  Tensor x = random_normal({4, 5});
  Tensor want = net(x);
  net.export_model(dir / "m");

  auto imported = nn::SymbolBlock::imports(dir / "m-symbol.json", {"data"}, dir / "m-0000.params");
  CHECK(imported.hybridized());
  CHECK(same_values(imported(x), want));
  CHECK(imported.input_names() == std::vector<std::string>{"data"});
  CHECK(imported.output_names().size() == 1);
  CHECK(imported.plan().graph().nodes.size() < imported.graph().nodes.size());  // bias + relu fused away
  CHECK(imported.collect_params().keys() == net.collect_params().keys());

  imported.hybridize(false);  // the interpreter gives the same numbers
  CHECK(same_values(imported(x), want));
  // A new batch size is a new signature: captured again.
  CHECK(imported(random_normal({1, 5})).shape() == Shape{1, 3});
}

TEST_CASE("scalar arithmetic, comparisons and reductions round-trip through the MXNet dialect") {
  ScratchDir dir;
  ScalarMath block;
  block.hybridize();
  Tensor x = random_uniform({3, 4}, -1, 2);
  Tensor want = block(x);
  block.export_model(dir / "s");
  const std::string json = slurp(dir / "s-symbol.json");
  for (const char* op : {"_mul_scalar", "_minus_scalar", "_rminus_scalar", "broadcast_div", "_greater_scalar",
                         "_rpower_scalar", "\"sum\"", "broadcast_mul", "softmax"})
    CHECK_MESSAGE(json.find(op) != std::string::npos, op);
  auto imported = nn::SymbolBlock::imports(dir / "s-symbol.json", {"data"}, dir / "s-0000.params");
  const auto a = imported(x).to_vector<double>(), b = want.to_vector<double>();
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-6));
}

TEST_CASE("every op of the graph registry has an MXNet spelling") {
  for (const auto& def : graph::detail::op_defs())
    if (!def.gradient_only) CHECK_MESSAGE(io::mxnet_exportable(def.name), def.name);
}

TEST_CASE("an imported SymbolBlock composes with other blocks and is captured with them") {
  ScratchDir dir;
  auto net = small_mlp();
  net.hybridize();
  Tensor x = random_normal({2, 5});
  net(x);
  net.export_model(dir / "m");

  nn::HybridSequential outer;
  outer.add(std::make_shared<nn::SymbolBlock>(nn::SymbolBlock::imports(dir / "m-symbol.json", {"data"}, dir / "m-0000.params")),
            nn::Dense(2));
  outer.initialize();
  Tensor eager = outer(x);
  outer.hybridize();
  CHECK(same_values(outer(x), eager));
}

TEST_CASE("a SymbolBlock built from symbols: several inputs and outputs, by name") {
  Symbol a = sym::var("a"), b = sym::var("b");
  Symbol w = sym::var("w", Shape{3}, DType::float32);
  nn::SymbolBlock block({a * w + b, a - b}, {"a", "b"});
  block.collect_params()["w"].set_data(array<float>({1, 2, 3}));
  auto out = block({array<float>({1, 1, 1}), array<float>({0, 1, 2})});
  REQUIRE(out.size() == 2);
  CHECK(out[0].to_vector<float>() == std::vector<float>{1, 3, 5});
  CHECK(out[1].to_vector<float>() == std::vector<float>{1, 0, -1});
  block.hybridize();
  CHECK(block({array<float>({1, 1, 1}), array<float>({0, 1, 2})})[0].to_vector<float>() == std::vector<float>{1, 3, 5});
  CHECK_THROWS_WITH_AS(block(array<float>({1})), doctest::Contains("takes 2 inputs (a, b), not 1"), ValueError);
  CHECK_THROWS_WITH_AS(nn::SymbolBlock({a * w}, {"a", "nope"}), doctest::Contains("input 'nope' is not a var"), ValueError);
  CHECK_THROWS_WITH_AS(nn::SymbolBlock({a * b}, {"a"}), doctest::Contains("var 'b' is not an input"), ValueError);
}

TEST_CASE("imports names what is wrong with a model and its parameter file") {
  ScratchDir dir;
  auto net = small_mlp();
  net.hybridize();
  net(random_normal({1, 5}));
  net.export_model(dir / "m");
  const std::string json = dir / "m-symbol.json", params = dir / "m-0000.params";
  CHECK_THROWS_WITH_AS(nn::SymbolBlock::imports(json, {"input"}, params), doctest::Contains("var 'data' is neither an input (input)"),
                       ValueError);
  CHECK_THROWS_WITH_AS(nn::SymbolBlock::imports(dir / "none.json", {"data"}, params), doctest::Contains("none.json"), Error);

  // A parameter file of another model: the names do not match.
  auto other = small_mlp();
  other.hybridize();
  other(random_normal({1, 5}));
  other.export_model(dir / "other");
  CHECK_THROWS_WITH_AS(nn::SymbolBlock::imports(json, {"data"}, dir / "other-0000.params"),
                       doctest::Contains("nor in the parameter file"), ValueError);

  // An op hybra does not have.
  std::string text = slurp(json);
  text.replace(text.find("FullyConnected"), 14, "LeakyReLU");
  std::ofstream(dir / "unknown-symbol.json") << text;
  CHECK_THROWS_WITH_AS(nn::SymbolBlock::imports(dir / "unknown-symbol.json", {"data"}, params),
                       doctest::Contains("op 'LeakyReLU' is not supported by hybra"), io::FormatError);
}

TEST_CASE("save_parameters and load_parameters: structured names that survive wrapping") {
  ScratchDir dir;
  auto net = small_mlp();
  Tensor x = random_normal({2, 5});
  Tensor want = net(x);
  std::vector<std::string> keys;
  for (const auto& [key, p] : net.structured_params()) keys.push_back(key);
  CHECK(keys == std::vector<std::string>{"dense0.weight", "dense0.bias", "dense1.weight", "dense1.bias"});
  net.save_parameters(dir / "net.params");

  // The same architecture, wrapped in another block: its prefixes differ.
  nn::HybridSequential outer;
  auto inner = std::make_shared<nn::HybridSequential>();
  inner->add(nn::Dense(8, "relu"), nn::Dense(3));
  outer.add(inner);
  inner->load_parameters(dir / "net.params");
  CHECK(same_values(outer(x), want));

  // The exported .params (full names, arg:) load into the block that wrote them.
  net.hybridize();
  net(x);
  net.export_model(dir / "m");
  auto again = small_mlp();
  CHECK_THROWS_WITH_AS(again.load_parameters(dir / "m-0000.params"), doctest::Contains("has no parameter"), ValueError);
  net.load_parameters(dir / "m-0000.params");

  nn::HybridSequential bigger;
  bigger.add(nn::Dense(8, "relu"), nn::Dense(3), nn::Dense(4));
  bigger.initialize();
  CHECK_THROWS_WITH_AS(bigger.load_parameters(dir / "net.params"), doctest::Contains("has no parameter 'dense2.weight'"),
                       ValueError);
  bigger.load_parameters(dir / "net.params", cpu(), true);
  nn::HybridSequential smaller;
  smaller.add(nn::Dense(8, "relu"));
  CHECK_THROWS_WITH_AS(smaller.load_parameters(dir / "net.params"), doctest::Contains("'dense1.weight', which block"),
                       ValueError);
  smaller.load_parameters(dir / "net.params", cpu(), false, true);
  nn::HybridSequential wrong;
  wrong.add(nn::Dense(7, "relu"), nn::Dense(3));
  CHECK_THROWS_WITH_AS(wrong.load_parameters(dir / "net.params"), doctest::Contains("net.params"), ShapeError);
}

TEST_CASE("save_parameters of a data-parallel block: one set of names, loaded onto any devices") {
  ScratchDir dir;
  const std::vector<Device> two{cpu(0), cpu(1)};
  auto mlp = [] {
    nn::HybridSequential net;
    net.add(nn::Dense(8, "relu", 5), nn::Dense(3, "", 8));
    return net;
  };
  auto trained = mlp();
  trained.initialize(nn::init::Normal(0.5), two);
  // A step moves both copies the same way (the file must hold trained values, not the initial ones).
  Trainer trainer(trained.collect_params(), "sgd", {{"learning_rate", 0.1}});
  const Tensor x = random_normal({4, 5});
  auto xs = split_and_load(x, two);
  std::vector<Tensor> losses;
  {
    autograd::record rec;
    for (const auto& part : xs) losses.push_back(sum(trained(part) * trained(part)));
  }
  for (auto& l : losses) l.backward();
  trainer.step(4);
  trained.save_parameters(dir / "dp.params");

  std::vector<std::string> keys;
  for (const auto& [key, value] : io::load_ndarray_list(dir / "dp.params")) keys.push_back(key);
  CHECK(keys == std::vector<std::string>{"dense0.weight", "dense0.bias", "dense1.weight", "dense1.bias"});

  auto on_two = mlp();
  on_two.initialize(nn::init::Zero(), two);
  on_two.load_parameters(dir / "dp.params");
  auto on_one = mlp();
  on_one.initialize(nn::init::Zero());
  on_one.load_parameters(dir / "dp.params");
  const auto saved = trained.structured_params();
  const auto loaded_one = on_one.structured_params(), loaded_two = on_two.structured_params();
  for (std::size_t k = 0; k < saved.size(); ++k) {
    CHECK(same_values(loaded_one[k].second.data(), saved[k].second.data()));
    CHECK(loaded_two[k].second.devices() == two);
    for (auto d : two) CHECK(same_values(loaded_two[k].second.data(d).to(cpu()), saved[k].second.data()));
  }
  CHECK(test::max_rel_diff(on_two(x.to(cpu(1))).to(cpu()), trained(x)) < 1e-6);
}

TEST_CASE("models MXNet 1.9.1 exported run in hybra with MXNet's outputs") {
  const std::string dir = std::string(HYBRA_TEST_DATA_DIR) + "/mxnet_models/";
  for (const std::string name : {"mlp", "convnet"}) {
    CAPTURE(name);
    auto net = nn::SymbolBlock::imports(dir + name + "-symbol.json", {"data"}, dir + name + "-0000.params");
    Tensor input, want;
    for (auto& [key, value] : io::load_ndarray_list(dir + name + "-io.params")) (key == "input" ? input : want) = value;
    const auto got = net(input).to_vector<double>(), expected = want.to_vector<double>();
    REQUIRE(got.size() == expected.size());
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(expected[i]).epsilon(1e-5));
    net.hybridize(false);
    const auto eager = net(input).to_vector<double>();
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(eager[i] == doctest::Approx(expected[i]).epsilon(1e-5));
  }
}
