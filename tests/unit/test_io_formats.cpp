// Model files, byte level: MXNet's NDArray lists (.params) and symbol JSON,
// checked against files MXNet 1.9.1 wrote (tests/data/mxnet/), every way a
// file can be malformed, and atomic writing when the disk fills up.
#include <doctest/doctest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <hybra/eager.hpp>
#include <hybra/io/ndarray_list.hpp>
#include <hybra/io/symbol_json.hpp>
#include <limits>
#include <string>
#include <vector>

#include "reference.hpp"

using namespace hybra;
using namespace hybra::io;
namespace fs = std::filesystem;
using doctest::Contains;

namespace {

fs::path fixture(const std::string& name) { return fs::path(HYBRA_TEST_DATA_DIR) / "mxnet" / name; }

using test::ScratchDir;

// Little-endian bytes, for building files by hand.
struct Bytes {
  std::string s;
  template <class T>
  Bytes& put(T v) {
    char raw[sizeof(T)];
    std::memcpy(raw, &v, sizeof(T));
    s.append(raw, sizeof(T));
    return *this;
  }
  Bytes& u32(std::uint32_t v) { return put(v); }
  Bytes& i32(std::int32_t v) { return put(v); }
  Bytes& u64(std::uint64_t v) { return put(v); }
  Bytes& i64(std::int64_t v) { return put(v); }
  Bytes& text(std::string_view t) {
    s += t;
    return *this;
  }
};

// A V2 dense array: magic, storage, shape, cpu(0), dtype code, then `values`.
Bytes v2_array(const std::vector<std::int64_t>& shape, std::int32_t code, std::string_view values) {
  Bytes b;
  b.u32(ndarray_v2_magic).i32(0).i32(static_cast<std::int32_t>(shape.size()));
  for (auto d : shape) b.i64(d);
  b.i32(1).i32(0).i32(code).text(values);
  return b;
}
std::string float_bytes(std::initializer_list<float> values) {
  Bytes b;
  for (float v : values) b.put(v);
  return b.s;
}
// A list file holding `arrays` (already encoded) and `names`.
std::string list_file(const std::vector<Bytes>& arrays, const std::vector<std::string>& names) {
  Bytes b;
  b.u64(ndarray_list_magic).u64(0).u64(arrays.size());
  for (const auto& a : arrays) b.text(a.s);
  b.u64(names.size());
  for (const auto& n : names) b.u64(n.size()).text(n);
  return b.s;
}
// A file holding just `array`, named "w".
std::string one_array(const Bytes& array) { return list_file({array}, {"w"}); }

std::vector<ArrayRecord> parse_params(const std::string& bytes) { return parse_ndarray_list(bytes, "x.params"); }

}  // namespace

// ---------------------------------------------------------------- .params

TEST_CASE("io: MXNet-written .params files load with their names, shapes, dtypes and values") {
  auto all = load_ndarray_list(fixture("all_dtypes.params"));
  REQUIRE(all.size() == 5);
  CHECK(all[0].first == "f32");
  CHECK(all[0].second.shape() == Shape{2, 3});
  CHECK(all[0].second.dtype() == DType::float32);
  CHECK(all[0].second.to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4, 5});
  CHECK(all[1].first == "f64");
  CHECK(all[1].second.to_vector<double>() == std::vector<double>{0.5, -1.25});
  CHECK(all[2].first == "i32");
  CHECK(all[2].second.to_vector<std::int32_t>() == std::vector<std::int32_t>{-7, 0, 2147483647});
  CHECK(all[3].first == "i64");
  CHECK(all[3].second.to_vector<std::int64_t>() == std::vector<std::int64_t>{-(std::int64_t{1} << 40), 3});
  CHECK(all[4].first == "u8");
  CHECK(all[4].second.shape() == Shape{1, 2});
  CHECK(all[4].second.to_vector<std::uint8_t>() == std::vector<std::uint8_t>{0, 255});
  const auto half = load_ndarray_list(fixture("float16.params"));
  REQUIRE(half.size() == 1);
  CHECK(half[0].second.dtype() == DType::float16);
  CHECK(half[0].second.to_vector<double>() == std::vector<double>{1, 0.0999755859375, -65504, INFINITY});

  auto unnamed = load_ndarray_list(fixture("unnamed.params"));
  REQUIRE(unnamed.size() == 2);
  CHECK(unnamed[0].first.empty());
  CHECK(unnamed[1].first.empty());
  CHECK(unnamed[0].second.to_vector<float>() == std::vector<float>{1, 2, 3});
  CHECK(unnamed[1].second.dtype() == DType::int32);

  auto numpy = load_ndarray_list(fixture("numpy_shape.params"));
  REQUIRE(numpy.size() == 2);
  CHECK(numpy[0].first == "scalar");
  CHECK(numpy[0].second.shape() == Shape{});
  CHECK(numpy[0].second.item<double>() == 3.5);
  CHECK(numpy[1].first == "empty");
  CHECK(numpy[1].second.shape() == Shape{2, 0});
  CHECK(numpy[1].second.dtype() == DType::uint8);

  // Gluon's export: "arg:"/"aux:" prefixes, parameter k holds arange(size) / 10 + k.
  auto tiny = load_ndarray_list(fixture("tiny-0000.params"));
  const std::vector<std::string> names = {"arg:dense0_weight", "arg:dense0_bias", "arg:batchnorm0_gamma",
                                          "arg:batchnorm0_beta", "aux:batchnorm0_running_mean",
                                          "aux:batchnorm0_running_var", "arg:dense1_weight", "arg:dense1_bias"};
  REQUIRE(tiny.size() == names.size());
  for (std::size_t k = 0; k < names.size(); ++k) {
    CHECK(tiny[k].first == names[k]);
    auto v = tiny[k].second.to_vector<float>();
    for (std::size_t i = 0; i < v.size(); ++i) CHECK(v[i] == doctest::Approx(static_cast<double>(i) / 10 + k));
  }
  CHECK(tiny[0].second.shape() == Shape{4, 3});
  CHECK(tiny[6].second.shape() == Shape{2, 4});
}

