#pragma once
// Symbol: a value of a graph that is being built, Gluon's `F = symbol`.
// `sym::var("data")` names an input; op-table functions and Yap expressions
// over symbols (`relu(x * w + 1)`) add nodes instead of computing. A model's
// forward written once as a template over its argument type (Tensor or
// Symbol) therefore runs eagerly or builds its graph, from the same code.
//
// Each node's shape and dtype are inferred as it is made (registry.hpp), so
// `x.shape()` works while tracing and a mismatch is reported by the line of
// the model that made it. A var made without a shape leaves the shapes
// below it unknown until the graph is bound (graph.hpp).
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "../expr/fold.hpp"
#include "../expr/kernel.hpp"
#include "registry.hpp"

namespace hybra {

namespace graph {
// A node of the graph under construction; its inputs are shared, so symbols
// are cheap to copy and a subgraph used twice is one subgraph.
struct SymNode {
  std::string op;    // "var", "const", "scalar", or an op of the registry
  std::string name;  // a var's name
  op::Attrs attrs;
  std::vector<std::shared_ptr<const SymNode>> inputs;
  Meta meta;
  Tensor value;  // const: its value; scalar: a 0-d tensor of the C++ scalar's dtype
};
}  // namespace graph

namespace detail {
template <class T>
inline constexpr bool dependent_false = false;
}

class Symbol {
 public:
  Symbol() = default;
  explicit Symbol(std::shared_ptr<const graph::SymNode> node) : node_(std::move(node)) {}
  // An expression over symbols becomes nodes of the graph (one per op).
  template <yap_expression E>
    requires contains_symbol_v<E>
  Symbol(E&& e);  // NOLINT(google-explicit-constructor): `Symbol y = relu(x * w + 1);`

  bool defined() const { return node_ != nullptr; }
  const graph::SymNode& node() const { return *require("node").node_; }
  const std::shared_ptr<const graph::SymNode>& node_ptr() const { return node_; }
  // A var's name, or the op that makes this symbol.
  const std::string& name() const { return node().op == "var" ? node_->name : node_->op; }
  bool has_shape() const { return node().meta.shape.has_value(); }
  const Shape& shape() const {
    if (!has_shape())
      fail<ShapeError>("symbol '", name(), "': its shape is unknown (give sym::var a shape, or call the block with a "
                       "tensor so that it is captured with the tensor's shape)");
    return *node_->meta.shape;
  }
  DType dtype() const {
    if (!node().meta.dtype) fail<DTypeError>("symbol '", name(), "': its dtype is unknown until the graph is bound");
    return *node_->meta.dtype;
  }
  int ndim() const { return static_cast<int>(shape().size()); }
  std::int64_t size() const { return checked_numel(shape()); }
  Symbol astype(DType d) const;

  // What only a Tensor can do. A symbol has no values while the graph is
  // built, so each of these is a compile error that says why.
  template <class T = float>
  std::vector<T> to_vector() const {
    static_assert(detail::dependent_false<T>,
                  "hybra: Symbol::to_vector: a symbol has no values while its graph is built; read the values of "
                  "the Tensor the block returns");
    return {};
  }
  template <class T = float>
  T item() const {
    static_assert(detail::dependent_false<T>,
                  "hybra: Symbol::item: a symbol has no value while its graph is built, so a branch on it cannot be "
                  "captured; use where(condition, a, b), or keep the code eager (a Block, not a HybridBlock)");
    return {};
  }
  template <class T = float>
  T* data() const {
    static_assert(detail::dependent_false<T>, "hybra: Symbol::data: a symbol has no data while its graph is built");
    return nullptr;
  }
  template <class T = void>
  void wait_to_read() const {
    static_assert(detail::dependent_false<T>, "hybra: Symbol::wait_to_read: a symbol is not computed; only tensors are");
  }
  template <class E>
  Symbol& assign(E&&) {
    static_assert(detail::dependent_false<E>,
                  "hybra: Symbol::assign: a graph cannot be written in place; build a new symbol (y = f(x)) instead");
    return *this;
  }
  template <class B>
    requires std::same_as<B, bool>
  explicit operator B() const {
    static_assert(!std::same_as<B, bool>,
                  "hybra: `if` on a symbol cannot be captured into a graph (a symbol has no value while the graph is "
                  "built); use where(condition, a, b) instead");
  }

