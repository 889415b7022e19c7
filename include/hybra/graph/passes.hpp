#pragma once
// Graph passes. Each takes a graph and returns an equivalent one (the same
// outputs for the same inputs, run() being the judge), so each is tested on
// its own; optimize() chains them. Fusion rewrites groups of nodes into one
// node whose `body` is the subgraph it computes (graph.hpp), which the CPU
// planner compiles into one loop.
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "compose.hpp"
#include "graph.hpp"

namespace hybra::graph {

namespace detail {

inline std::vector<std::vector<int>> consumers(const Graph& g) {
  std::vector<std::vector<int>> c(g.nodes.size());
  for (std::size_t i = 0; i < g.nodes.size(); ++i)
    for (int in : g.nodes[i].inputs) c[static_cast<std::size_t>(in)].push_back(static_cast<int>(i));
  return c;
}

inline bool is_output(const Graph& g, int id) {
  return std::find(g.outputs.begin(), g.outputs.end(), id) != g.outputs.end();
}

// Keeps the nodes for which keep[i] is true (in order), with node i's uses
// redirected to replace[i] first.
inline Graph rebuild(const Graph& g, const std::vector<bool>& keep, const std::vector<int>& replace) {
  auto target = [&](int id) {
    while (replace[static_cast<std::size_t>(id)] != id) id = replace[static_cast<std::size_t>(id)];
    return id;
  };
  Graph out;
  std::vector<int> index(g.nodes.size(), -1);
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    if (!keep[i]) continue;
    Node n = g.nodes[i];
    for (int& in : n.inputs) in = index[static_cast<std::size_t>(target(in))];
    index[i] = static_cast<int>(out.nodes.size());
    out.nodes.push_back(std::move(n));
  }
  for (int o : g.outputs) out.outputs.push_back(index[static_cast<std::size_t>(target(o))]);
  return out;
}

inline std::vector<int> identity(const Graph& g) {
  std::vector<int> r(g.nodes.size());
  for (std::size_t i = 0; i < r.size(); ++i) r[i] = static_cast<int>(i);
  return r;
}

// Whether a node's result is a function of its inputs alone (ops/op.hpp's `pure`).
inline bool is_pure(const Node& n) { return is_leaf(n) || n.op == "fused" || find_op(n.op).pure; }

// The random counter blocks one evaluation of n draws: a training dropout
// draws one uniform per element (ops/nn.hpp), every other node none.
inline std::uint64_t draw_blocks(const Node& n, bool training) {
  if (is_pure(n) || !training || op::parse_double(op::find_attr(n.attrs, "rate", n.op), n.op) == 0) return 0;
  return Generator::blocks_for(checked_numel(*n.meta.shape));
}

inline bool is_elementwise(const Node& n) {
  return n.op == "fused" || (!is_leaf(n) && find_op(n.op).elementwise >= 0 && !n.body);
}

// The subgraph of `members` (ascending ids, `root` among them) as a body:
// scalars are copied in, every other outside input becomes a var (the
// `first` one, if given, becomes var 0). Returns the body and, per var, the
// outside node it stands for.
inline std::pair<Graph, std::vector<int>> extract(const Graph& g, const std::vector<int>& members, int root,
                                                  std::optional<int> first = std::nullopt) {
  Graph body;
  std::vector<int> outside;
  std::unordered_map<int, int> local;
  auto use = [&](int id) {
    if (auto it = local.find(id); it != local.end()) return it->second;
    const Node& n = g.nodes[static_cast<std::size_t>(id)];
    if (n.op == "scalar") {
      body.nodes.push_back(n);
    } else {
      body.nodes.push_back(Node{"var", "in" + std::to_string(outside.size()), {}, {}, n.meta, {}, nullptr});
      outside.push_back(id);
    }
    return local[id] = static_cast<int>(body.nodes.size()) - 1;
  };
  if (first) use(*first);
  for (int m : members) {
    Node n = g.nodes[static_cast<std::size_t>(m)];
    if (n.op == "fused") {  // already a body: inline it
      std::vector<int> ids;
      for (int in : n.inputs) ids.push_back(use(in));
      std::unordered_map<int, int> inner;
      std::size_t next_var = 0;
      for (std::size_t k = 0; k < n.body->nodes.size(); ++k) {
        Node b = n.body->nodes[k];
        if (b.op == "var") {
          inner[static_cast<int>(k)] = ids[next_var++];
          continue;
        }
        for (int& in : b.inputs) in = inner.at(in);
        body.nodes.push_back(std::move(b));
        inner[static_cast<int>(k)] = static_cast<int>(body.nodes.size()) - 1;
      }
      local[m] = inner.at(n.body->outputs.front());
      continue;
    }
    for (int& in : n.inputs) in = use(in);
    body.nodes.push_back(std::move(n));
    local[m] = static_cast<int>(body.nodes.size()) - 1;
  }
  body.outputs = {local.at(root)};
  return {std::move(body), std::move(outside)};
}

}  // namespace detail