TEST_CASE("io: encode_ndarray_list writes the bytes MXNet writes") {
  for (const char* name : {"all_dtypes.params", "unnamed.params", "numpy_shape.params", "tiny-0000.params",
                           "float16.params"}) {
    CAPTURE(name);
    const auto tensors = load_ndarray_list(fixture(name));
    CHECK(encode_ndarray_list(tensors) == read_file(fixture(name)));
  }
}

TEST_CASE("io: NDArray lists round-trip all five dtypes, views, 0-d and empty arrays") {
  ScratchDir dir;
  const std::vector<std::pair<std::string, Tensor>> tensors = {
      {"f32", array<float>({1.5f, -2.0f, 3.25f, 0.0f, 1e30f, -1e-30f}, Shape{2, 3})},
      {"f64", array<double>({3.141592653589793, -0.0}, Shape{2})},
      {"i32", array<std::int32_t>({-2147483647 - 1, 2147483647, 0}, Shape{3, 1})},
      {"i64", array<std::int64_t>({std::numeric_limits<std::int64_t>::min(), 42}, Shape{1, 2, 1})},
      {"u8", array<std::uint8_t>({0, 1, 254, 255}, Shape{2, 2})},
      // A transposed view is written row-major, as MXNet has no strides.
      {"view", transpose(reshape(arange(0, 6, 1, DType::int32), Shape{2, 3}))},
      {"empty", zeros(Shape{3, 0}, DType::float64)},
  };
  const std::string v2 = encode_ndarray_list(tensors);
  auto magic_of_first = [](const std::string& bytes) {
    std::uint32_t magic;
    std::memcpy(&magic, bytes.data() + 24, 4);
    return magic;
  };
  CHECK(magic_of_first(v2) == ndarray_v2_magic);

  save_ndarray_list(dir.path / "round.params", tensors);
  CHECK(read_file(dir.path / "round.params") == v2);
  CHECK(dir.entries() == std::vector<std::string>{"round.params"});
  const auto loaded = load_ndarray_list(dir.path / "round.params");
  REQUIRE(loaded.size() == tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    CAPTURE(tensors[i].first);
    CHECK(loaded[i].first == tensors[i].first);
    CHECK(loaded[i].second.shape() == tensors[i].second.shape());
    CHECK(loaded[i].second.dtype() == tensors[i].second.dtype());
    CHECK(loaded[i].second.is_contiguous());
    CHECK(loaded[i].second.to_vector<double>() == tensors[i].second.to_vector<double>());
  }
  CHECK(loaded[5].second.to_vector<std::int32_t>() == std::vector<std::int32_t>{0, 3, 1, 4, 2, 5});
  CHECK(loaded[3].second.to_vector<std::int64_t>()[0] == std::numeric_limits<std::int64_t>::min());

  // A 0-d array exists only in MXNet's NumPy shape semantics: the file gets V3 arrays.
  const std::vector<std::pair<std::string, Tensor>> with_scalar = {{"s", full(Shape{}, 2.5, DType::float64)},
                                                                   {"v", array<float>({1.0f, 2.0f})}};
  const std::string v3 = encode_ndarray_list(with_scalar);
  CHECK(magic_of_first(v3) == ndarray_v3_magic);
  const auto records = parse_ndarray_list(v3, "s.params");
  REQUIRE(records.size() == 2);
  CHECK(records[0].shape == Shape{});
  CHECK(records[0].bytes == 8);
  CHECK(records[1].shape == Shape{2});

  // No names at all: a plain list, as mx.nd.save([...]) writes it.
  const std::string unnamed = encode_ndarray_list(std::vector<std::pair<std::string, Tensor>>{{"", ones(Shape{1})}});
  CHECK(parse_params(unnamed)[0].name.empty());
  CHECK(encode_ndarray_list(std::vector<std::pair<std::string, Tensor>>{}).size() == 32);
}

TEST_CASE("io: encode_ndarray_list rejects what MXNet could not read") {
  using List = std::vector<std::pair<std::string, Tensor>>;
  CHECK_THROWS_WITH_AS(encode_ndarray_list(List{{"a", ones(Shape{1})}, {"a", ones(Shape{1})}}),
                       Contains("two tensors are named 'a'"), ValueError);
  CHECK_THROWS_WITH_AS(encode_ndarray_list(List{{"a", Tensor{}}}), Contains("tensor 'a' is empty"), ValueError);
  CHECK_THROWS_WITH_AS(encode_ndarray_list(List{{"m", Tensor(Shape{2}, DType::float32, meta())}}),
                       Contains("tensor 'm' lives on meta"), DeviceError);
  CHECK_THROWS_WITH_AS(encode_ndarray_list(List{{"deep", Tensor(Shape(33, 1))}}),
                       Contains("33 dimensions; MXNet's limit is 32"), ShapeError);
}

