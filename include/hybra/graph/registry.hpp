#pragma once
// The graph's view of the op table (ops/table.hpp): every op a graph node can
// name, with the facets the graph, its passes and the plan read at run time,
// generated from each op's entry (ops/op.hpp). A node's shape and dtype are
// inferred by running the op's own eager function on meta tensors
// (core/device.hpp), so each op has one shape rule and one set of error
// messages, in whichever mode it runs.
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../core/separate_compilation.hpp"
#include "../expr/elementwise_op.hpp"
#include "../ops/table.hpp"
#include "../ops/attrs.hpp"

namespace hybra::graph {

struct OpDef {
  std::string_view name;
  int arity;             // -1: one or more (concat)
  int elementwise = -1;  // index into op::elementwise_ops, or -1
  op::DTypeRule rule = op::DTypeRule::promote;
  std::string_view symbol;  // elementwise: the C++ infix operator, or ""

  // The eager op on tensors. Elementwise ops receive every operand as a
  // tensor: scalar operands arrive as 0-d tensors of the node's common dtype.
  Tensor (*eval)(std::span<const Tensor> in, const op::Attrs& attrs) = nullptr;
  void (*eval_into)(std::span<const Tensor> in, const Tensor& out, const op::Attrs& attrs) = nullptr;
  bool gradient_only = false;
  bool pure = true;
  bool product = false;
  std::int64_t (*multiply_adds)(std::span<const Tensor> in, const Tensor& out) = nullptr;
  std::optional<backend::cuda::CudaLaunch> (*cuda_launch)(std::span<const Tensor> in, const Tensor& out,
                                                          const op::Attrs& attrs, backend::cuda::Gpu& gpu) = nullptr;
};

namespace detail {

template <class Op>
Tensor eval_elementwise(std::span<const Tensor> in, const op::Attrs&) {
  return hybra::detail::run_elementwise(op::elementwise_index<Op>(), Op::rule, Op::name, in);
}

template <class Op>
OpDef op_def() {
  OpDef d{};
  d.name = Op::name;
  d.arity = op::arity_of<Op>;
  if constexpr (op::elementwise<Op>) {
    d.elementwise = op::elementwise_index<Op>();
    d.rule = Op::rule;
    d.symbol = Op::symbol;
    d.eval = &eval_elementwise<Op>;
  } else {
    d.eval = &Op::eval;
  }
  d.gradient_only = op::gradient_only<Op>;
  d.pure = op::pure<Op>;
  d.product = op::product<Op>;
  if constexpr (op::has_eval_into<Op>) d.eval_into = &Op::eval_into;
  if constexpr (op::has_multiply_adds<Op>) d.multiply_adds = &Op::multiply_adds;
  if constexpr (op::has_cuda_launch<Op>) d.cuda_launch = &Op::cuda_launch;
  return d;
}

HYBRA_SEPARABLE std::vector<OpDef> op_defs();
#if HYBRA_DEFINE_SEPARABLE
HYBRA_SEPARABLE std::vector<OpDef> op_defs() {
  std::vector<OpDef> defs;
  op::for_each_op([&](auto op) { defs.push_back(op_def<decltype(op)>()); });
  return defs;
}
#endif

}  // namespace detail

// What inference knows of a value: shape and dtype when known (a symbol
// made without a shape has none until the graph is bound to inputs), and
// whether it is a weak C++ scalar (core/dtype.hpp).
struct Meta {
  std::optional<Shape> shape;
  std::optional<DType> dtype;
  bool weak = false;
};

// The entry for an op name; an unknown name is a ValueError naming it. The
// table is never destroyed: work the engine still runs at exit (a plan's
// call no one waited for) looks ops up after static destructors have run.
inline const OpDef& find_op(std::string_view name) {
  static const auto* const table = [] {
    auto* t = new std::unordered_map<std::string_view, OpDef>;
    for (const auto& d : detail::op_defs()) t->emplace(d.name, d);
    return t;
  }();
  auto it = table->find(name);
  if (it == table->end()) fail<ValueError>("graph: unknown op '", name, "'");
  return it->second;
}

// The dtype an elementwise op's operands are converted to before its rule
// applies (for a comparison: the dtype of its 1/0 result; for `where`: that of
// the two choices): scalars adapt to tensors, as in a fused expression.
inline std::optional<DType> common_dtype(const OpDef& def, std::span<const Meta> in) {
  std::optional<DType> common;
  bool weak = true;
  for (std::size_t i = def.rule == op::DTypeRule::select ? 1 : 0; i < in.size(); ++i) {
    if (!in[i].dtype) return std::nullopt;
    common = common ? promote_types(*common, weak, *in[i].dtype, in[i].weak) : *in[i].dtype;
    weak = weak && in[i].weak;
  }
  return common;
}

// The shape and dtype of an op's result. Elementwise: broadcasting and the
// op's dtype rule. Any other op: its eager function run on meta tensors,
// which throws the op's own error for operands it rejects.
inline Meta infer(const OpDef& def, std::span<const Meta> in, const op::Attrs& attrs) {
  if (def.arity >= 0 && static_cast<int>(in.size()) != def.arity)
    fail<ValueError>(def.name, ": takes ", def.arity, " operands, not ", in.size());
  if (def.arity < 0 && in.empty()) fail<ValueError>(def.name, ": needs at least one operand");
  Meta out;
  bool known = true;
  for (const auto& m : in) known = known && m.shape && m.dtype;
  if (def.elementwise >= 0) {
    out.weak = true;
    for (const auto& m : in) out.weak = out.weak && m.weak;
    if (auto common = common_dtype(def, in))
      out.dtype = def.rule == op::DTypeRule::promote_float && !is_floating(*common) ? DType::float32 : *common;
    bool shaped = true;
    Shape shape;
    for (const auto& m : in) {
      if (!m.shape) shaped = false;
      else shape = broadcast_shapes(shape, *m.shape, def.name);
    }
    if (shaped) out.shape = shape;
    return out;
  }
  if (!known) return out;
  std::vector<Tensor> metas;
  for (const auto& m : in) metas.emplace_back(*m.shape, *m.dtype, meta());
  Tensor r = def.eval(metas, attrs);
  out.shape = r.shape();
  out.dtype = r.dtype();
  return out;
}

}  // namespace hybra::graph
