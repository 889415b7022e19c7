#pragma once
// hybra graphs in MXNet's dialect: which MXNet op (and attrs) a graph node is
// written as, and which graph node an MXNet op is read as. The graph is the
// user's graph, before fusion (graph/passes.hpp), so the file is portable and
// an importer re-optimises it. One table below holds both directions of every
// op; a test checks that every op of the registry has its row.
//
// MXNet spells one hybra op several ways: an elementwise op on two arrays is
// `broadcast_add` (also `elemwise_add`, `_plus`, `_Plus` in older files), and
// on an array and a C++ scalar `_plus_scalar` with the scalar as an attr
// (`_rminus_scalar` when the scalar is on the left of a subtraction).
#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "../core/separate_compilation.hpp"
#include "../graph/graph.hpp"
#include "ndarray_list_format.hpp"
#include "symbol_json.hpp"

namespace hybra::io {

namespace detail::mx {

using graph::Attrs;
using graph::Node;

// MXNet's spellings of attr values: booleans are "True"/"False".
inline std::string mx_bool(bool v) { return v ? "True" : "False"; }

inline std::optional<std::string> get(const Attrs& a, std::string_view key) {
  for (const auto& [k, v] : a)
    if (k == key) return v;
  return std::nullopt;
}

// An MXNet node being read: its attrs with MXNet's defaults, and errors that
// name the file and the node. It keeps the keys its row asked for: an attr no
// row reads would be silently ignored, so from_mxnet refuses it instead.
struct Reading {
  std::string_view file;
  std::size_t index;
  const SymbolNode& node;
  std::span<const Symbol> inputs;
  std::vector<std::string>& asked;

  [[noreturn]] void reject(std::string_view why) const {
    fail<FormatError>("model file '", file, "': node ", index, " '", node.name, "' (", node.op, "): ", why);
  }
  std::optional<std::string> attr(std::string_view key) const {
    asked.emplace_back(key);
    auto v = get(node.attrs, key);
    if (v && *v == "None") return std::nullopt;
    return v;
  }
  // An attr hybra reads only in one value (MXNet's default, or what hybra computes).
  void require(std::string_view key, std::string_view expected, std::string_view fallback) const {
    const std::string v = attr(key).value_or(std::string(fallback));
    if (v != expected)
      reject("attr '" + std::string(key) + "' = '" + v + "' is not supported (only '" + std::string(expected) + "')");
  }
  template <class Parse>
  auto parsed(std::string_view key, Parse parse) const -> std::optional<decltype(parse(std::string_view{}))> {
    auto v = attr(key);
    if (!v) return std::nullopt;
    try {
      return parse(std::string_view(*v));
    } catch (const Error& e) {
      reject("attr " + std::string(key) + "='" + *v + "' cannot be read (" + e.what() + ")");
    }
  }
  bool flag(std::string_view key, bool fallback) const {
    return parsed(key, [&](std::string_view t) { return graph::parse_bool(t, key); }).value_or(fallback);
  }
  std::int64_t integer(std::string_view key, std::int64_t fallback) const {
    return parsed(key, [&](std::string_view t) { return graph::parse_int(t, key); }).value_or(fallback);
  }
  double real(std::string_view key, double fallback) const {
    return parsed(key, [&](std::string_view t) { return graph::parse_double(t, key); }).value_or(fallback);
  }
  std::optional<std::vector<std::int64_t>> tuple(std::string_view key) const {
    return parsed(key, [&](std::string_view t) { return graph::parse_tuple(t, key); });
  }
  // A 2-d window attr (kernel, stride, ...): given, or `fallback` on both axes.
  std::string window(std::string_view key, std::int64_t fallback) const {
    auto v = tuple(key);
    if (!v || v->empty()) return graph::attr_text(std::vector<std::int64_t>{fallback, fallback});
    if (v->size() != 2) reject(std::string(key) + " must have 2 values (hybra reads 2-d windows only)");
    return graph::attr_text(*v);
  }
  void layout_nchw() const {
    if (auto l = attr("layout"); l && *l != "NCHW") reject("layout '" + *l + "' is not supported (NCHW)");
  }
  void arity(std::size_t lo, std::size_t hi) const {
    if (inputs.size() < lo || inputs.size() > hi)
      reject("takes " + std::to_string(lo) + (lo == hi ? "" : " to " + std::to_string(hi)) + " inputs, not " +
             std::to_string(inputs.size()));
  }
  Symbol make(std::string op, Attrs attrs, std::vector<Symbol> in) const {
    try {
      return graph::make_symbol(std::move(op), std::move(attrs), std::move(in));
    } catch (const Error& e) {
      reject(e.what());
    }
  }
  Symbol make(std::string op, Attrs attrs = {}) const {
    return make(std::move(op), std::move(attrs), std::vector<Symbol>(inputs.begin(), inputs.end()));
  }
};

// A graph node's attrs as MXNet spells them (booleans capitalised).
inline Attrs mx_attrs(const Attrs& a) {
  Attrs out;
  for (const auto& [k, v] : a) out.emplace_back(k, v == "true" ? "True" : v == "false" ? "False" : v);
  return out;
}

// A hybra node being written.
struct Writing {
  const graph::Graph& graph;
  const Node& node;