TEST_CASE("io: legacy arrays (MXNet before 1.0) are read") {
  // V1: no storage type; before V1: the magic is the ndim and extents are u32.
  // mx.nd.load reads these bytes as the same shapes, dtypes and values.
  Bytes v1;
  v1.u32(ndarray_v1_magic).i32(2).i64(1).i64(2).i32(1).i32(0).i32(0).text(float_bytes({1, 2}));
  Bytes v0;
  v0.u32(3).u32(1).u32(1).u32(2).i32(2).i32(0).i32(4).i32(7).i32(-8);
  const auto records = parse_params(list_file({v1, v0}, {"v1", "v0"}));
  REQUIRE(records.size() == 2);
  CHECK(records[0].shape == Shape{1, 2});
  CHECK(records[0].dtype == DType::float32);
  CHECK(records[1].shape == Shape{1, 1, 2});
  CHECK(records[1].dtype == DType::int32);
  CHECK(records[1].bytes == 8);
}

TEST_CASE("io: every truncation of a .params file is a FormatError with its offset") {
  const std::string good = read_file(fixture("all_dtypes.params"));
  for (std::size_t size = 0; size < good.size(); ++size) {
    CAPTURE(size);
    CHECK_THROWS_WITH_AS(parse_ndarray_list(std::string_view(good).substr(0, size), "all_dtypes.params"),
                         Contains("model file 'all_dtypes.params': offset "), FormatError);
    CHECK_THROWS_WITH_AS(parse_ndarray_list(std::string_view(good).substr(0, size), "all_dtypes.params"),
                         Contains("truncated: "), FormatError);
  }
  CHECK_THROWS_WITH_AS(parse_params(one_array(v2_array({2}, 0, float_bytes({1, 2}))).substr(0, 50)),
                       "model file 'x.params': offset 48: truncated: array 0's device id needs 4 bytes but the "
                       "file ends 2 bytes later",
                       FormatError);
}

TEST_CASE("io: malformed .params files are FormatErrors naming the offset and the problem") {
  const std::string two = float_bytes({1, 2});
  CHECK(parse_params(one_array(v2_array({2}, 0, two)))[0].name == "w");

  Bytes bad_magic;
  bad_magic.u64(0x113).u64(0).u64(0).u64(0);
  CHECK_THROWS_WITH_AS(parse_params(bad_magic.s),
                       "model file 'x.params': offset 0: not an MXNet NDArray file: the list magic is 0x113, not 0x112",
                       FormatError);
  CHECK_THROWS_WITH_AS(parse_params("{\"nodes\": []}"), Contains("offset 0: not an MXNet NDArray file"), FormatError);
  CHECK_THROWS_WITH_AS(parse_params("abc"), "model file 'x.params': offset 0: truncated: the list magic needs 8 bytes but the "
                                     "file ends 3 bytes later",
                       FormatError);

  Bytes unknown;
  unknown.u32(0xDEADBEEF);
  CHECK_THROWS_WITH_AS(parse_params(one_array(unknown)), Contains("offset 24: array 0: unknown array magic 0xDEADBEEF"),
                       FormatError);

  for (auto [storage, text] : {std::pair{1, "sparse storage (row_sparse)"}, std::pair{2, "sparse storage (csr)"},
                               std::pair{7, "unknown storage type 7"}}) {
    Bytes sparse;
    sparse.u32(ndarray_v2_magic).i32(storage).i32(1).i64(2);
    CHECK_THROWS_WITH_AS(parse_params(one_array(sparse)), Contains((std::string("offset 28: array 0: ") + text).c_str()),
                         FormatError);
  }

  Bytes negative_ndim;
  negative_ndim.u32(ndarray_v2_magic).i32(0).i32(-3);
  CHECK_THROWS_WITH_AS(parse_params(one_array(negative_ndim)),
                       Contains("offset 32: array 0: ndim -3 is out of range (0 to 32)"),
                       FormatError);
  Bytes huge_ndim;
  huge_ndim.u32(ndarray_v2_magic).i32(0).i32(33);
  CHECK_THROWS_WITH_AS(parse_params(one_array(huge_ndim)), Contains("ndim 33 is out of range"), FormatError);
  Bytes none_v2;
  none_v2.u32(ndarray_v2_magic).i32(0).i32(0);
  CHECK_THROWS_WITH_AS(parse_params(one_array(none_v2)), Contains("offset 24: array 0 is an uninitialised (none) NDArray"),
                       FormatError);
  Bytes none_v3;
  none_v3.u32(ndarray_v3_magic).i32(0).i32(2).i64(3).i64(-1);
  CHECK_THROWS_WITH_AS(parse_params(one_array(none_v3)), Contains("is an uninitialised (none) NDArray"), FormatError);

  CHECK_THROWS_WITH_AS(parse_params(one_array(v2_array({2, -5}, 0, two))),
                       Contains("offset 44: array 0: extent -5 of axis 1 is negative"), FormatError);
  // Sizes are checked before anything is allocated: an overflowing product,
  // and a product that fits but exceeds the file.
  CHECK_THROWS_WITH_AS(parse_params(one_array(v2_array({std::int64_t{1} << 62, 8}, 0, two))),
                       Contains("offset 32: array 0: shape (4611686018427387904, 8) has more elements than fit in int64"),
                       FormatError);
  CHECK_THROWS_WITH_AS(parse_params(one_array(v2_array({std::int64_t{1} << 61, 2}, 1, two))),
                       Contains("offset 32: array 0: shape (2305843009213693952, 2) of float64 has more bytes than fit "
                                "in 64 bits"),
                       FormatError);
  CHECK_THROWS_WITH_AS(parse_params(one_array(v2_array({std::int64_t{1} << 40, 1 << 10}, 0, two))),
                       Contains("offset 64: truncated: array 0's values ((1099511627776, 1024), float32) need "
                                "4503599627370496 bytes but the file ends 25 bytes later"),
                       FormatError);

  for (auto [code, text] : {std::pair{5, "dtype code 5 (int8) is not supported by hybra"},
                            std::pair{7, "dtype code 7 (bool) is not supported"},
                            std::pair{8, "dtype code 8 (int16) is not supported"},
                            std::pair{11, "dtype code 11 (uint64) is not supported"},
                            std::pair{99, "dtype code 99 is not an MXNet dtype"},
                            std::pair{-1, "dtype code -1 is not an MXNet dtype"}})
    CHECK_THROWS_WITH_AS(parse_params(one_array(v2_array({2}, code, two))),
                         Contains((std::string("offset 52: array 0: ") + text).c_str()),
                         FormatError);

  // The device is not checked, as MXNet does not check it: a gpu(3) array loads.
  Bytes gpu;
  gpu.u32(ndarray_v2_magic).i32(0).i32(1).i64(2).i32(2).i32(3).i32(0).text(two);
  CHECK(parse_params(one_array(gpu))[0].shape == Shape{2});

  const Bytes a = v2_array({2}, 0, two);
  CHECK_THROWS_WITH_AS(parse_params(list_file({a, a}, {"w"})),
                       Contains("offset 104: the file has 1 names for 2 arrays (MXNet writes one name per array, or none)"),
                       FormatError);
  CHECK_THROWS_WITH_AS(parse_params(list_file({a, a}, {"w", "w"})), Contains("name 1 'w' repeats name 0"), FormatError);
  CHECK(parse_params(list_file({a, a}, {})).size() == 2);

  std::string long_name = one_array(a);
  long_name.replace(long_name.size() - 9, 8, std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8));
  CHECK_THROWS_WITH_AS(parse_params(long_name),
                       Contains("offset 72: truncated: name 0 is 9223372036854775807 bytes long but the file ends 1 "
                                "byte later"),
                       FormatError);
  CHECK_THROWS_WITH_AS(parse_params(one_array(a) + "junk"),
                       Contains("offset 81: 4 bytes of trailing garbage after the last name"),
                       FormatError);

  // A count the file cannot hold is rejected before any array is reserved.
  Bytes absurd;
  absurd.u64(ndarray_list_magic).u64(0).u64(std::uint64_t{1} << 61).u64(0);
  CHECK_THROWS_WITH_AS(parse_params(absurd.s),
                       Contains("offset 16: truncated: the file declares 2305843009213693952 arrays"),
                       FormatError);
}

