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

// MobileNet v2's ReLU6 and SqueezeNet's ceil-mode pooling, as MXNet's model zoo exports them.
class Relu6Pool : public nn::HybridBlock<Relu6Pool> {
 public:
  Relu6Pool() : HybridBlock("relu6pool") {}
  template <class F>
  F hybrid_forward(const F& x) {
    return max_pool2d(relu6(x * 4), 3, 2, 0, PoolingConvention::full);
  }
};

TEST_CASE("clip and pooling_convention full: MXNet's spellings both ways") {
  ScratchDir dir;
  Tensor x = random_normal({1, 2, 8, 7});
  Relu6Pool block;
  block.hybridize();
  Tensor want = block(x);
  CHECK(want.shape() == Shape{1, 2, 4, 3});
  block.export_model(dir / "r");
  const std::string json = slurp(dir / "r-symbol.json");
  for (const char* text : {"_maximum_scalar", "_minimum_scalar", "\"pooling_convention\": \"full\""})
    CHECK_MESSAGE(json.find(text) != std::string::npos, text);
  CHECK(same_values(nn::SymbolBlock::imports(dir / "r-symbol.json", {"data"})(x), want));

  // MXNet's own clip node.
  const auto write = [&](const std::string& name, const std::string& pooling_attrs) {
    std::ofstream(dir / name) << R"j({"nodes": [{"op": "null", "name": "data", "inputs": []},
      {"op": "_mul_scalar", "name": "times4", "attrs": {"scalar": "4"}, "inputs": [[0, 0, 0]]},
      {"op": "clip", "name": "relu6", "attrs": {"a_min": "0", "a_max": "6"}, "inputs": [[1, 0, 0]]},
      {"op": "Pooling", "name": "pool", "attrs": {)j" << pooling_attrs << R"j(}, "inputs": [[2, 0, 0]]}],
      "arg_nodes": [0], "heads": [[3, 0, 0]], "attrs": {"mxnet_version": ["int", 10901]}})j";
    return dir / name;
  };
  const std::string pooling =
      R"j("kernel": "(3, 3)", "stride": "(2, 2)", "pool_type": "max", "pooling_convention": "full")j";
  CHECK(same_values(nn::SymbolBlock::imports(write("clip.json", pooling), {"data"})(x), want));
  // An attr no reader asks for would be ignored: it is refused, naming the node, the op and the attr.
  CHECK_NOTHROW(nn::SymbolBlock::imports(write("cudnn.json", pooling + R"j(, "cudnn_off": "True")j"), {"data"}));
  const std::string lp_norm = pooling + R"j(, "p_value": "2")j";
  CHECK_THROWS_WITH_AS(nn::SymbolBlock::imports(write("p.json", lp_norm), {"data"}),
                       doctest::Contains("node 3 'pool' (Pooling): attr 'p_value' = '2' is not supported"),
                       io::FormatError);
  const std::string lp = R"j("kernel": "(3, 3)", "pool_type": "lp")j";
  CHECK_THROWS_WITH_AS(nn::SymbolBlock::imports(write("lp.json", lp), {"data"}),
                       doctest::Contains("node 3 'pool' (Pooling): pool_type 'lp' is not supported (max or avg)"),
                       io::FormatError);
}