// Ops that are compositions of others (ops/op.hpp's `decompose`) become
// those nodes, so that fusion joins them with their neighbours: batch_norm's
// multiply and add per channel go into the convolution's epilogue, beside
// the ReLU. Every other node, vars first among them, keeps its place.
inline Graph decompose(const Graph& g) {
  Graph out;
  std::vector<int> index(g.nodes.size(), -1);
  std::unordered_map<std::string, const SymNode*> no_vars;
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    Node n = g.nodes[i];
    for (int& in : n.inputs) in = index[static_cast<std::size_t>(in)];
    const Decomposition rule = is_leaf(n) || n.body || !n.meta.shape ? nullptr : find_decomposition(n.op);
    // The operands as placeholders that stand for nodes already in `out`, alive until the composition is in.
    std::vector<Symbol> operands;
    std::unordered_map<const SymNode*, int> known;
    Symbol composed;
    if (rule) {
      for (std::size_t k = 0; k < n.inputs.size(); ++k) {
        auto placeholder = std::make_shared<SymNode>();
        placeholder->op = "var";
        placeholder->meta = g.nodes[static_cast<std::size_t>(g.nodes[i].inputs[k])].meta;
        known.emplace(placeholder.get(), n.inputs[k]);
        operands.emplace_back(std::move(placeholder));
      }
      composed = rule(RuleContext{operands, n.attrs, "decompose"});
      if (composed.defined() && (composed.node().meta.shape != n.meta.shape || composed.node().meta.dtype != n.meta.dtype)) {
        std::ostringstream os;
        detail::print_meta(os << "graph::decompose: " << n.op << "'s composition gives ", composed.node().meta);
        detail::print_meta(os << " where the op gives ", n.meta);
        fail<ValueError>(os.str());
      }
    }
    if (composed.defined()) {
      index[i] = append(out, composed, known, no_vars);
    } else {
      index[i] = static_cast<int>(out.nodes.size());
      out.nodes.push_back(std::move(n));
    }
  }
  for (int o : g.outputs) out.outputs.push_back(index[static_cast<std::size_t>(o)]);
  return out;
}

// Drops the nodes no output depends on (vars stay: they are the graph's inputs).
inline Graph eliminate_dead_code(const Graph& g) {
  std::vector<bool> live(g.nodes.size(), false);
  for (int o : g.outputs) live[static_cast<std::size_t>(o)] = true;
  for (std::size_t i = g.nodes.size(); i-- > 0;) {
    if (g.nodes[i].op == "var") live[i] = true;
    if (!live[i]) continue;
    for (int in : g.nodes[i].inputs) live[static_cast<std::size_t>(in)] = true;
  }
  return detail::rebuild(g, live, detail::identity(g));
}