TEST_CASE("io: load_ndarray_list names the file") {
  ScratchDir dir;
  std::string corrupt = read_file(fixture("all_dtypes.params"));
  corrupt[24] = 'x';
  write_file_atomically(dir.path / "corrupt.params", corrupt);
  CHECK_THROWS_WITH_AS(load_ndarray_list(dir.path / "corrupt.params"),
                       Contains(("model file '" + (dir.path / "corrupt.params").string() + "': offset 24: array 0").c_str()),
                       FormatError);
  CHECK_THROWS_WITH_AS(load_ndarray_list(dir.path / "missing.params"),
                       ("cannot read '" + (dir.path / "missing.params").string() + "': No such file or directory").c_str(),
                       FileError);
}

// ---------------------------------------------------------------- symbol JSON

namespace {
SymbolFile parse_json(const std::string& text) { return parse_symbol_json(text, "m.json"); }

// A graph x -> r (relu) with one part replaced.
struct Graph {
  std::string nodes = R"({"op": "null", "name": "x", "inputs": []}, {"op": "relu", "name": "r", "inputs": [[0, 0, 0]]})";
  std::string arg_nodes = "[0]";
  std::string heads = "[[1, 0, 0]]";
  std::string extra = R"(, "node_row_ptr": [0, 1, 2])";
  std::string text() const {
    return R"({"nodes": [)" + nodes + R"(], "arg_nodes": )" + arg_nodes + R"(, "heads": )" + heads + extra + "}";
  }
};
// Without node_row_ptr, so any number of nodes fits.
std::string with_nodes(const std::string& nodes) {
  Graph g;
  g.nodes = nodes;
  g.extra.clear();
  return g.text();
}
std::string with_relu(const std::string& relu_fields) {
  return with_nodes(R"({"op": "null", "name": "x", "inputs": []}, {"op": "relu", "name": "r", )" + relu_fields + "}");
}
}  // namespace