  const Node& input(std::size_t k) const { return graph.nodes[static_cast<std::size_t>(node.inputs[k])]; }
  [[noreturn]] void reject(std::string_view why) const {
    fail<ValueError>("export_model: op '", node.op, "' ", why, " (MXNet's graph format cannot express it)");
  }
  std::string attr(std::string_view key) const { return graph::find_attr(node.attrs, key, node.op); }
};

// What a hybra node becomes in the file: the MXNet op, its attrs, and which
// of the node's inputs it keeps (a scalar operand moves into the attrs).
struct Written {
  std::string op;
  Attrs attrs;
  std::vector<std::size_t> inputs;  // positions in the hybra node's inputs
  std::int64_t outputs = 1;
  std::vector<std::size_t> aux{};  // positions of inputs that are auxiliary states
};

// One op of both directions.
struct OpRow {
  std::string_view hybra;                 // graph op ("" for an MXNet spelling only read)
  std::vector<std::string_view> mxnet;    // the first is written; all are read
  std::function<Written(const Writing&)> write;
  std::function<Symbol(const Reading&)> read;
};

inline Written keep_all(const Writing& w, std::string op, Attrs attrs = {}) {
  Written out{std::move(op), std::move(attrs), {}};
  for (std::size_t k = 0; k < w.node.inputs.size(); ++k) out.inputs.push_back(k);
  return out;
}

// Elementwise ops: the array-array spellings, the array-scalar spelling and,
// for ops whose operands do not commute, the scalar-array spelling.
struct Elementwise {
  std::string_view hybra;
  std::vector<std::string_view> arrays;
  std::string_view scalar;
  std::string_view reversed;  // scalar op x: "" when `op(s, x)` is `op(x, s)`
  std::string_view mirrored_hybra = {};  // comparisons: op(s, x) = mirrored(x, s)
};

inline std::vector<Elementwise> elementwise_spellings() {
  return {
      {"add", {"broadcast_add", "elemwise_add", "_plus", "_Plus", "broadcast_plus"}, "_plus_scalar", ""},
      {"subtract", {"broadcast_sub", "elemwise_sub", "_minus", "_Minus", "broadcast_minus"}, "_minus_scalar", "_rminus_scalar"},
      {"multiply", {"broadcast_mul", "elemwise_mul", "_mul", "_Mul"}, "_mul_scalar", ""},
      {"divide", {"broadcast_div", "elemwise_div", "_div", "_Div"}, "_div_scalar", "_rdiv_scalar"},
      {"pow", {"broadcast_power", "_power", "_Power"}, "_power_scalar", "_rpower_scalar"},
      {"maximum", {"broadcast_maximum", "_maximum", "_Maximum"}, "_maximum_scalar", ""},
      {"minimum", {"broadcast_minimum", "_minimum", "_Minimum"}, "_minimum_scalar", ""},
      {"equal", {"broadcast_equal", "_equal"}, "_equal_scalar", ""},
      {"not_equal", {"broadcast_not_equal", "_not_equal"}, "_not_equal_scalar", ""},
      {"less", {"broadcast_lesser", "_lesser"}, "_lesser_scalar", "", "greater"},
      {"less_equal", {"broadcast_lesser_equal", "_lesser_equal"}, "_lesser_equal_scalar", "", "greater_equal"},
      {"greater", {"broadcast_greater", "_greater"}, "_greater_scalar", "", "less"},
      {"greater_equal", {"broadcast_greater_equal", "_greater_equal"}, "_greater_equal_scalar", "", "less_equal"},
  };
}

inline bool is_scalar(const Node& n) { return n.op == "scalar"; }

// The scalar attrs MXNet 1.9 writes: the value, and whether it was an int.
inline Attrs scalar_attrs(const Node& s) {
  const std::string& v = graph::find_attr(s.attrs, "value", "scalar");
  return {{"scalar", v}, {"is_int", mx_bool(!is_floating(*s.meta.dtype))}};
}

// A scalar attr read back as a weak scalar of the graph (it adapts to the
// array's dtype, as MXNet's scalar ops do).
inline Symbol scalar_of(const Reading& r) {
  auto text = r.attr("scalar");
  if (!text) r.reject("attr 'scalar' is missing");
  const double v = r.real("scalar", 0);
  if (r.flag("is_int", false) && v == static_cast<double>(static_cast<std::int64_t>(v)))
    return graph::scalar_symbol(static_cast<std::int64_t>(v));
  return graph::scalar_symbol(v);
}

inline std::vector<OpRow> elementwise_rows() {
  std::vector<OpRow> rows;
  for (const auto& e : elementwise_spellings()) {
    rows.push_back(OpRow{
        e.hybra, e.arrays,
        [e](const Writing& w) -> Written {
          const bool left = is_scalar(w.input(0)), right = is_scalar(w.input(1));
          if (left && right) w.reject("has two scalar operands");
          if (!left && !right) return keep_all(w, std::string(e.arrays.front()));
          if (right) return Written{std::string(e.scalar), scalar_attrs(w.input(1)), {0}};
          if (!e.mirrored_hybra.empty()) {
            for (const auto& m : elementwise_spellings())
              if (m.hybra == e.mirrored_hybra) return Written{std::string(m.scalar), scalar_attrs(w.input(0)), {1}};
          }
          return Written{std::string(e.reversed.empty() ? e.scalar : e.reversed), scalar_attrs(w.input(0)), {1}};
        },
        [e](const Reading& r) {
          r.arity(2, 2);
          return r.make(std::string(e.hybra));
        }});
    auto scalar_read = [e](bool reversed) {
      return [e, reversed](const Reading& r) {
        r.arity(1, 1);
        Symbol s = scalar_of(r);
        if (!reversed) return r.make(std::string(e.hybra), {}, {r.inputs[0], s});
        return r.make(std::string(e.hybra), {}, {s, r.inputs[0]});
      };
    };
    rows.push_back(OpRow{"", {e.scalar}, nullptr, scalar_read(false)});
    if (!e.reversed.empty()) rows.push_back(OpRow{"", {e.reversed}, nullptr, scalar_read(true)});
  }
  // clip is maximum then minimum with scalars (hybra::clip), written as MXNet's two scalar ops.
  rows.push_back(OpRow{"", {"clip"}, nullptr, [](const Reading& r) {
                         r.arity(1, 1);
                         if (!r.attr("a_min") || !r.attr("a_max")) r.reject("attrs 'a_min' and 'a_max' are needed");
                         const Symbol low = graph::scalar_symbol(r.real("a_min", 0));
                         const Symbol high = graph::scalar_symbol(r.real("a_max", 0));
                         return r.make("minimum", {}, {r.make("maximum", {}, {r.inputs[0], low}), high});
                       }});
  for (std::string_view unary : {"negative", "exp", "log", "sqrt", "abs", "tanh", "sigmoid", "relu"}) {
    rows.push_back(OpRow{unary, {unary},
                         [unary](const Writing& w) { return keep_all(w, std::string(unary)); },
                         [unary](const Reading& r) {
                           r.arity(1, 1);
                           return r.make(std::string(unary));
                         }});
  }
  rows.push_back(OpRow{"where", {"where"},
                       [](const Writing& w) {
                         for (std::size_t k = 0; k < 3; ++k)
                           if (is_scalar(w.input(k))) w.reject("has a scalar operand");
                         return keep_all(w, "where");
                       },
                       [](const Reading& r) {
                         r.arity(3, 3);
                         return r.make("where");
                       }});
  return rows;
}

inline OpRow reduction_row(std::string_view op) {
  return OpRow{op, {op},
               [op](const Writing& w) {
                 Attrs a;
                 const std::string axis = w.attr("axis");
                 if (axis == "()") w.reject("reduces no axis");
                 if (axis != "None") a.emplace_back("axis", axis);
                 a.emplace_back("keepdims", mx_bool(graph::parse_bool(w.attr("keepdims"), op)));
                 return keep_all(w, std::string(op), std::move(a));
               },
               [op](const Reading& r) {
                 r.arity(1, 1);
                 if (r.flag("exclude", false)) r.reject("exclude=True is not supported");
                 auto axis = r.tuple("axis");
                 return r.make(std::string(op), {{"axis", axis && !axis->empty() ? graph::attr_text(*axis) : "None"},
                                                 {"keepdims", graph::attr_text(r.flag("keepdims", false))}});
               }};
}

HYBRA_SEPARABLE std::vector<OpRow> op_rows();
#if HYBRA_DEFINE_SEPARABLE
HYBRA_SEPARABLE std::vector<OpRow> op_rows() {
  std::vector<OpRow> rows = elementwise_rows();
  auto pass_through = [](std::string_view hybra, std::vector<std::string_view> mxnet) {
    return OpRow{hybra, mxnet,
                 [mxnet](const Writing& w) { return keep_all(w, std::string(mxnet.front())); },
                 [hybra](const Reading& r) {
                   r.arity(1, 1);
                   return r.make(std::string(hybra));
                 }};
  };
  rows.push_back(OpRow{"", {"Activation"}, nullptr, [](const Reading& r) {
                         r.arity(1, 1);
                         try {
                           return hybra::activation(r.inputs[0], r.attr("act_type").value_or(""));
                         } catch (const Error& e) {
                           r.reject(e.what());
                         }
                       }});
  rows.push_back(OpRow{"", {"_copy", "identity"}, nullptr, [](const Reading& r) {
                         r.arity(1, 1);
                         return r.inputs[0];
                       }});
  auto product = [](std::string_view hybra) {
    return OpRow{hybra, hybra == "dot" ? std::vector<std::string_view>{"dot"} : std::vector<std::string_view>{},
                 [](const Writing& w) {
                   for (std::size_t k = 0; k < 2; ++k)
                     if (!w.input(k).meta.shape || w.input(k).meta.shape->size() > 2)
                       w.reject("on operands of more than 2 dimensions");
                   return keep_all(w, "dot");
                 },
                 [](const Reading& r) {
                   r.arity(2, 2);
                   if (r.flag("transpose_a", false) || r.flag("transpose_b", false))
                     r.reject("transpose_a/transpose_b are not supported");
                   return r.make("dot");
                 }};
  };
  rows.push_back(product("dot"));
  rows.push_back(product("matmul"));
  for (std::string_view op : {"sum", "mean", "max", "min"}) rows.push_back(reduction_row(op));
  rows.push_back(OpRow{"argmax", {"argmax"},
                       [](const Writing& w) {
                         Attrs a;
                         if (w.attr("axis") != "None") a.emplace_back("axis", w.attr("axis"));
                         a.emplace_back("keepdims", mx_bool(graph::parse_bool(w.attr("keepdims"), "argmax")));
                         return keep_all(w, "argmax", std::move(a));
                       },
                       [](const Reading& r) {
                         r.arity(1, 1);
                         auto axis = r.parsed("axis", [](std::string_view t) { return graph::parse_int(t, "axis"); });
                         return r.make("argmax", {{"axis", graph::attr_text(axis)},
                                                  {"keepdims", graph::attr_text(r.flag("keepdims", false))}});
                       }});
  for (std::string_view op : {"softmax", "log_softmax"}) {
    rows.push_back(OpRow{op, {op},
                         [op](const Writing& w) { return keep_all(w, std::string(op), {{"axis", w.attr("axis")}}); },
                         [op](const Reading& r) {
                           r.arity(1, 1);
                           if (r.attr("temperature") && r.real("temperature", 1) != 1) r.reject("temperature is not supported");
                           return r.make(std::string(op), {{"axis", graph::attr_text(r.integer("axis", -1))}});
                         }});
  }
  rows.push_back(OpRow{"reshape", {"Reshape", "reshape"},
                       [](const Writing& w) { return keep_all(w, "Reshape", {{"shape", w.attr("shape")}}); },
                       [](const Reading& r) {
                         r.arity(1, 1);
                         auto shape = r.tuple("shape");
                         if (!shape) r.reject("attr 'shape' is missing");
                         for (auto d : *shape)
                           if (d == 0 || d < -1) r.reject("MXNet's special reshape codes (0, -2, -3, -4) are not supported");
                         return r.make("reshape", {{"shape", graph::attr_text(*shape)}});
                       }});
  rows.push_back(OpRow{"transpose", {"transpose"},
                       [](const Writing& w) {
                         Attrs a;
                         if (w.attr("axis") != "None") a.emplace_back("axes", w.attr("axis"));
                         return keep_all(w, "transpose", std::move(a));
                       },
                       [](const Reading& r) {
                         r.arity(1, 1);
                         auto axes = r.tuple("axes");
                         return r.make("transpose", {{"axis", axes && !axes->empty() ? graph::attr_text(*axes) : "None"}});
                       }});
  rows.push_back(OpRow{"slice", {"slice_axis"},
                       [](const Writing& w) {
                         if (w.attr("step") != "1") w.reject("with a step other than 1");
                         return keep_all(w, "slice_axis",
                                         {{"axis", w.attr("axis")}, {"begin", w.attr("begin")}, {"end", w.attr("end")}});
                       },
                       [](const Reading& r) {
                         r.arity(1, 1);
                         auto bound = [&](std::string_view key) {
                           return r.parsed(key, [&](std::string_view t) { return graph::parse_int(t, key); });
                         };
                         return r.make("slice", {{"axis", graph::attr_text(r.integer("axis", 0))},
                                                 {"begin", graph::attr_text(bound("begin"))},
                                                 {"end", graph::attr_text(bound("end"))},
                                                 {"step", "1"}});
                       }});
  rows.push_back(OpRow{"concat", {"Concat", "concat"},
                       [](const Writing& w) {
                         return keep_all(w, "Concat", {{"dim", w.attr("axis")}, {"num_args", std::to_string(w.node.inputs.size())}});
                       },
                       [](const Reading& r) {
                         r.arity(1, static_cast<std::size_t>(-1));
                         if (r.integer("num_args", static_cast<std::int64_t>(r.inputs.size())) !=
                             static_cast<std::int64_t>(r.inputs.size()))
                           r.reject("attr 'num_args' does not match its " + std::to_string(r.inputs.size()) + " inputs");
                         return r.make("concat", {{"axis", graph::attr_text(r.integer("dim", 1))}});
                       }});
  rows.push_back(OpRow{"astype", {"Cast", "cast"},
                       [](const Writing& w) { return keep_all(w, "Cast", {{"dtype", w.attr("dtype")}}); },
                       [](const Reading& r) {
                         r.arity(1, 1);
                         auto d = r.attr("dtype");
                         if (!d) r.reject("attr 'dtype' is missing");
                         return r.make("astype", {{"dtype", *d}});
                       }});
  rows.push_back(pass_through("flatten", {"Flatten", "flatten"}));
  rows.push_back(OpRow{"broadcast_to", {"broadcast_to"},
                       [](const Writing& w) { return keep_all(w, "broadcast_to", {{"shape", w.attr("shape")}}); },
                       [](const Reading& r) {
                         r.arity(1, 1);
                         auto shape = r.tuple("shape");
                         if (!shape) r.reject("attr 'shape' is missing");
                         for (auto d : *shape)
                           if (d <= 0) r.reject("MXNet's 0 (keep this dimension) in 'shape' is not supported");
                         return r.make("broadcast_to", {{"shape", graph::attr_text(*shape)}});
                       }});
  rows.push_back(OpRow{"fully_connected", {"FullyConnected"},
                       [](const Writing& w) {
                         const auto& weight = w.input(1).meta.shape;
                         return keep_all(w, "FullyConnected",
                                         {{"num_hidden", std::to_string(weight ? (*weight)[0] : 0)},
                                          {"no_bias", mx_bool(w.node.inputs.size() == 2)},
                                          {"flatten", "True"}});
                       },
                       [](const Reading& r) {
                         const bool no_bias = r.flag("no_bias", false);
                         r.arity(no_bias ? 2 : 3, no_bias ? 2 : 3);
                         if (!r.flag("flatten", true)) r.reject("flatten=False is not supported");
                         const auto hidden = r.integer("num_hidden", 0);
                         if (r.inputs[1].has_shape() && !r.inputs[1].shape().empty() && r.inputs[1].shape()[0] != hidden)
                           r.reject("attr 'num_hidden' = " + std::to_string(hidden) + " does not match weight of shape " +
                                    to_string(r.inputs[1].shape()));
                         return r.make("fully_connected");
                       }});
  rows.push_back(OpRow{"dropout", {"Dropout"},
                       [](const Writing& w) { return keep_all(w, "Dropout", {{"p", w.attr("rate")}, {"mode", "training"}}); },
                       [](const Reading& r) {
                         r.arity(1, 1);
                         r.require("mode", "training", "training");  // 'always' drops while predicting too
                         r.require("axes", "()", "()");              // one mask shared along axes
                         return r.make("dropout", {{"rate", graph::attr_text(r.real("p", 0.5))}});
                       }});
  rows.push_back(OpRow{"conv2d", {"Convolution"},
                       [](const Writing& w) {
                         Attrs a = mx_attrs(w.node.attrs);
                         a.emplace_back("layout", "NCHW");
                         return keep_all(w, "Convolution", std::move(a));
                       },
                       [](const Reading& r) {
                         const bool no_bias = r.flag("no_bias", false);
                         r.arity(no_bias ? 2 : 3, no_bias ? 2 : 3);
                         r.layout_nchw();
                         if (!r.tuple("kernel")) r.reject("attr 'kernel' is missing");
                         return r.make("conv2d", {{"kernel", r.window("kernel", 1)},
                                                  {"stride", r.window("stride", 1)},
                                                  {"pad", r.window("pad", 0)},
                                                  {"dilate", r.window("dilate", 1)},
                                                  {"num_group", graph::attr_text(r.integer("num_group", 1))},
                                                  {"num_filter", graph::attr_text(r.integer("num_filter", 0))},
                                                  {"no_bias", graph::attr_text(no_bias)}});
                       }});
  rows.push_back(OpRow{"pool2d", {"Pooling"},
                       [](const Writing& w) {
                         Attrs a = mx_attrs(w.node.attrs);
                         a.emplace_back("layout", "NCHW");
                         return keep_all(w, "Pooling", std::move(a));
                       },
                       [](const Reading& r) {
                         r.arity(1, 1);
                         r.layout_nchw();
                         const bool global = r.flag("global_pool", false);
                         const std::string type = r.attr("pool_type").value_or("max");
                         if (type != "max" && type != "avg") r.reject("pool_type '" + type + "' is not supported (max or avg)");
                         const std::string convention = r.attr("pooling_convention").value_or("valid");
                         if (convention != "valid" && convention != "full")
                           r.reject("pooling_convention '" + convention + "' is not supported (valid or full)");
                         if (!global && !r.tuple("kernel")) r.reject("attr 'kernel' is missing");
                         return r.make("pool2d", {{"kernel", r.window("kernel", 1)},
                                                  {"stride", r.window("stride", 1)},
                                                  {"pad", r.window("pad", 0)},
                                                  {"pool_type", type},
                                                  {"global_pool", graph::attr_text(global)},
                                                  {"count_include_pad", graph::attr_text(r.flag("count_include_pad", true))},
                                                  {"pooling_convention", global ? "valid" : convention}});
                       }});
  rows.push_back(OpRow{"batch_norm", {"BatchNorm"},
                       [](const Writing& w) {
                         Written out = keep_all(w, "BatchNorm",
                                                {{"eps", w.attr("eps")},
                                                 {"axis", w.attr("axis")},
                                                 {"momentum", "0.9"},
                                                 {"fix_gamma", "False"},
                                                 {"use_global_stats", "False"}});
                         out.outputs = 3;  // MXNet's BatchNorm also outputs the batch mean and variance
                         out.aux = {3, 4};
                         return out;
                       },
                       [](const Reading& r) {
                         r.arity(5, 5);
                         if (r.flag("output_mean_var", false)) r.reject("output_mean_var=True is not supported");
                         // Training with the running statistics instead of the batch's.
                         if (r.flag("use_global_stats", false)) r.reject("use_global_stats=True is not supported");
                         // How a training step would update the running statistics: not part of the graph.
                         r.attr("momentum");
                         std::vector<Symbol> in(r.inputs.begin(), r.inputs.end());
                         if (r.flag("fix_gamma", true)) {
                           if (!in[1].has_shape()) r.reject("fix_gamma=True needs the shape of gamma (give the parameter file)");
                           in[1] = sym::constant(ones(in[1].shape(), in[1].dtype()));
                         }
                         return r.make("batch_norm", {{"eps", graph::attr_text(r.real("eps", 1e-3))},
                                                      {"axis", graph::attr_text(r.integer("axis", 1))}},
                                       std::move(in));
                       }});
  return rows;
}
#endif

struct OpTable {
  std::unordered_map<std::string_view, const OpRow*> by_hybra, by_mxnet;
  std::vector<OpRow> rows;
};

inline const OpTable& op_table() {
  static const OpTable table = [] {
    OpTable t;
    t.rows = op_rows();
    for (const auto& row : t.rows) {
      if (!row.hybra.empty()) t.by_hybra.emplace(row.hybra, &row);
      for (auto m : row.mxnet) t.by_mxnet.emplace(m, &row);
    }
    return t;
  }();
  return table;
}

// Attrs that choose how MXNet computes, not what (cuDNN's use and its
// workspace). from_mxnet also passes the `__name__` attrs unread: the user's
// notes (learning-rate multipliers, initialisers).
inline bool without_effect(std::string_view key) {
  return key == "cudnn_off" || key == "cudnn_tune" || key == "workspace";
}

// MXNet's dtype names in the `__dtype__` attr are its numeric codes.
inline std::string dtype_attr(DType d) { return std::to_string(mxnet_dtype_code(d)); }

}  // namespace detail::mx

// Whether an op of the graph registry can be written to an MXNet file.
inline bool mxnet_exportable(std::string_view op) { return detail::mx::op_table().by_hybra.count(op) > 0; }

// A graph as MXNet's symbol file. The vars named in `inputs` are the model's
// inputs; the other vars are parameters, written with their shape and dtype.
// Constants of the graph (tensors the forward used) become parameters named
// `<name_prefix>const<k>`, returned in `constants`; `aux` lists the vars
// MXNet treats as auxiliary states.
struct MxnetExport {
  SymbolFile symbol;
  std::vector<std::pair<std::string, Tensor>> constants;
  std::vector<std::string> aux;
};

inline MxnetExport to_mxnet(const graph::Graph& g, std::span<const std::string> inputs, std::string_view name_prefix) {
  using namespace detail::mx;
  MxnetExport out;
  std::vector<std::int64_t> id(g.nodes.size(), -1);
  auto add_var = [&](std::string name, Attrs attrs) {
    out.symbol.arg_nodes.push_back(static_cast<std::int64_t>(out.symbol.nodes.size()));
    out.symbol.nodes.push_back(SymbolNode{"null", std::move(name), std::move(attrs), {}, 1});
    return static_cast<std::int64_t>(out.symbol.nodes.size() - 1);
  };
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const graph::Node& n = g.nodes[i];
    if (n.op == "scalar") continue;
    if (n.op == "fused" || n.body) fail<ValueError>("export_model: the graph is optimised (node ", i, " is fused); export the captured graph");
    if (n.op == "var") {
      Attrs a;
      const bool parameter = std::find(inputs.begin(), inputs.end(), n.name) == inputs.end();
      if (parameter && n.meta.shape) a.emplace_back("__shape__", to_string(*n.meta.shape));
      if (parameter && n.meta.dtype) a.emplace_back("__dtype__", dtype_attr(*n.meta.dtype));
      id[i] = add_var(n.name, std::move(a));
      continue;
    }
    if (n.op == "const") {
      std::string name = std::string(name_prefix) + "const" + std::to_string(out.constants.size());
      out.constants.emplace_back(name, n.value);
      id[i] = add_var(name, {{"__shape__", to_string(n.value.shape())}, {"__dtype__", dtype_attr(n.value.dtype())}});
      continue;
    }
    auto row = op_table().by_hybra.find(n.op);
    if (row == op_table().by_hybra.end() || !row->second->write)
      fail<ValueError>("export_model: op '", n.op, "' has no MXNet spelling");
    Written w = row->second->write(Writing{g, n});
    SymbolNode node{std::move(w.op), n.name.empty() ? std::string(name_prefix) + n.op + std::to_string(i) : n.name,
                    std::move(w.attrs), {}, w.outputs};
    for (std::size_t k : w.inputs) {
      const auto in = static_cast<std::size_t>(n.inputs[k]);
      if (id[in] < 0) fail<ValueError>("export_model: op '", n.op, "' reads a scalar where MXNet needs an array");
      node.inputs.push_back(SymbolEntry{id[in], 0});
    }
    for (std::size_t k : w.aux) out.aux.push_back(g.nodes[static_cast<std::size_t>(n.inputs[k])].name);
    out.symbol.nodes.push_back(std::move(node));
    id[i] = static_cast<std::int64_t>(out.symbol.nodes.size() - 1);
  }
  for (int o : g.outputs) {
    if (id[static_cast<std::size_t>(o)] < 0) fail<ValueError>("export_model: an output of the graph is a bare scalar");
    out.symbol.heads.push_back(SymbolEntry{id[static_cast<std::size_t>(o)], 0});
  }
  return out;
}

