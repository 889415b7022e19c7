#pragma once
// The graph IR: the nodes reachable from some output symbols, numbered in
// topological order. Passes (passes.hpp) rewrite it, the CPU planner
// (jit/plan.hpp) compiles it, and run() interprets it node by node with
// the eager ops: the reference every optimised form is tested against.
#include <algorithm>
#include <functional>
#include <memory>
#include <ostream>
#include <span>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "symbol.hpp"

namespace hybra::graph {

struct Graph;

struct Node {
  std::string op;  // "var", "const", "scalar", "fused", or an op of the registry
  std::string name;
  op::Attrs attrs;
  std::vector<int> inputs;
  Meta meta;
  Tensor value;  // const and scalar nodes
  // "fused": the elementwise subgraph it computes in one loop, whose vars are
  // this node's inputs in order. A matrix product with an epilogue: the
  // elementwise subgraph applied to its result, whose var 0 is that result
  // and whose other vars are this node's inputs after the product's own.
  std::shared_ptr<const Graph> body;
};

struct Graph {
  std::vector<Node> nodes;
  std::vector<int> outputs;

  std::vector<int> vars() const {
    std::vector<int> ids;
    for (std::size_t i = 0; i < nodes.size(); ++i)
      if (nodes[i].op == "var") ids.push_back(static_cast<int>(i));
    return ids;
  }
};

inline bool is_leaf(const Node& n) { return n.op == "var" || n.op == "const" || n.op == "scalar"; }

// How many of a node's inputs belong to its own op (the rest feed its epilogue).
inline std::size_t own_inputs(const Node& n) {
  if (!n.body || n.op == "fused") return n.inputs.size();
  return n.inputs.size() - (n.body->vars().size() - 1);
}

// Appends to g the nodes `out` depends on that `id` does not number yet
// (operands first), numbering them in `id`; returns out's number. Two
// different vars may not share a name (inputs are bound by name).
inline int append(Graph& g, const Symbol& out, std::unordered_map<const SymNode*, int>& id,
                  std::unordered_map<std::string, const SymNode*>& var_names) {
  std::vector<std::pair<const SymNode*, std::size_t>> stack;
  stack.emplace_back(&out.require("graph::trace").node(), 0);
  while (!stack.empty()) {
    auto& [n, next] = stack.back();
    if (id.count(n)) {
      stack.pop_back();
      continue;
    }
    if (next < n->inputs.size()) {
      stack.emplace_back(n->inputs[next++].get(), 0);
      continue;
    }
    if (n->op == "var") {
      auto [it, fresh] = var_names.emplace(n->name, n);
      if (!fresh && it->second != n)
        fail<ValueError>("graph: two different vars are named '", n->name, "'; inputs are bound by name");
    }
    Node node{n->op, n->name, n->attrs, {}, n->meta, n->value, nullptr};
    for (const auto& in : n->inputs) node.inputs.push_back(id.at(in.get()));
    id.emplace(n, static_cast<int>(g.nodes.size()));
    g.nodes.push_back(std::move(node));
    stack.pop_back();
  }
  return id.at(&out.node());
}

// The graph of everything the outputs depend on.
inline Graph trace(const std::vector<Symbol>& outputs) {
  Graph g;
  std::unordered_map<const SymNode*, int> id;
  std::unordered_map<std::string, const SymNode*> var_names;
  for (const auto& out : outputs) g.outputs.push_back(append(g, out, id, var_names));
  return g;
}

namespace detail {

inline void print_meta(std::ostream& os, const Meta& m) {
  if (m.shape) print_shape(os, *m.shape);
  else os << "(?)";
  os << ' ' << (m.dtype ? name(*m.dtype) : "?");
  if (m.weak) os << " weak";
}

// An elementwise body as one expression: `relu(($0 * $1) + 2)`, $k its var k.
inline std::string body_expression(const Graph& body, int id) {
  const Node& n = body.nodes[static_cast<std::size_t>(id)];
  if (n.op == "var") {
    auto vars = body.vars();
    return "$" + std::to_string(std::find(vars.begin(), vars.end(), id) - vars.begin());
  }
  if (n.op == "scalar") return n.attrs.front().second;
  if (n.op == "const") {
    std::ostringstream os;
    os << "const";
    print_shape(os, n.value.shape());
    return os.str();
  }
  const OpDef& def = find_op(n.op);
  std::vector<std::string> args;
  for (int in : n.inputs) args.push_back(body_expression(body, in));
  if (!def.symbol.empty() && args.size() == 2) return "(" + args[0] + " " + std::string(def.symbol) + " " + args[1] + ")";
  if (!def.symbol.empty() && args.size() == 1) return std::string(def.symbol) + args[0];
  std::string s(def.name);
  s += '(';
  for (std::size_t i = 0; i < args.size(); ++i) s += (i ? ", " : "") + args[i];
  return s + ')';
}

}  // namespace detail

// One line per node: `%4 = fully_connected(%0, %1, %2) : (1, 256) float32`.
inline std::ostream& operator<<(std::ostream& os, const Graph& g) {
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    os << '%' << i << " = ";
    if (n.op == "var") os << "var " << n.name;
    else if (n.op == "scalar") os << "scalar " << n.attrs.front().second;
    else if (n.op == "const" && n.value.size() == 1) os << "const " << n.value.contiguous().to_vector<double>()[0];
    else if (n.op == "const") os << "const";
    else {
      os << n.op << '(';
      for (std::size_t k = 0; k < n.inputs.size(); ++k) os << (k ? ", %" : "%") << n.inputs[k];
      os << ')';
      if (n.body) os << (n.op == "fused" ? " [" : " epilogue[") << detail::body_expression(*n.body, n.body->outputs.front()) << ']';
      for (const auto& [k, v] : n.attrs) os << ' ' << k << '=' << v;
    }
    detail::print_meta(os << " : ", n.meta);
    os << '\n';
  }
  os << "return";
  for (int o : g.outputs) os << " %" << o;
  return os << '\n';
}