TEST_CASE("io: MXNet-written symbol files parse, and re-encode to the same bytes") {
  const std::string text = read_file(fixture("tiny-symbol.json"));
  const SymbolFile tiny = load_symbol_json(fixture("tiny-symbol.json"));
  CHECK(tiny.mxnet_version == 10901);
  REQUIRE(tiny.nodes.size() == 13);
  CHECK(tiny.nodes[0].op == "null");
  CHECK(tiny.nodes[0].name == "data");
  CHECK(tiny.nodes[0].attrs.empty());
  const SymbolNode& fc = tiny.nodes[3];
  CHECK(fc.op == "FullyConnected");
  CHECK(fc.name == "dense0_fwd");
  CHECK(fc.attrs == std::vector<std::pair<std::string, std::string>>{
                        {"flatten", "True"}, {"no_bias", "False"}, {"num_hidden", "4"}});
  REQUIRE(fc.inputs.size() == 3);
  CHECK(fc.inputs[1].node == 1);
  const SymbolNode& bn = tiny.nodes[9];
  CHECK(bn.op == "BatchNorm");
  CHECK(bn.outputs == 3);
  REQUIRE(bn.inputs.size() == 5);
  CHECK(bn.inputs[3].node == 7);
  CHECK(bn.inputs[3].version == 1);  // the running mean, which BatchNorm updates
  CHECK(tiny.arg_nodes == std::vector<std::int64_t>{0, 1, 2, 5, 6, 7, 8, 10, 11});
  REQUIRE(tiny.heads.size() == 1);
  CHECK(tiny.heads[0].node == 12);
  CHECK(encode_symbol_json(tiny) == text);

  const std::string wide_text = read_file(fixture("wide-symbol.json"));
  const SymbolFile wide = parse_symbol_json(wide_text, "wide-symbol.json");
  CHECK(wide.nodes[11].inputs.size() == 11);
  CHECK(wide.nodes[13].outputs == 3);
  CHECK(wide.heads.size() == 3);
  CHECK(wide.heads[2].index == 2);
  CHECK(encode_symbol_json(wide) == wide_text);
}

TEST_CASE("io: symbol files round-trip, attrs sorted and strings escaped as MXNet does") {
  SymbolFile file;
  file.nodes.push_back(SymbolNode{"null", "in \"quoted\" \\ back", {{"__shape__", "(2, 3)"}}, {}, 1});
  file.nodes.push_back(SymbolNode{"split", "s", {{"z", "tab\there"}, {"a", "new\nline\r"}}, {{0, 0}}, 2});
  file.nodes.push_back(SymbolNode{"add", "sum", {}, {{1, 1}, {1, 0}}, 1});
  file.arg_nodes = {0};
  file.heads = {{2, 0}, {1, 1}};
  ScratchDir dir;
  save_symbol_json(dir.path / "net-symbol.json", file);
  const std::string text = read_file(dir.path / "net-symbol.json");
  CHECK(text.find(R"("name": "in \"quoted\" \\ back")") != std::string::npos);
  CHECK(text.find("\"attrs\": {\"__shape__\": \"(2, 3)\"}") != std::string::npos);
  CHECK(text.find("\"a\": \"new\\nline\\r\", \n        \"z\": \"tab\\there\"\n") != std::string::npos);
  CHECK(text.find(R"("node_row_ptr": [0, 1, 3, 4])") != std::string::npos);
  CHECK(text.find("\"inputs\": []\n") != std::string::npos);

  const SymbolFile back = load_symbol_json(dir.path / "net-symbol.json");
  REQUIRE(back.nodes.size() == 3);
  CHECK(back.nodes[0].name == file.nodes[0].name);
  CHECK(back.nodes[1].attrs == std::vector<std::pair<std::string, std::string>>{{"a", "new\nline\r"}, {"z", "tab\there"}});
  CHECK(back.nodes[1].outputs == 2);
  CHECK(back.nodes[2].inputs[0].index == 1);
  CHECK(back.heads[1].node == 1);
  CHECK(back.heads[1].index == 1);
  CHECK(encode_symbol_json(back) == text);
}

TEST_CASE("io: symbol files in older MXNet's spelling are read") {
  // "param" and "attr" for "attrs" (an attr in both keeps attr's value, as
  // MXNet does), [node, index] entries, no node_row_ptr and no version.
  const std::string legacy = R"({
    "nodes": [
      {"op": "null", "param": {}, "name": "data", "inputs": [], "backward_source_id": -1, "attr": {"ctx_group": "stage1"}},
      {"op": "null", "param": {}, "name": "fc_weight", "inputs": [], "backward_source_id": -1},
      {"op": "FullyConnected", "param": {"no_bias": "True", "num_hidden": "6", "ctx_group": "param's"}, "name": "fc",
       "inputs": [[0, 0], [1, 0]], "backward_source_id": -1, "attr": {"ctx_group": "stage1"}},
      {"op": "SliceChannel", "param": {"num_outputs": "3"}, "name": "split", "inputs": [[2, 0]]}
    ],
    "arg_nodes": [0, 1],
    "heads": [[3, 2]]
  })";
  const SymbolFile file = parse_json(legacy);
  CHECK(file.mxnet_version == 800);
  REQUIRE(file.nodes.size() == 4);
  CHECK(file.nodes[0].attrs == std::vector<std::pair<std::string, std::string>>{{"ctx_group", "stage1"}});
  CHECK(file.nodes[2].attrs == std::vector<std::pair<std::string, std::string>>{
                                   {"ctx_group", "stage1"}, {"no_bias", "True"}, {"num_hidden", "6"}});
  CHECK(file.nodes[2].inputs[1].node == 1);
  CHECK(file.nodes[2].inputs[1].version == 0);
  // Without node_row_ptr the outputs are what the file reads: output 2 of split.
  CHECK(file.nodes[2].outputs == 1);
  CHECK(file.nodes[3].outputs == 3);
}