// Evaluates every pure node whose inputs are all constants, once, and keeps
// its value as a constant (the chapter's fancy_func(1, 2, 3, 4) becomes 10).
inline Graph fold_constants(const Graph& g) {
  Graph out = g;
  for (auto& n : out.nodes) {
    if (is_leaf(n) || !detail::is_pure(n)) continue;
    bool constant = true;
    std::vector<Tensor> in;
    std::vector<Meta> meta;
    for (int k : n.inputs) {
      const Node& src = out.nodes[static_cast<std::size_t>(k)];
      constant = constant && (src.op == "const" || src.op == "scalar");
      in.push_back(src.value);
      meta.push_back(src.meta);
    }
    if (!constant) continue;
    Tensor value = eval_node(n, in, meta);
    n = Node{"const", {}, {}, {}, Meta{value.shape(), value.dtype(), false}, value, nullptr};
  }
  return eliminate_dead_code(out);
}

// Merges nodes that compute the same thing: the same op and attributes on
// the same inputs (constants: the same tensor; scalars: the same value).
inline Graph eliminate_common_subexpressions(const Graph& g) {
  std::vector<int> replace = detail::identity(g);
  std::map<std::string, int> seen;
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.op == "var" || !detail::is_pure(n)) continue;
    std::ostringstream key;
    key << n.op << '|';
    for (int in : n.inputs) key << replace[static_cast<std::size_t>(in)] << ',';
    for (const auto& [k, v] : n.attrs) key << '|' << k << '=' << v;
    if (n.meta.dtype) key << '|' << name(*n.meta.dtype);
    if (n.op == "const")
      key << '|' << n.value.storage().get() << '@' << n.value.offset() << hybra::to_string(n.value.shape())
          << hybra::to_string(n.value.strides());
    if (n.body) key << "|body" << n.body.get();
    auto [it, fresh] = seen.emplace(key.str(), static_cast<int>(i));
    if (!fresh) replace[i] = it->second;
  }
  std::vector<bool> keep(g.nodes.size());
  for (std::size_t i = 0; i < keep.size(); ++i) keep[i] = replace[i] == static_cast<int>(i);
  return detail::rebuild(g, keep, replace);
}

// Whether a node can be part of a fused loop: an elementwise op whose
// operands all have its dtype (or are scalars, converted once), so that the
// loop computes in one dtype, integers included (an accuracy's
// argmax(y) == label); an op that makes floats of integers has operands of
// another dtype, so it stays out.
inline bool fusable(const Graph& g, const Node& n) {
  if (!detail::is_elementwise(n) || !n.meta.shape || !n.meta.dtype) return false;
  if (is_half(*n.meta.dtype)) return false;  // computed in float32 by the eager op (ops/half.hpp)
  for (int in : n.inputs) {
    const Node& src = g.nodes[static_cast<std::size_t>(in)];
    if (src.op != "scalar" && src.meta.dtype != n.meta.dtype) return false;
  }
  return true;
}