// An MXNet symbol file as symbols of hybra's graph: `var(name)` gives the
// symbol of each variable node (an input or a parameter); returns the heads.
inline std::vector<Symbol> from_mxnet(const SymbolFile& file, std::string_view file_name,
                                      const std::function<Symbol(const SymbolNode&)>& var) {
  using namespace detail::mx;
  std::vector<Symbol> values(file.nodes.size());
  for (std::size_t i = 0; i < file.nodes.size(); ++i) {
    const SymbolNode& n = file.nodes[i];
    if (n.op == "null") {
      values[i] = var(n);
      continue;
    }
    std::vector<Symbol> in;
    for (const auto& e : n.inputs) {
      const auto& source = file.nodes[static_cast<std::size_t>(e.node)];
      if (e.index != 0)
        fail<FormatError>("model file '", file_name, "': node ", i, " '", n.name, "' reads output ", e.index, " of node '",
                          source.name, "' (", source.op, "); hybra reads the first output of an op only");
      in.push_back(values[static_cast<std::size_t>(e.node)]);
    }
    auto row = op_table().by_mxnet.find(n.op);
    if (row == op_table().by_mxnet.end())
      fail<FormatError>("model file '", file_name, "': node ", i, " '", n.name, "': op '", n.op, "' is not supported by hybra");
    std::vector<std::string> asked;
    const Reading reading{file_name, i, n, in, asked};
    Symbol value = row->second->read(reading);
    for (const auto& [key, text] : n.attrs)
      if (!key.starts_with("__") && !without_effect(key) && std::find(asked.begin(), asked.end(), key) == asked.end())
        reading.reject("attr '" + key + "' = '" + text + "' is not supported");
    if (value.node().op != "var" && value.node().name.empty()) {
      // The node keeps the file's name, so that outputs keep theirs.
      auto named = std::make_shared<graph::SymNode>(value.node());
      named->name = n.name;
      value = Symbol(std::move(named));
    }
    values[i] = std::move(value);
  }
  std::vector<Symbol> heads;
  for (const auto& h : file.heads) {
    if (h.index != 0)
      fail<FormatError>("model file '", file_name, "': head reads output ", h.index, " of node ", h.node,
                        "; hybra reads the first output of an op only");
    heads.push_back(values[static_cast<std::size_t>(h.node)]);
  }
  return heads;
}

}  // namespace hybra::io