TEST_CASE("io: malformed symbol files are FormatErrors naming the offset or the node") {
  CHECK(parse_json(Graph{}.text()).nodes.size() == 2);
  CHECK_THROWS_WITH_AS(parse_json(R"({"nodes": [1, 2,, 3]})"),
                       "model file 'm.json': offset 16: not valid JSON: syntax error", FormatError);
  CHECK_THROWS_WITH_AS(parse_json(""), Contains("offset 0: not valid JSON"), FormatError);
  CHECK_THROWS_WITH_AS(parse_json(R"({"nodes": [)"), Contains("offset 11: not valid JSON"), FormatError);
  const std::string trailing = "offset " + std::to_string(Graph{}.text().size() + 2) + ": unexpected text after the JSON value";
  CHECK_THROWS_WITH_AS(parse_json(Graph{}.text() + "\n x"), Contains(trailing.c_str()), FormatError);
  CHECK_THROWS_WITH_AS(parse_json(std::string(100, '[') + std::string(100, ']')),
                       Contains("offset 20: not valid JSON: too deep"), FormatError);
  CHECK_THROWS_WITH_AS(parse_json("[]"), "model file 'm.json': the top level is an array, not an object", FormatError);
  CHECK_THROWS_WITH_AS(parse_json("{}"), Contains("the top level has no \"nodes\""), FormatError);
  CHECK_THROWS_WITH_AS(parse_json(R"({"nodes": 3})"), Contains("\"nodes\" is a number, not an array"), FormatError);
  CHECK_THROWS_WITH_AS(parse_json(with_nodes("1")), Contains("node 0 is a number, not an object"), FormatError);
  CHECK_THROWS_WITH_AS(parse_json(with_nodes(R"({"name": "x", "inputs": []})")), Contains("node 0 has no \"op\""),
                       FormatError);
  CHECK_THROWS_WITH_AS(parse_json(with_nodes(R"({"op": [], "name": "x", "inputs": []})")),
                       Contains("node 0's \"op\" is an array, not a string"), FormatError);
  CHECK_THROWS_WITH_AS(parse_json(with_nodes(R"({"op": "null", "name": "x"})")),
                       Contains("node 0 'x' (null) has no \"inputs\""), FormatError);
  CHECK_THROWS_WITH_AS(parse_json(with_relu(R"("attrs": "axis=1", "inputs": [[0, 0]])")),
                       Contains("node 1 'r' (relu)'s \"attrs\" is a string, not an object"), FormatError);
  CHECK_THROWS_WITH_AS(parse_json(with_relu(R"("attrs": {"axis": 1}, "inputs": [[0, 0]])")),
                       "model file 'm.json': node 1 'r' (relu): attr 'axis' is a number, not a string", FormatError);
  CHECK_THROWS_WITH_AS(parse_json(with_relu(R"("attr": {"axis": null}, "inputs": [[0, 0]])")),
                       Contains("node 1 'r' (relu): attr 'axis' is null, not a string"), FormatError);
  CHECK_THROWS_WITH_AS(parse_json(with_relu(R"("inputs": {})")), Contains("node 1 'r' (relu)'s \"inputs\" is an object"),
                       FormatError);
  CHECK_THROWS_WITH_AS(parse_json(with_relu(R"("inputs": [[0]])")),
                       Contains("node 1 'r' (relu): input 0 has 1 numbers, not [node, index] or [node, index, version]"),
                       FormatError);
  CHECK_THROWS_WITH_AS(parse_json(with_relu(R"("inputs": [[0, 0, 0, 0]])")), Contains("input 0 has 4 numbers"),
                       FormatError);
  CHECK_THROWS_WITH_AS(parse_json(with_relu(R"("inputs": [[0, -1]])")),
                       Contains("input 0's output index is -1, not a non-negative integer"), FormatError);
  CHECK_THROWS_WITH_AS(parse_json(with_relu(R"("inputs": [[0.5, 0]])")),
                       Contains("input 0's node is 5E-1, not a non-negative integer"), FormatError);
  CHECK_THROWS_WITH_AS(parse_json(with_relu(R"("inputs": [["0", 0]])")),
                       Contains("input 0's node is a string, not a non-negative integer"), FormatError);
  CHECK_THROWS_WITH_AS(parse_json(with_relu(R"("inputs": [[0, 18446744073709551615]])")),
                       Contains("input 0's output index is 18446744073709551615, too large"), FormatError);
  CHECK_THROWS_WITH_AS(parse_json(with_relu(R"("inputs": [[0, 0, 4294967296]])")),
                       Contains("input 0 has version 4294967296, outside MXNet's 0 to 4294967295"), FormatError);

  // References: dangling, to itself, forwards (cycles), beyond a node's outputs.
  CHECK_THROWS_WITH_AS(parse_json(with_relu(R"("inputs": [[5, 0]])")),
                       "model file 'm.json': node 1 'r' (relu): input 0 reads node 5, but the graph has only 2 nodes "
                       "(a dangling reference)",
                       FormatError);
  CHECK_THROWS_WITH_AS(parse_json(with_relu(R"("inputs": [[1, 0]])")),
                       Contains("node 1 'r' (relu): input 0 reads the node's own output: a cycle"), FormatError);
  CHECK_THROWS_WITH_AS(
      parse_json(with_nodes(R"({"op": "null", "name": "x", "inputs": []}, {"op": "relu", "name": "r", "inputs": [[2, 0]]},
                               {"op": "relu", "name": "s", "inputs": [[1, 0]]})")),
      Contains("node 1 'r' (relu): input 0 reads node 2 's' (relu), which comes later: a cycle (MXNet stores nodes in "
               "topological order)"),
      FormatError);
  CHECK_THROWS_WITH_AS(parse_json(with_relu(R"("inputs": [[0, 1]])")),
                       Contains("node 1 'r' (relu): input 0 reads output 1 of node 0 'x' (null), which has 1 output"),
                       FormatError);
  CHECK_THROWS_WITH_AS(
      parse_json(with_nodes(R"({"op": "null", "name": "x", "inputs": []}, {"op": "null", "name": "y", "inputs": [[0, 0]]})")),
      Contains("node 1 'y' (null): a variable (op \"null\") has inputs"), FormatError);
  CHECK_THROWS_WITH_AS(parse_json(with_relu(R"("op": "", "inputs": [])")), Contains("the op is empty"), FormatError);
  CHECK_THROWS_WITH_AS(parse_json(with_relu(R"("xattrs": {"axis": "1"}, "inputs": [[0, 0]])")),
                       Contains("node 1 'r' (relu) has an unknown key \"xattrs\""), FormatError);
  CHECK_THROWS_WITH_AS(parse_json(R"({"nodes": [], "heads": [], "arg_nodes": [], "node_row_pointer": [0]})"),
                       Contains("the top level has an unknown key \"node_row_pointer\""), FormatError);
  CHECK_THROWS_WITH_AS(parse_json(with_relu(R"("inputs": [[0, 0]], "subgraphs": [{"nodes": []}])")),
                       Contains("node 1 'r' (relu) has subgraphs (a control-flow op"), FormatError);

  Graph g;
  g.arg_nodes = "[1]";
  CHECK_THROWS_WITH_AS(parse_json(g.text()),
                       "model file 'm.json': arg_nodes[0] is node 1 'r' (relu), which is not a variable (op \"null\")",
                       FormatError);
  g.arg_nodes = "[7]";
  CHECK_THROWS_WITH_AS(parse_json(g.text()), Contains("arg_nodes[0] is node 7, but the graph has only 2 nodes"),
                       FormatError);
  g.arg_nodes = "[0, 0]";
  CHECK_THROWS_WITH_AS(parse_json(g.text()), Contains("arg_nodes[1] lists node 0 'x' (null) a second time"), FormatError);
  g.arg_nodes = R"({"0": 0})";
  CHECK_THROWS_WITH_AS(parse_json(g.text()), Contains("\"arg_nodes\" is an object, not an array"), FormatError);

  g = Graph{};
  g.heads = "[[2, 0]]";
  CHECK_THROWS_WITH_AS(parse_json(g.text()), Contains("head 0 reads node 2, but the graph has only 2 nodes"), FormatError);
  g.heads = "[[1, 0], [1, 1]]";
  CHECK_THROWS_WITH_AS(parse_json(g.text()), Contains("head 1 reads output 1 of node 1 'r' (relu), which has 1 output"),
                       FormatError);
  g.heads = "[]";
  CHECK_THROWS_WITH_AS(parse_json(g.text()), Contains("the graph has no heads (outputs)"), FormatError);

  g = Graph{};
  g.extra = R"(, "node_row_ptr": [0, 1])";
  CHECK_THROWS_WITH_AS(parse_json(g.text()), Contains("\"node_row_ptr\" has 2 numbers for 2 nodes"), FormatError);
  g.extra = R"(, "node_row_ptr": [1, 2, 3])";
  CHECK_THROWS_WITH_AS(parse_json(g.text()), Contains("node_row_ptr[0] is 1, not 0"), FormatError);
  g.extra = R"(, "node_row_ptr": [0, 1, 1])";
  CHECK_THROWS_WITH_AS(parse_json(g.text()),
                       Contains("node_row_ptr[2] is 1, not above 1: node 1 'r' (relu) would have no outputs"), FormatError);
  g.extra = R"(, "node_row_ptr": [0, 2, 3])";
  CHECK_THROWS_WITH_AS(parse_json(g.text()), Contains("node 0 'x' (null): a variable has 1 output, not 2"), FormatError);
  g.extra = R"(, "node_row_ptr": [0, 1, 100000000])";
  CHECK_THROWS_WITH_AS(parse_json(g.text()),
                       Contains("node 1 'r' (relu): 99999999 outputs is out of range (1 to 1048576)"), FormatError);
  g.extra = R"(, "attrs": {"mxnet_version": 10901})";
  CHECK_THROWS_WITH_AS(parse_json(g.text()), Contains("\"mxnet_version\" is not [\"int\", version]"), FormatError);
  g.extra = R"(, "attrs": {"mxnet_version": ["int", 10600]})";
  CHECK(parse_json(g.text()).mxnet_version == 10600);
}

// Inputs the fuzzers (tests/fuzz/) found, each once a crash or a sanitizer report.
TEST_CASE("io: fuzz regressions") {
  // An empty array whose other extents multiply beyond int64: parse accepted
  // it, then the Tensor for it refused the shape (a ShapeError from
  // load_ndarray_list). libFuzzer's input, with its two extra arrays cut.
  CHECK_THROWS_WITH_AS(parse_params(one_array(v2_array({0, 196608, 262144, 1792, 4278454272}, 3, ""))),
                       Contains("array 0: shape (0, 196608, 262144, 1792, 4278454272) has more elements than fit in int64"),
                       FormatError);
  ScratchDir dir;
  write_file_atomically(dir.path / "empty.params", one_array(v2_array({std::int64_t{1} << 40, 0, 1 << 20}, 0, "")));
  CHECK(load_ndarray_list(dir.path / "empty.params")[0].second.shape() == Shape{std::int64_t{1} << 40, 0, 1 << 20});

  // Without node_row_ptr the outputs are inferred from the indices read:
  // the largest int64 index overflowed `index + 1` (UBSan).
  CHECK_THROWS_WITH_AS(
      parse_json(R"({"nodes": [{"op": "null", "name": "x", "inputs": []}, {"op": "relu", "name": "r", "inputs": [[0, 0]]}],
                     "arg_nodes": [0], "heads": [[1, 9223372036854775807]]})"),
      Contains("head 0 reads output 9223372036854775807 of node 1 'r' (relu), which has 1 output"), FormatError);
}