// Gives an elementwise node whose operands have other dtypes than the one it
// computes in the conversions the eager op makes, as nodes of their own: an
// operand becomes astype(it), a where's condition first 1/0 in its own
// dtype, and a scalar takes the operands' common dtype on its way, as the
// eager op takes it. The node then computes in one dtype, so it fuses (and
// on a GPU, the conversions are launches a CUDA graph replays).
inline Graph convert_operands(const Graph& g) {
  Graph out;
  std::vector<int> index(g.nodes.size());
  auto add = [&](Node n) {
    out.nodes.push_back(std::move(n));
    return static_cast<int>(out.nodes.size()) - 1;
  };
  auto scalar = [&](const Tensor& value) {
    const std::string text =
        is_floating(value.dtype()) ? op::attr_text(value.item<double>()) : op::attr_text(value.item<std::int64_t>());
    return add(Node{"scalar", {}, {{"value", text}}, {}, Meta{Shape{}, value.dtype(), true}, value, nullptr});
  };
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    Node n = g.nodes[i];
    for (int& in : n.inputs) in = index[static_cast<std::size_t>(in)];
    if (detail::is_elementwise(n) && n.op != "fused" && n.meta.dtype && !fusable(out, n)) {
      const OpDef& def = find_op(n.op);
      std::vector<Meta> metas;
      for (int in : n.inputs) metas.push_back(out.nodes[static_cast<std::size_t>(in)].meta);
      const std::optional<DType> common = common_dtype(def, metas);
      const DType compute = *n.meta.dtype;
      for (std::size_t k = 0; k < n.inputs.size(); ++k) {
        const Node& src = out.nodes[static_cast<std::size_t>(n.inputs[k])];
        if (src.op == "scalar") {
          if (common && src.value.dtype() != *common) n.inputs[k] = scalar(src.value.astype(*common));
          continue;
        }
        if (!src.meta.dtype || *src.meta.dtype == compute) continue;
        int from = n.inputs[k];
        const Meta meta = src.meta;
        if (k == 0 && def.rule == op::DTypeRule::select)
          from = add(Node{"not_equal", {}, {}, {from, scalar(zeros({}, *meta.dtype))}, meta, {}, nullptr});
        n.inputs[k] = add(Node{"astype", {}, {{"dtype", std::string(name(compute))}}, {from},
                               Meta{meta.shape, compute, false}, {}, nullptr});
      }
    }
    index[i] = add(std::move(n));
  }
  for (int o : g.outputs) out.outputs.push_back(index[static_cast<std::size_t>(o)]);
  return out;
}

// An elementwise value that reads one value of its own shape (besides
// broadcast operands and scalars) and that several elementwise nodes of its
// shape read is computed in each of their loops rather than written once
// and read back: each reader gets a copy of the node, which then fuses with
// it. Each loop reads the one operand where it read the value, and the
// value is never written (BatchNorm's gradient reads x - mean in its sum and
// in dx). Only when that operand is written anyway (not a loop that would
// have joined the value's): otherwise the copies just move the write onto it.
inline Graph recompute_in_readers(const Graph& g) {
  const auto users = detail::consumers(g);
  auto recomputed = [&](std::size_t i) {
    const Node& n = g.nodes[i];
    if (!fusable(g, n) || detail::is_output(g, static_cast<int>(i))) return false;
    std::vector<int> readers = users[i];
    std::sort(readers.begin(), readers.end());
    readers.erase(std::unique(readers.begin(), readers.end()), readers.end());
    if (readers.size() < 2) return false;
    for (int r : readers) {
      const Node& reader = g.nodes[static_cast<std::size_t>(r)];
      if (!fusable(g, reader) || reader.meta.shape != n.meta.shape) return false;
    }
    int full = 0;
    for (int in : n.inputs) {
      const Node& src = g.nodes[static_cast<std::size_t>(in)];
      if (src.op == "scalar" || !src.meta.shape || *src.meta.shape == *n.meta.shape) {
        if (src.op != "scalar" && (++full > 1 || fusable(g, src))) return false;
      } else if (checked_numel(*src.meta.shape) >= checked_numel(*n.meta.shape)) {
        return false;
      }
    }
    return true;
  };
  std::vector<bool> copied(g.nodes.size());
  for (std::size_t i = 0; i < g.nodes.size(); ++i) copied[i] = recomputed(i);
  Graph out;
  std::vector<int> index(g.nodes.size(), -1);
  for (std::size_t j = 0; j < g.nodes.size(); ++j) {
    if (copied[j]) continue;
    Node n = g.nodes[j];
    std::unordered_map<int, int> copy;  // this reader's copy of each value it recomputes
    for (int& in : n.inputs) {
      const auto k = static_cast<std::size_t>(in);
      if (!copied[k]) {
        in = index[k];
        continue;
      }
      auto [at, fresh] = copy.emplace(in, static_cast<int>(out.nodes.size()));
      if (fresh) {
        Node c = g.nodes[k];
        for (int& operand : c.inputs) operand = index[static_cast<std::size_t>(operand)];
        out.nodes.push_back(std::move(c));
      }
      in = at->second;
    }
    index[j] = static_cast<int>(out.nodes.size());
    out.nodes.push_back(std::move(n));
  }
  for (int o : g.outputs) out.outputs.push_back(index[static_cast<std::size_t>(o)]);
  return out;
}