inline std::string to_string(const Graph& g) {
  std::ostringstream os;
  os << g;
  return os.str();
}

// Recomputes every node's shape and dtype from its inputs' (after the vars'
// metas were set, or a pass rewrote nodes). Errors name the op and shapes.
inline void infer(Graph& g);

inline Meta infer_node(const Node& n, std::span<const Meta> in) {
  if (is_leaf(n)) return n.meta;
  if (n.op == "fused") {
    Graph body = *n.body;
    auto vars = body.vars();
    for (std::size_t k = 0; k < vars.size(); ++k) body.nodes[static_cast<std::size_t>(vars[k])].meta = in[k];
    infer(body);
    return body.nodes[static_cast<std::size_t>(body.outputs.front())].meta;
  }
  const std::size_t own = own_inputs(n);
  Meta out = infer(find_op(n.op), in.first(own), n.attrs);
  if (!n.body) return out;
  std::vector<Meta> epilogue_in{out};
  epilogue_in.insert(epilogue_in.end(), in.begin() + static_cast<std::ptrdiff_t>(own), in.end());
  Node fused{"fused", {}, {}, {}, {}, {}, n.body};
  return infer_node(fused, epilogue_in);
}

inline void infer(Graph& g) {
  for (auto& n : g.nodes) {
    std::vector<Meta> in;
    for (int i : n.inputs) in.push_back(g.nodes[static_cast<std::size_t>(i)].meta);
    n.meta = infer_node(n, in);
  }
}

// Gives each var the shape and dtype of the tensor bound to it, then infers the rest.
inline void bind(Graph& g, const std::unordered_map<std::string, Meta>& vars) {
  for (auto& n : g.nodes) {
    if (n.op != "var") continue;
    auto it = vars.find(n.name);
    if (it == vars.end()) fail<ValueError>("graph: input '", n.name, "' is not bound");
    n.meta = it->second;
  }
  infer(g);
}

// Computes one non-leaf node from its inputs' values with the eager ops.
// Scalar operands of elementwise ops convert to the op's common dtype first,
// as they would in a fused expression.
inline Tensor eval_node(const Node& n, std::span<const Tensor> in, std::span<const Meta> in_meta);

namespace detail {
inline std::vector<Tensor> run_values(const Graph& g, std::span<const Tensor> var_values) {
  std::vector<Tensor> values(g.nodes.size());
  std::size_t next_var = 0;
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.op == "var") {
      values[i] = var_values[next_var++];
    } else if (n.op == "const" || n.op == "scalar") {
      values[i] = n.value;
    } else {
      std::vector<Tensor> in;
      std::vector<Meta> meta;
      for (int k : n.inputs) {
        in.push_back(values[static_cast<std::size_t>(k)]);
        meta.push_back(g.nodes[static_cast<std::size_t>(k)].meta);
      }
      values[i] = eval_node(n, in, meta);
    }
  }
  return values;
}
}  // namespace detail