TEST_CASE("io: encode_symbol_json rejects graphs MXNet could not load") {
  SymbolFile file;
  file.nodes.push_back(SymbolNode{"null", "x", {}, {}, 1});
  file.nodes.push_back(SymbolNode{"relu", "r", {}, {{0, 0}}, 1});
  file.arg_nodes = {0};
  file.heads = {{1, 0}};
  CHECK(parse_json(encode_symbol_json(file)).nodes.size() == 2);

  SymbolFile bad = file;
  bad.nodes[1].inputs[0].node = 3;
  CHECK_THROWS_WITH_AS(encode_symbol_json(bad),
                       "encode_symbol_json: node 1 'r' (relu): input 0 reads node 3, but the graph has only 2 nodes "
                       "(a dangling reference)",
                       ValueError);
  bad = file;
  bad.heads.clear();
  CHECK_THROWS_WITH_AS(encode_symbol_json(bad), Contains("no heads"), ValueError);
  bad = file;
  bad.nodes[1].attrs = {{"k", "1"}, {"k", "2"}};
  CHECK_THROWS_WITH_AS(encode_symbol_json(bad), Contains("node 1 'r' (relu): attr 'k' appears twice"), ValueError);
  bad = file;
  bad.nodes[1].name = "bell\a";
  CHECK_THROWS_WITH_AS(encode_symbol_json(bad), Contains("node 1 'bell\a' (relu)'s name contains the control character 7"),
                       ValueError);
}