// Chains of elementwise nodes become one "fused" node: a node joins the
// group of its consumers when they all belong to one (x * x; (a + x) + x)
// and it has the group's shape (a smaller, broadcast operand stays outside
// and is read with stride 0).
inline Graph fuse_elementwise(const Graph& g) {
  const auto users = detail::consumers(g);
  std::vector<int> group(g.nodes.size(), -1);
  for (std::size_t i = g.nodes.size(); i-- > 0;) {
    const Node& n = g.nodes[i];
    if (!fusable(g, n)) continue;
    group[i] = static_cast<int>(i);
    const auto& u = users[i];
    if (u.empty() || detail::is_output(g, static_cast<int>(i))) continue;
    const int root = group[static_cast<std::size_t>(u.front())];
    const bool one_group =
        std::all_of(u.begin(), u.end(), [&](int c) { return group[static_cast<std::size_t>(c)] == root; });
    if (root >= 0 && one_group && g.nodes[static_cast<std::size_t>(root)].meta.shape == n.meta.shape) group[i] = root;
  }
  Graph out = g;
  for (std::size_t root = 0; root < g.nodes.size(); ++root) {
    if (group[root] != static_cast<int>(root)) continue;
    std::vector<int> members;
    for (std::size_t i = 0; i <= root; ++i)
      if (group[i] == static_cast<int>(root)) members.push_back(static_cast<int>(i));
    if (members.size() < 2) continue;
    auto [body, outside] = detail::extract(g, members, static_cast<int>(root));
    out.nodes[root] = Node{"fused", {}, {}, outside, g.nodes[root].meta, {}, std::make_shared<const Graph>(std::move(body))};
  }
  return eliminate_dead_code(out);
}

// A product (an op whose entry says so: fully_connected, matmul, conv2d)
// whose result is used only by an elementwise node or fused group of the
// same shape takes that group as its epilogue: bias-add and activation are applied to the product's result in
// place, right after it is computed, with no separate step or buffer.
inline Graph fuse_epilogues(const Graph& g) {
  const auto users = detail::consumers(g);
  Graph out = g;
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (!fusable(g, n)) continue;
    for (int in : n.inputs) {
      const Node& p = g.nodes[static_cast<std::size_t>(in)];
      const bool is_product = !is_leaf(p) && p.op != "fused" && find_op(p.op).product;
      if (!is_product || p.body || users[static_cast<std::size_t>(in)].size() != 1 || detail::is_output(g, in) ||
          p.meta.shape != n.meta.shape || p.meta.dtype != n.meta.dtype)
        continue;
      auto [body, outside] = detail::extract(g, {static_cast<int>(i)}, static_cast<int>(i), in);
      Node product = p;
      product.inputs.insert(product.inputs.end(), outside.begin() + 1, outside.end());
      product.meta = n.meta;
      product.body = std::make_shared<const Graph>(std::move(body));
      out.nodes[i] = std::move(product);
      break;
    }
  }
  return eliminate_dead_code(out);
}

// Every pass, in order.
inline Graph optimize(const Graph& g) {
  Graph out = fold_constants(convert_operands(decompose(g)));
  out = eliminate_common_subexpressions(out);
  out = eliminate_dead_code(out);
  out = fuse_elementwise(recompute_in_readers(out));
  return fuse_epilogues(out);
}

}  // namespace hybra::graph