  const Symbol& require(const char* what) const {
    if (!node_) fail<ValueError>(what, ": the symbol is empty (default-constructed)");
    return *this;
  }

 private:
  std::shared_ptr<const graph::SymNode> node_;
};

// `<Symbol data>`, as Gluon prints a symbol; with its shape when known.
inline std::ostream& operator<<(std::ostream& os, const Symbol& s) {
  if (!s.defined()) return os << "<Symbol (empty)>";
  os << "<Symbol " << s.name();
  if (s.has_shape()) print_shape(os << ' ', s.shape());
  return os << '>';
}

namespace graph {

inline Symbol make_symbol(std::string op, op::Attrs attrs, std::vector<Symbol> inputs) {
  auto n = std::make_shared<SymNode>();
  const OpDef& def = find_op(op);
  std::vector<Meta> metas;
  for (const auto& s : inputs) {
    n->inputs.push_back(s.require(def.name.data()).node_ptr());
    metas.push_back(s.node().meta);
  }
  n->meta = infer(def, metas, attrs);
  n->op = std::move(op);
  n->attrs = std::move(attrs);
  return Symbol(std::move(n));
}

template <class S>
Symbol scalar_symbol(S v) {
  using T = kernel::scalar_type_t<S>;
  auto n = std::make_shared<SymNode>();
  n->op = "scalar";
  n->meta = Meta{Shape{}, dtype_of_v<T>, true};
  n->value = array<T>(std::vector<T>{static_cast<T>(v)}, Shape{});
  n->attrs = {{"value", std::is_floating_point_v<T> ? op::attr_text(static_cast<double>(v))
                                                    : op::attr_text(static_cast<std::int64_t>(v))}};
  return Symbol(std::move(n));
}

}  // namespace graph

template <class S>
S op::make_node(std::string name, op::Attrs attrs, std::vector<S> inputs) {
  return graph::make_symbol(std::move(name), std::move(attrs), std::move(inputs));
}

namespace sym {

// An input of the graph. Without a shape, shapes below it stay unknown
// until the graph is bound to inputs.
inline Symbol var(std::string name, std::optional<Shape> shape = std::nullopt, DType dtype = DType::float32) {
  if (name.empty()) fail<ValueError>("sym::var: a var needs a name");
  auto n = std::make_shared<graph::SymNode>();
  n->op = "var";
  n->name = std::move(name);
  n->meta = graph::Meta{std::move(shape), dtype, false};
  return Symbol(std::move(n));
}

// A constant of the graph: the tensor's value when the graph is built.
inline Symbol constant(const Tensor& value) {
  auto n = std::make_shared<graph::SymNode>();
  n->op = "const";
  n->value = value.require("sym::constant");
  n->meta = graph::Meta{value.shape(), value.dtype(), false};
  return Symbol(std::move(n));
}
// A 0-d constant of the scalar's dtype (int -> int32, double -> float64).
template <class V>
  requires std::is_arithmetic_v<V>
Symbol constant(V v) {
  using T = kernel::scalar_type_t<V>;
  return constant(array<T>(std::vector<T>{static_cast<T>(v)}, Shape{}));
}

}  // namespace sym

// Any operand as a symbol: a Symbol, an expression over symbols (its nodes),
// or a tensor or tensor expression (a constant of its value).
template <array_like X>
Symbol to_symbol(X&& x) {
  if constexpr (std::is_same_v<std::remove_cvref_t<X>, Symbol>) return x;
  else if constexpr (symbol_like<X>) return Symbol(x);
  else return sym::constant(eval(x));
}

template <yap_expression E>
  requires contains_symbol_v<E>
Symbol::Symbol(E&& e) {
  auto leaf = [](const auto& v) -> Symbol {
    using V = std::remove_cvref_t<decltype(v)>;
    if constexpr (std::is_same_v<V, Symbol>) return v.require("expression");
    else if constexpr (std::is_same_v<V, Tensor>) return sym::constant(v);
    else return graph::scalar_symbol(v);
  };
  auto node = [](auto op, const auto&... operands) -> Symbol {
    return graph::make_symbol(std::string(decltype(op)::name), {}, {operands...});
  };
  *this = fold(e, leaf, node);
}

inline Symbol Symbol::astype(DType d) const { return graph::make_symbol("astype", {{"dtype", std::string(hybra::name(d))}}, {*this}); }

// The op table's non-elementwise ops on symbols: each adds its node. Mixed
// operands are fine (a tensor becomes a constant).
template <array_like A, array_like B>
  requires(symbol_like<A> || symbol_like<B>)
Symbol matmul(A&& a, B&& b) {
  return graph::make_symbol("matmul", {}, {to_symbol(a), to_symbol(b)});
}
template <array_like A, array_like B>
  requires(symbol_like<A> || symbol_like<B>)
Symbol dot(A&& a, B&& b) {
  return graph::make_symbol("dot", {}, {to_symbol(a), to_symbol(b)});
}

namespace graph::detail {
inline Symbol reduction(std::string op, const Symbol& x, const Axes& axes, bool keepdims) {
  return make_symbol(std::move(op), reduce_attrs(axes, keepdims), {x});
}
}  // namespace graph::detail

template <symbol_like X>
Symbol sum(X&& x, const Axes& axes = {}, bool keepdims = false) {
  return graph::detail::reduction("sum", to_symbol(x), axes, keepdims);
}
template <symbol_like X>
Symbol mean(X&& x, const Axes& axes = {}, bool keepdims = false) {
  return graph::detail::reduction("mean", to_symbol(x), axes, keepdims);
}
template <symbol_like X>
Symbol max(X&& x, const Axes& axes = {}, bool keepdims = false) {
  return graph::detail::reduction("max", to_symbol(x), axes, keepdims);
}
template <symbol_like X>
Symbol min(X&& x, const Axes& axes = {}, bool keepdims = false) {
  return graph::detail::reduction("min", to_symbol(x), axes, keepdims);
}
template <symbol_like X>
Symbol argmax(X&& x, std::optional<std::int64_t> axis = std::nullopt, bool keepdims = false) {
  return graph::make_symbol("argmax", {{"axis", op::attr_text(axis)}, {"keepdims", op::attr_text(keepdims)}},
                            {to_symbol(x)});
}
template <symbol_like X>
Symbol softmax(X&& x, std::int64_t axis = -1) {
  return graph::make_symbol("softmax", axis_attrs(axis), {to_symbol(x)});
}
template <symbol_like X>
Symbol log_softmax(X&& x, std::int64_t axis = -1) {
  return graph::make_symbol("log_softmax", axis_attrs(axis), {to_symbol(x)});
}
template <symbol_like X>
Symbol reshape(X&& x, const Shape& shape) {
  return graph::make_symbol("reshape", reshape_attrs(shape), {to_symbol(x)});
}
template <symbol_like X>
Symbol transpose(X&& x, const std::vector<std::int64_t>& axes) {
  return graph::make_symbol("transpose", transpose_attrs(axes), {to_symbol(x)});
}
template <symbol_like X>
Symbol transpose(X&& x) {
  return graph::make_symbol("transpose", transpose_attrs(std::nullopt), {to_symbol(x)});
}
template <symbol_like X>
Symbol slice(X&& x, std::int64_t axis, std::optional<std::int64_t> begin, std::optional<std::int64_t> end,
             std::int64_t step = 1) {
  return graph::make_symbol("slice", slice_attrs(axis, begin, end, step), {to_symbol(x)});
}
template <class S>  // a template, so that concat({}) still means the tensor overload
  requires std::same_as<S, Symbol>
Symbol concat(const std::vector<S>& symbols, std::int64_t axis = 0) {
  return graph::make_symbol("concat", axis_attrs(axis), symbols);
}
template <symbol_like X>
Symbol broadcast_to(X&& x, const Shape& shape) {
  return graph::make_symbol("broadcast_to", reshape_attrs(shape), {to_symbol(x)});
}
template <symbol_like X>
Symbol flatten(X&& x) {
  return graph::make_symbol("flatten", {}, {to_symbol(x)});
}
template <symbol_like X>
Symbol fully_connected(X&& x, const Symbol& weight, const Symbol& bias = {}) {
  std::vector<Symbol> in{to_symbol(x), weight};
  if (bias.defined()) in.push_back(bias);
  return graph::make_symbol("fully_connected", {}, std::move(in));
}
template <symbol_like X>
Symbol dropout(X&& x, double rate) {
  return graph::make_symbol("dropout", {{"rate", op::attr_text(rate)}}, {to_symbol(x)});
}

namespace graph::detail {
inline Symbol pool2d(std::string type, bool global, const Symbol& x, Size2d kernel, Size2d stride, Size2d padding,
                     bool count_include_pad, PoolingConvention convention) {
  return make_symbol("pool2d",
                     pool2d_attrs(std::move(type), global, kernel, stride, padding, count_include_pad, convention), {x});
}
}  // namespace graph::detail

// The node's kernel and num_filter attributes come from the weight's shape,
// which must be known (a parameter's always is once its block has seen the input).
template <symbol_like X>
Symbol conv2d(X&& x, const Symbol& weight, const Symbol& bias = {}, Size2d stride = 1, Size2d padding = 0,
              Size2d dilation = 1, std::int64_t groups = 1) {
  op::Attrs attrs =
      conv2d_attrs(weight.require("conv2d").shape(), stride, padding, dilation, groups, bias.defined());
  std::vector<Symbol> in{to_symbol(x), weight};
  if (bias.defined()) in.push_back(bias);
  return graph::make_symbol("conv2d", std::move(attrs), std::move(in));
}
template <symbol_like X>
Symbol max_pool2d(X&& x, Size2d kernel, Size2d stride, Size2d padding = 0,
                  PoolingConvention convention = PoolingConvention::valid) {
  return graph::detail::pool2d("max", false, to_symbol(x), kernel, stride, padding, true, convention);
}
template <symbol_like X>
Symbol avg_pool2d(X&& x, Size2d kernel, Size2d stride, Size2d padding = 0, bool count_include_pad = true,
                  PoolingConvention convention = PoolingConvention::valid) {
  return graph::detail::pool2d("avg", false, to_symbol(x), kernel, stride, padding, count_include_pad, convention);
}
template <symbol_like X>
Symbol global_avg_pool2d(X&& x) {
  return graph::detail::pool2d("avg", true, to_symbol(x), 1, 1, 0, true, PoolingConvention::valid);
}
template <symbol_like X>
Symbol global_max_pool2d(X&& x) {
  return graph::detail::pool2d("max", true, to_symbol(x), 1, 1, 0, true, PoolingConvention::valid);
}
template <symbol_like X>
Symbol batch_norm(X&& x, const Symbol& gamma, const Symbol& beta, const Symbol& running_mean,
                  const Symbol& running_var, double eps = 1e-5, std::int64_t axis = 1) {
  return graph::make_symbol("batch_norm", batch_norm_attrs(eps, axis),
                            {to_symbol(x), gamma, beta, running_mean, running_var});
}
template <symbol_like X>
Symbol batch_norm_training(X&& x, const Symbol& gamma, const Symbol& beta, const Symbol& mean, const Symbol& var,
                           double eps = 1e-5, std::int64_t axis = 1) {
  return graph::make_symbol("batch_norm_training", batch_norm_attrs(eps, axis), {to_symbol(x), gamma, beta, mean, var});
}

}  // namespace hybra