// ---------------------------------------------------------------- files

TEST_CASE("io: read_file names the file and the reason") {
  ScratchDir dir;
  CHECK_THROWS_WITH_AS(read_file(dir.path / "none.json"),
                       ("cannot read '" + (dir.path / "none.json").string() + "': No such file or directory").c_str(),
                       FileError);
  CHECK_THROWS_WITH_AS(read_file(dir.path), Contains("': it is a directory"), FileError);
  CHECK_THROWS_WITH_AS(load_symbol_json(dir.path / "none.json"), Contains("No such file or directory"), FileError);
  write_file_atomically(dir.path / "empty", "");
  CHECK(read_file(dir.path / "empty").empty());
  CHECK_THROWS_WITH_AS(load_symbol_json(dir.path / "empty"), Contains("empty': offset 0: not valid JSON"), FormatError);
}

TEST_CASE("io: write_file_atomically replaces the file, or leaves it untouched and no temporary behind") {
  ScratchDir dir;
  const fs::path path = dir.path / "model.params";
  write_file_atomically(path, "old contents");
  fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write);
  write_file_atomically(path, "new contents");
  CHECK(read_file(path) == "new contents");
  CHECK(fs::status(path).permissions() == (fs::perms::owner_read | fs::perms::owner_write));
  CHECK(dir.entries() == std::vector<std::string>{"model.params"});

  // A missing directory: nothing is created anywhere.
  CHECK_THROWS_WITH_AS(write_file_atomically(dir.path / "missing" / "model.params", "x"),
                       Contains(("cannot create a temporary file in '" + (dir.path / "missing").string() +
                                 "': No such file or directory")
                                    .c_str()),
                       FileError);
  CHECK(dir.entries() == std::vector<std::string>{"model.params"});

  // A directory in the way: the rename fails, the temporary is removed.
  fs::create_directories(dir.path / "taken" / "child");
  CHECK_THROWS_WITH_AS(write_file_atomically(dir.path / "taken", "x"),
                       Contains("renaming the temporary file over it failed: Is a directory"), FileError);
  CHECK(dir.entries() == std::vector<std::string>{"model.params", "taken"});

  // A full disk, for real, in a child process (the limit is per process): a
  // file size limit makes write() fail with EFBIG after the first 4 KiB, once
  // SIGXFSZ, which would kill the process, is ignored. The child sends the
  // error's message back through a pipe.
  int pipe_ends[2];
  REQUIRE(::pipe(pipe_ends) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(pipe_ends[0]);
    std::signal(SIGXFSZ, SIG_IGN);
    rlimit small{};
    ::getrlimit(RLIMIT_FSIZE, &small);
    small.rlim_cur = 4096;
    std::string message = "the write did not fail";
    try {
      if (::setrlimit(RLIMIT_FSIZE, &small) != 0) message = "setrlimit failed";
      else write_file_atomically(path, std::string(100000, 'z'));
    } catch (const FileError& e) {
      message = e.what();
    }
    const bool sent = ::write(pipe_ends[1], message.data(), message.size()) == static_cast<ssize_t>(message.size());
    ::_exit(sent ? 0 : 1);  // no doctest reporting, no atexit handlers: the child is not the test run
  }
  ::close(pipe_ends[1]);
  std::string message;
  char chunk[256];
  for (ssize_t n; (n = ::read(pipe_ends[0], chunk, sizeof chunk)) > 0;) message.append(chunk, static_cast<std::size_t>(n));
  ::close(pipe_ends[0]);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(message == "cannot write '" + path.string() +
                       "': writing failed: File too large (the file at that path, if any, is unchanged)");
  CHECK(read_file(path) == "new contents");
  CHECK(dir.entries() == std::vector<std::string>{"model.params", "taken"});
}