inline Tensor eval_node(const Node& n, std::span<const Tensor> in, std::span<const Meta> in_meta) {
  if (n.op == "fused") return detail::run_values(*n.body, in)[static_cast<std::size_t>(n.body->outputs.front())];
  const OpDef& def = find_op(n.op);
  const std::size_t own = own_inputs(n);
  Tensor out;
  if (def.elementwise >= 0) {
    auto common = common_dtype(def, in_meta);
    std::vector<Tensor> operands(in.begin(), in.end());
    // A scalar's value is a 0-d tensor on the default device: it joins the
    // other operands on theirs (a gradient rule run on cpu(1), say).
    const auto strong = std::find_if(in_meta.begin(), in_meta.end(), [](const Meta& m) { return !m.weak; });
    for (std::size_t k = 0; k < operands.size(); ++k) {
      if (!in_meta[k].weak) continue;
      if (common && operands[k].dtype() != *common) operands[k] = operands[k].astype(*common);
      if (strong != in_meta.end())
        operands[k] = operands[k].to(in[static_cast<std::size_t>(strong - in_meta.begin())].device());
    }
    out = def.eval(operands, n.attrs);
  } else {
    out = def.eval(in.first(own), n.attrs);
  }
  if (!n.body) return out;
  std::vector<Tensor> epilogue_in{out};
  epilogue_in.insert(epilogue_in.end(), in.begin() + static_cast<std::ptrdiff_t>(own), in.end());
  return detail::run_values(*n.body, epilogue_in)[static_cast<std::size_t>(n.body->outputs.front())];
}

// The graph's outputs rebuilt as symbols, each var replaced by `var(node)`:
// a captured or imported graph spliced into a graph being built.
inline std::vector<Symbol> replay(const Graph& g, const std::function<Symbol(const Node&)>& var) {
  std::vector<Symbol> values(g.nodes.size());
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.op == "var") {
      values[i] = var(n);
    } else if (is_leaf(n)) {
      auto leaf = std::make_shared<SymNode>();
      leaf->op = n.op;
      leaf->name = n.name;
      leaf->attrs = n.attrs;
      leaf->meta = n.meta;
      leaf->value = n.value;
      values[i] = Symbol(std::move(leaf));
    } else {
      if (n.body) fail<ValueError>("graph::replay: node ", i, " is fused; replay the graph before optimisation");
      std::vector<Symbol> in;
      for (int k : n.inputs) in.push_back(values[static_cast<std::size_t>(k)]);
      values[i] = make_symbol(n.op, n.attrs, std::move(in));
    }
  }
  std::vector<Symbol> out;
  for (int o : g.outputs) out.push_back(values[static_cast<std::size_t>(o)]);
  return out;
}

// Interprets the graph: each var takes the tensor bound to its name, each
// node runs its eager op. Returns the outputs' values.
inline std::vector<Tensor> run(const Graph& g, const std::unordered_map<std::string, Tensor>& inputs) {
  std::vector<Tensor> var_values;
  for (int v : g.vars()) {
    const Node& n = g.nodes[static_cast<std::size_t>(v)];
    auto it = inputs.find(n.name);
    if (it == inputs.end()) fail<ValueError>("graph: input '", n.name, "' is not bound");
    const Tensor& t = it->second.require(n.name.c_str());
    if ((n.meta.shape && *n.meta.shape != t.shape()) || (n.meta.dtype && *n.meta.dtype != t.dtype()))
      fail<ShapeError>("graph: input '", n.name, "' is ", hybra::to_string(t.shape()), ' ', name(t.dtype()),
                       " but the graph was built for ", hybra::to_string(n.meta.shape.value_or(t.shape())), ' ',
                       name(n.meta.dtype.value_or(t.dtype())));
    var_values.push_back(t);
  }
  auto values = detail::run_values(g, var_values);
  std::vector<Tensor> out;
  for (int o : g.outputs) out.push_back(values[static_cast<std::size_t>(o)]);
  return out;
}

}  // namespace hybra::graph