TEST_CASE("an imported model's attrs are all read: MXNet's Dropout mode and axes, Concat's num_args") {
  ScratchDir dir;
  const auto write = [&](const std::string& op, const std::string& attrs, int inputs) {
    std::string in;
    for (int k = 0; k < inputs; ++k) in += std::string(k ? ", " : "") + "[0, 0, 0]";
    std::ofstream(dir / "m.json") << R"j({"nodes": [{"op": "null", "name": "data", "inputs": []}, {"op": ")j" << op
                                  << R"j(", "name": "n", "attrs": {)j" << attrs << R"j(}, "inputs": [)j" << in
                                  << R"j(]}], "arg_nodes": [0], "heads": [[1, 0, 0]], "attrs": {}})j";
    return nn::SymbolBlock::imports(dir / "m.json", {"data"});
  };
  const std::string training = R"j("p": "0.5", "mode": "training", "axes": "()", "cudnn_off": "False")j";
  CHECK_NOTHROW(write("Dropout", training, 1));
  const std::string always = R"j("p": "0.5", "mode": "always")j", axes = R"j("axes": "(2, 3)")j";
  CHECK_THROWS_WITH_AS(
      write("Dropout", always, 1),
      doctest::Contains("node 1 'n' (Dropout): attr 'mode' = 'always' is not supported (only 'training')"),
      io::FormatError);
  CHECK_THROWS_WITH_AS(write("Dropout", axes, 1), doctest::Contains("attr 'axes' = '(2, 3)' is not supported"),
                       io::FormatError);
  const std::string two = R"j("dim": "1", "num_args": "2")j", three = R"j("dim": "1", "num_args": "3")j";
  CHECK_NOTHROW(write("Concat", two, 2));
  CHECK_THROWS_WITH_AS(write("Concat", three, 2), doctest::Contains("(Concat): attr 'num_args' does not match its 2 inputs"),
                       io::FormatError);
  const std::string half = R"j("axis": "-1", "dtype": "float16")j", low_only = R"j("a_min": "0")j";
  CHECK_THROWS_WITH_AS(write("softmax", half, 1), doctest::Contains("(softmax): attr 'dtype' = 'float16' is not supported"),
                       io::FormatError);
  CHECK_THROWS_WITH_AS(write("clip", low_only, 1), doctest::Contains("(clip): attrs 'a_min' and 'a_max' are needed"),
                       io::FormatError);
}

// A wrong answer once came from a first call only (resnet18_v2 of MXNet's
// zoo: a constant made at import time, read before it was written), and
// only in some runs: first calls of fresh imports and of freshly hybridized
// copies are repeated here, each against the eager answer, on the threaded
// engine (its race) with several threads per op.
TEST_CASE("first calls of fresh imports and fresh hybridizations, many times, give the eager answer") {
  ScratchDir dir;
  hybra::seed(11);
  auto model = nn::model_zoo::resnet18(10, 4);
  model.initialize(nn::init::Xavier());
  const Tensor x = random_normal({2, 1, 28, 28});
  model(x);
  for (nn::Parameter p : model.collect_params()) {
    const std::string name = p.name();
    // gamma stays 1, so that the file's BatchNorms may say fix_gamma=True (constants made by the import).
    if (name.ends_with("running_mean")) p.set_data(random_uniform(p.data().shape(), -0.5, 0.5));
    if (name.ends_with("running_var")) p.set_data(random_uniform(p.data().shape(), 0.5, 2));
    if (name.ends_with("beta")) p.set_data(random_uniform(p.data().shape(), -0.2, 0.2));
  }
  const Tensor want = model(x);
  model.save_parameters(dir / "resnet.params");
  model.hybridize();
  model(x);
  model.export_model(dir / "resnet");
  std::string json = slurp(dir / "resnet-symbol.json");
  const std::string learnt = "\"fix_gamma\": \"False\"";
  int fixed = 0;
  for (auto at = json.find(learnt); at != std::string::npos; at = json.find(learnt, at), ++fixed)
    json.replace(at, learnt.size(), "\"fix_gamma\": \"True\"");
  CHECK(fixed == 17);
  std::ofstream(dir / "fixed-symbol.json") << json;
  const auto close = [&](const Tensor& got) { return test::max_rel_diff(got, want) < 1e-5; };
  int wrong_imports = 0, wrong_hybridized = 0;
  for (int k = 0; k < 12; ++k) {
    auto imported = nn::SymbolBlock::imports(dir / "fixed-symbol.json", {"data"}, dir / "resnet-0000.params");
    wrong_imports += !close(imported(x));
    auto copy = nn::model_zoo::resnet18(10, 4);
    copy.load_parameters(dir / "resnet.params");
    copy.hybridize();
    wrong_hybridized += !close(copy(x));
  }
  CHECK(wrong_imports == 0);
  CHECK(wrong_hybridized == 0);
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
