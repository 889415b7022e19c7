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

using op::Attrs;
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
    return parsed(key, [&](std::string_view t) { return op::parse_bool(t, key); }).value_or(fallback);
  }
  std::int64_t integer(std::string_view key, std::int64_t fallback) const {
    return parsed(key, [&](std::string_view t) { return op::parse_int(t, key); }).value_or(fallback);
  }
  double real(std::string_view key, double fallback) const {
    return parsed(key, [&](std::string_view t) { return op::parse_double(t, key); }).value_or(fallback);
  }
  std::optional<std::vector<std::int64_t>> tuple(std::string_view key) const {
    return parsed(key, [&](std::string_view t) { return op::parse_tuple(t, key); });
  }
  // A 2-d window attr (kernel, stride, ...): given, or `fallback` on both axes.
  std::string window(std::string_view key, std::int64_t fallback) const {
    auto v = tuple(key);
    if (!v || v->empty()) return op::attr_text(std::vector<std::int64_t>{fallback, fallback});
    if (v->size() != 2) reject(std::string(key) + " must have 2 values (hybra reads 2-d windows only)");
    return op::attr_text(*v);
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
  Symbol make(std::string op, Attrs attrs = {}) const { return make(std::move(op), std::move(attrs), operands()); }
  std::vector<Symbol> operands() const { return std::vector<Symbol>(inputs.begin(), inputs.end()); }
  static Symbol constant(const Tensor& value) { return sym::constant(value); }
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

// A hybra node being written.
struct Writing {
  const graph::Graph& graph;
  const Node& node;

  const Node& input(std::size_t k) const { return graph.nodes[static_cast<std::size_t>(node.inputs[k])]; }
  [[noreturn]] void reject(std::string_view why) const {
    fail<ValueError>("export_model: op '", node.op, "' ", why, " (MXNet's graph format cannot express it)");
  }
  std::string attr(std::string_view key) const { return op::find_attr(node.attrs, key, node.op); }
  // The node as MXNet's `op` with `attrs`, reading all of the node's inputs.
  Written keep_all(std::string op, Attrs attrs = {}) const {
    Written out{std::move(op), std::move(attrs), {}};
    for (std::size_t k = 0; k < node.inputs.size(); ++k) out.inputs.push_back(k);
    return out;
  }
  static std::string bool_text(bool v) { return mx_bool(v); }
  // A graph node's attrs as MXNet spells them (booleans capitalised).
  static Attrs mx_attrs(const Attrs& a) {
    Attrs out;
    for (const auto& [k, v] : a) out.emplace_back(k, v == "true" ? "True" : v == "false" ? "False" : v);
    return out;
  }
};

// One op of both directions.
struct OpRow {
  std::string_view hybra;                 // graph op ("" for an MXNet spelling only read)
  std::vector<std::string_view> mxnet;    // the first is written; all are read
  std::function<Written(const Writing&)> write;
  std::function<Symbol(const Reading&)> read;
};

inline bool is_scalar(const Node& n) { return n.op == "scalar"; }

// The scalar attrs MXNet 1.9 writes: the value, and whether it was an int.
inline Attrs scalar_attrs(const Node& s) {
  const std::string& v = op::find_attr(s.attrs, "value", "scalar");
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

// An elementwise op's MXNet scalar spelling (array op scalar), by op name.
inline std::string scalar_spelling(std::string_view hybra) {
  std::string found;
  op::for_each_op([&](auto op) {
    using Op = decltype(op);
    if constexpr (requires { Op::mxnet_scalar; })
      if (Op::name == hybra) found = Op::mxnet_scalar;
  });
  return found;
}

// An elementwise op's rows, from its spellings (ops/elementwise.hpp): on
// arrays; on an array and a scalar, which moves into the attrs; and for ops
// whose operands do not commute, on a scalar and an array.
template <class Op>
void add_elementwise_rows(std::vector<OpRow>& rows) {
  const std::string name(Op::name);
  if constexpr (requires { Op::mxnet_activation; }) {
    rows.push_back(OpRow{Op::name, {}, [](const Writing& w) {
                           return w.keep_all("Activation", {{"act_type", std::string(Op::mxnet_activation)}});
                         }, nullptr});
  } else if constexpr (requires { Op::mxnet_scalar; }) {
    rows.push_back(OpRow{
        Op::name, std::vector<std::string_view>(std::begin(Op::mxnet), std::end(Op::mxnet)),
        [](const Writing& w) -> Written {
          const bool left = is_scalar(w.input(0)), right = is_scalar(w.input(1));
          if (left && right) w.reject("has two scalar operands");
          if (!left && !right) return w.keep_all(std::string(Op::mxnet[0]));
          if (right) return Written{std::string(Op::mxnet_scalar), scalar_attrs(w.input(1)), {0}};
          if constexpr (requires { Op::mirror; })
            return Written{scalar_spelling(Op::mirror), scalar_attrs(w.input(0)), {1}};
          else if constexpr (requires { Op::mxnet_reversed; })
            return Written{std::string(Op::mxnet_reversed), scalar_attrs(w.input(0)), {1}};
          else
            return Written{std::string(Op::mxnet_scalar), scalar_attrs(w.input(0)), {1}};
        },
        [name](const Reading& r) {
          r.arity(2, 2);
          return r.make(name);
        }});
    auto scalar_read = [name](bool reversed) {
      return [name, reversed](const Reading& r) {
        r.arity(1, 1);
        Symbol s = scalar_of(r);
        if (!reversed) return r.make(name, {}, {r.inputs[0], s});
        return r.make(name, {}, {s, r.inputs[0]});
      };
    };
    rows.push_back(OpRow{"", {Op::mxnet_scalar}, nullptr, scalar_read(false)});
    if constexpr (requires { Op::mxnet_reversed; })
      rows.push_back(OpRow{"", {Op::mxnet_reversed}, nullptr, scalar_read(true)});
  } else {
    rows.push_back(OpRow{Op::name, std::vector<std::string_view>(std::begin(Op::mxnet), std::end(Op::mxnet)),
                         [](const Writing& w) {
                           for (std::size_t k = 0; k < w.node.inputs.size(); ++k)
                             if (is_scalar(w.input(k))) w.reject("has a scalar operand");
                           return w.keep_all(std::string(Op::mxnet[0]));
                         },
                         [name](const Reading& r) {
                           r.arity(Op::arity, Op::arity);
                           return r.make(name);
                         }});
  }
}

// Any other op's row: its entry's spellings, write and read.
template <class Op>
void add_rows(std::vector<OpRow>& rows) {
  if constexpr (op::elementwise<Op>) {
    add_elementwise_rows<Op>(rows);
  } else if constexpr (!op::gradient_only<Op>) {
    static_assert(requires(const Writing& w) { Op::write(w); },
                  "hybra: an op needs write(w), its node as MXNet's (ops/op.hpp)");
    constexpr bool readable = requires(const Reading& r) { Op::read(r); };
    static_assert(readable || Op::mxnet.empty(), "hybra: an op with MXNet spellings needs read(r) (ops/op.hpp)");
    OpRow row{Op::name, std::vector<std::string_view>(Op::mxnet.begin(), Op::mxnet.end()),
              [](const Writing& w) -> Written { return Op::write(w); }, nullptr};
    if constexpr (readable) row.read = [](const Reading& r) -> Symbol { return Op::read(r); };
    rows.push_back(std::move(row));
  }
}

HYBRA_SEPARABLE std::vector<OpRow> op_rows();
#if HYBRA_DEFINE_SEPARABLE
HYBRA_SEPARABLE std::vector<OpRow> op_rows() {
  std::vector<OpRow> rows;
  op::for_each_op([&](auto op) { add_rows<decltype(op)>(rows); });
  // MXNet spellings of compositions of hybra's ops, read only.
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
  // clip is maximum then minimum with scalars (hybra::clip), written as MXNet's two scalar ops.
  rows.push_back(OpRow{"", {"clip"}, nullptr, [](const Reading& r) {
                         r.arity(1, 1);
                         if (!r.attr("a_min") || !r.attr("a_max")) r.reject("attrs 'a_min' and 'a_max' are needed");
                         const Symbol low = graph::scalar_symbol(r.real("a_min", 0));
                         const Symbol high = graph::scalar_symbol(r.real("a_max", 0));
                         return r.make("minimum", {}, {r.make("maximum", {}, {r.inputs[0], low}), high});
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
