#pragma once
// The graph's view of the op table: every op a graph node can name, with its
// arity and its eager function. Elementwise entries are generated from
// op::elementwise_ops; the others are one line each here. A node's shape and
// dtype are inferred by running the op's own eager function on meta tensors
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
#include "../jit/cuda_eager.hpp"
#include "../jit/cuda_launch.hpp"
#include "../jit/cuda_layout.hpp"
#include "../jit/cuda_random.hpp"
#include "../jit/elementwise_op.hpp"
#include "../ops/conv.hpp"
#include "../ops/conv_backward.hpp"
#include "../ops/linalg.hpp"
#include "../ops/nn.hpp"
#include "../ops/reduce.hpp"
#include "../ops/softmax.hpp"
#include "attrs.hpp"

namespace hybra::graph {

struct OpDef {
  std::string_view name;
  int arity;             // -1: one or more (concat)
  int elementwise = -1;  // index into op::elementwise_ops, or -1
  op::DTypeRule rule = op::DTypeRule::promote;
  std::string_view symbol;  // elementwise: the C++ infix operator, or ""

  // The eager op on tensors. Elementwise ops receive every operand as a
  // tensor: scalar operands arrive as 0-d tensors of the node's common dtype.
  Tensor (*eval)(std::span<const Tensor> in, const Attrs& attrs) = nullptr;
  // An op that only gradients use (autograd/gradients.hpp): never in a graph
  // a user builds, so never in a model file.
  bool gradient_only = false;
  // A product's multiply-adds, from its operands and result (meta tensors
  // will do); null for ops whose work is the bytes they touch. The CPU plan
  // sizes a call with it (jit::detail::is_brief).
  std::int64_t (*multiply_adds)(std::span<const Tensor> in, const Tensor& out) = nullptr;
  // The op's work on a GPU as launches a plan can run in its buffers and
  // record into a CUDA graph (jit/cuda_launch.hpp), for operands and result
  // laid out as given (meta tensors will do); nullopt where the eager op
  // must run instead (it converts an operand first, say). Null: no such form.
  std::optional<jit::CudaLaunch> (*cuda_launch)(std::span<const Tensor> in, const Tensor& out, const Attrs& attrs,
                                                backend::cuda::Gpu& gpu) = nullptr;
};

namespace detail {

template <std::size_t I>
Tensor eval_elementwise(std::span<const Tensor> in, const Attrs&) {
  using Op = std::tuple_element_t<I, op::elementwise_ops>;
  return hybra::detail::run_elementwise(static_cast<int>(I), Op::rule, Op::name, in);
}

inline std::optional<std::vector<std::int64_t>> axes_attr(const Attrs& a, std::string_view op) {
  return parse_optional(find_attr(a, "axis", op), [&](std::string_view t) { return parse_tuple(t, op); });
}
inline bool keepdims_attr(const Attrs& a, std::string_view op) { return parse_bool(find_attr(a, "keepdims", op), op); }
inline std::int64_t int_attr(const Attrs& a, std::string_view key, std::string_view op) {
  return parse_int(find_attr(a, key, op), op);
}
inline std::optional<std::int64_t> optional_int_attr(const Attrs& a, std::string_view key, std::string_view op) {
  return parse_optional(find_attr(a, key, op), [&](std::string_view t) { return parse_int(t, op); });
}
inline Axes reduce_axes(const Attrs& a, std::string_view op) {
  auto axes = axes_attr(a, op);
  return axes ? Axes(*axes) : Axes();
}

template <jit::Reduction K>
std::optional<jit::CudaLaunch> cuda_reduce_launch(std::span<const Tensor> in, const Tensor&, const Attrs& a,
                                                  backend::cuda::Gpu& gpu) {
  const std::string_view op = jit::detail::reduction_name(K);
  return hybra::detail::reduce::cuda_reduce_launch<K>(in[0], axes_attr(a, op), op, gpu);
}

HYBRA_SEPARABLE std::vector<OpDef> op_defs();
#if HYBRA_DEFINE_SEPARABLE
HYBRA_SEPARABLE std::vector<OpDef> op_defs() {
  std::vector<OpDef> defs;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (defs.push_back(OpDef{std::tuple_element_t<I, op::elementwise_ops>::name,
                          std::tuple_element_t<I, op::elementwise_ops>::arity, static_cast<int>(I),
                          std::tuple_element_t<I, op::elementwise_ops>::rule,
                          std::tuple_element_t<I, op::elementwise_ops>::symbol,
                          &eval_elementwise<I>}),
     ...);
  }(std::make_index_sequence<std::tuple_size_v<op::elementwise_ops>>{});
  using T = std::span<const Tensor>;
  using A = const Attrs&;
  using Cost = std::int64_t (*)(T, const Tensor&);
  using Launch = std::optional<jit::CudaLaunch> (*)(T, const Tensor&, A, backend::cuda::Gpu&);
  auto def = [&](std::string_view name, int arity, Tensor (*eval)(T, A), Cost multiply_adds = nullptr,
                 Launch cuda_launch = nullptr) {
    defs.push_back(OpDef{name, arity, -1, {}, {}, eval, false, multiply_adds, cuda_launch});
  };
  // Per output element, a product with weight w (filters first) does one
  // multiply-add per weight of one filter.
  static constexpr auto per_filter = [](const Tensor& w) {
    return w.ndim() ? w.size() / std::max<std::int64_t>(1, w.shape()[0]) : std::int64_t{0};
  };
  static constexpr Cost contraction = [](T in, const Tensor& out) {
    return out.size() * (in[0].ndim() ? in[0].shape().back() : 1);
  };
  static constexpr Cost filtered = [](T in, const Tensor& out) { return out.size() * per_filter(in[1]); };
  def("matmul", 2, [](T in, A) { return matmul(in[0], in[1]); }, contraction, [](T in, const Tensor&, A, backend::cuda::Gpu&) {
    return hybra::detail::linalg::cuda_matmul_launch(in[0], in[1]);
  });
  def("dot", 2, [](T in, A) { return dot(in[0], in[1]); }, contraction, [](T in, const Tensor&, A, backend::cuda::Gpu&) {
    return hybra::detail::linalg::cuda_dot_launch(in[0], in[1]);
  });
  // A reduction's or softmax's launches read the node's attributes as its eager op does.
  using R = jit::Reduction;
  using Gpu = backend::cuda::Gpu&;
  def("sum", 1, [](T in, A a) { return sum(in[0], reduce_axes(a, "sum"), keepdims_attr(a, "sum")); }, nullptr,
      cuda_reduce_launch<R::sum>);
  def("mean", 1, [](T in, A a) { return mean(in[0], reduce_axes(a, "mean"), keepdims_attr(a, "mean")); }, nullptr,
      cuda_reduce_launch<R::mean>);
  def("max", 1, [](T in, A a) { return max(in[0], reduce_axes(a, "max"), keepdims_attr(a, "max")); }, nullptr,
      cuda_reduce_launch<R::max>);
  def("min", 1, [](T in, A a) { return min(in[0], reduce_axes(a, "min"), keepdims_attr(a, "min")); }, nullptr,
      cuda_reduce_launch<R::min>);
  def("argmax", 1, [](T in, A a) {
    return argmax(in[0], optional_int_attr(a, "axis", "argmax"), keepdims_attr(a, "argmax"));
  }, nullptr, [](T in, const Tensor&, A a, Gpu gpu) {
    return hybra::detail::reduce::cuda_argmax_launch(in[0], optional_int_attr(a, "axis", "argmax"), gpu);
  });
  def("softmax", 1, [](T in, A a) { return softmax(in[0], int_attr(a, "axis", "softmax")); }, nullptr,
      [](T in, const Tensor&, A a, Gpu gpu) {
        return hybra::detail::softmax::cuda_softmax_launch<false>(in[0], int_attr(a, "axis", "softmax"), "softmax", gpu);
      });
  def("log_softmax", 1, [](T in, A a) { return log_softmax(in[0], int_attr(a, "axis", "log_softmax")); }, nullptr,
      [](T in, const Tensor&, A a, Gpu gpu) {
        return hybra::detail::softmax::cuda_softmax_launch<true>(in[0], int_attr(a, "axis", "log_softmax"),
                                                                 "log_softmax", gpu);
      });
  // A reshape of a contiguous operand is a view of it, which needs no
  // launch; of any other, a copy into the result in the operand's order.
  static constexpr auto copy_unless_view = [](T in, const Tensor& out, std::string_view op,
                                              Gpu gpu) -> std::optional<jit::CudaLaunch> {
    if (in[0].is_contiguous()) return std::nullopt;
    const Tensor whole(in[0].shape(), out.dtype(), meta());
    return jit::cuda_write_views_launch(in, std::span(&whole, 1), whole, false, op, gpu);
  };
  def("reshape", 1, [](T in, A a) {
    auto s = parse_tuple(find_attr(a, "shape", "reshape"), "reshape");
    return reshape(in[0], Shape(s.begin(), s.end()));
  }, nullptr, [](T in, const Tensor& out, A, Gpu gpu) { return copy_unless_view(in, out, "reshape", gpu); });
  def("transpose", 1, [](T in, A a) {
    auto axes = axes_attr(a, "transpose");
    return axes ? transpose(in[0], *axes) : transpose(in[0]);
  });
  def("slice", 1, [](T in, A a) {
    return slice(in[0], int_attr(a, "axis", "slice"), optional_int_attr(a, "begin", "slice"),
                 optional_int_attr(a, "end", "slice"), int_attr(a, "step", "slice"));
  });
  def("concat", -1, [](T in, A a) { return concat(std::vector<Tensor>(in.begin(), in.end()), int_attr(a, "axis", "concat")); },
      nullptr, [](T in, const Tensor& out, A a, Gpu gpu) {
        const int ax = hybra::detail::checked_axis(int_attr(a, "axis", "concat"), out.shape(), "concat");
        return jit::cuda_write_views_launch(in, hybra::detail::concat_views(in, out, ax), out, false, "concat", gpu);
      });
  def("astype", 1, [](T in, A a) { return in[0].astype(parse_dtype(find_attr(a, "dtype", "astype"), "astype")); },
      nullptr, [](T in, const Tensor& out, A, Gpu gpu) -> std::optional<jit::CudaLaunch> {
        if (in[0].dtype() == out.dtype()) return jit::cuda_write_views_launch(in, std::span(&out, 1), out, false, "astype", gpu);
        return jit::cuda_convert_launch(in[0].dtype(), out.dtype(), out.size(), gpu);
      });
  def("flatten", 1, [](T in, A) { return flatten(in[0]); }, nullptr,
      [](T in, const Tensor& out, A, Gpu gpu) { return copy_unless_view(in, out, "flatten", gpu); });
  def("broadcast_to", 1, [](T in, A a) {
    auto s = parse_tuple(find_attr(a, "shape", "broadcast_to"), "broadcast_to");
    return broadcast_to(in[0], Shape(s.begin(), s.end()));
  });
  def("fully_connected", -1, [](T in, A) {
    if (in.size() != 2 && in.size() != 3)
      fail<ValueError>("fully_connected: takes (data, weight) or (data, weight, bias), not ", in.size(), " inputs");
    return fully_connected(in[0], in[1], in.size() == 3 ? in[2] : Tensor{});
  }, filtered);
  def("dropout", 1, [](T in, A a) { return dropout(in[0], parse_double(find_attr(a, "rate", "dropout"), "dropout")); },
      nullptr, [](T in, const Tensor& out, A a, Gpu gpu) -> std::optional<jit::CudaLaunch> {
        // Predicting (or at rate 0) it is the identity: a view, no launch.
        const double rate = parse_double(find_attr(a, "rate", "dropout"), "dropout");
        if (!autograd::is_training() || rate == 0 || !is_floating(in[0].dtype())) return std::nullopt;
        return jit::cuda_dropout_launch(out.dtype(), out.size(), rate, gpu);
      });
  // A (height, width) attribute: "(2, 3)", or one number for both.
  static constexpr auto size2d = [](A a, std::string_view key, std::string_view op) {
    auto v = parse_tuple(find_attr(a, key, op), op);
    if (v.size() == 1) return Size2d(v[0]);
    if (v.size() != 2)
      fail<ValueError>(op, ": attribute ", key, " '", find_attr(a, key, op), "' is not a (height, width) pair");
    return Size2d(v[0], v[1]);
  };
  static constexpr auto pooling_convention = [](A a, std::string_view op) {
    return parse_pooling_convention(find_attr(a, "pooling_convention", op), op);
  };
  // kernel, num_filter and no_bias restate the weight's and bias's shapes (MXNet's Convolution needs them).
  def("conv2d", -1, [](T in, A a) {
    const bool no_bias = parse_bool(find_attr(a, "no_bias", "conv2d"), "conv2d");
    if (in.size() != (no_bias ? 2u : 3u))
      fail<ValueError>("conv2d: takes ", no_bias ? "(data, weight) with no_bias" : "(data, weight, bias)", ", not ",
                       in.size(), " inputs");
    const Size2d kernel = size2d(a, "kernel", "conv2d");
    const std::int64_t filters = int_attr(a, "num_filter", "conv2d");
    const Shape& w = in[1].shape();
    if (w.size() != 4 || w[0] != filters || w[2] != kernel.h || w[3] != kernel.w)
      fail<ShapeError>("conv2d: weight of shape ", hybra::to_string(w), " does not match num_filter=", filters,
                       " kernel=", kernel);
    return conv2d(in[0], in[1], no_bias ? Tensor{} : in[2], size2d(a, "stride", "conv2d"), size2d(a, "pad", "conv2d"),
                  size2d(a, "dilate", "conv2d"), int_attr(a, "num_group", "conv2d"));
  }, filtered, [](T in, const Tensor&, A a, Gpu gpu) {
    return hybra::detail::nn::cuda_conv2d_launch(in, size2d(a, "stride", "conv2d"), size2d(a, "pad", "conv2d"),
                                                 size2d(a, "dilate", "conv2d"), int_attr(a, "num_group", "conv2d"), gpu);
  });
  def("pool2d", 1, [](T in, A a) {
    const std::string& type = find_attr(a, "pool_type", "pool2d");
    if (type != "max" && type != "avg") fail<ValueError>("pool2d: pool_type '", type, "' is not max or avg");
    if (parse_bool(find_attr(a, "global_pool", "pool2d"), "pool2d"))
      return type == "max" ? global_max_pool2d(in[0]) : global_avg_pool2d(in[0]);
    const Size2d kernel = size2d(a, "kernel", "pool2d"), stride = size2d(a, "stride", "pool2d");
    const Size2d pad = size2d(a, "pad", "pool2d");
    const PoolingConvention convention = pooling_convention(a, "pool2d");
    if (type == "max") return max_pool2d(in[0], kernel, stride, pad, convention);
    return avg_pool2d(in[0], kernel, stride, pad, parse_bool(find_attr(a, "count_include_pad", "pool2d"), "pool2d"),
                      convention);
  }, nullptr, [](T in, const Tensor&, A a, Gpu gpu) {
    const bool global = parse_bool(find_attr(a, "global_pool", "pool2d"), "pool2d");
    return hybra::detail::nn::cuda_pool2d_launch(
        in[0], find_attr(a, "pool_type", "pool2d") == "max", global, global ? 1 : size2d(a, "kernel", "pool2d"),
        global ? 1 : size2d(a, "stride", "pool2d"), global ? 0 : size2d(a, "pad", "pool2d"),
        global || parse_bool(find_attr(a, "count_include_pad", "pool2d"), "pool2d"),
        global ? PoolingConvention::valid : pooling_convention(a, "pool2d"), gpu);
  });
  def("batch_norm", 5, [](T in, A a) {
    return batch_norm(in[0], in[1], in[2], in[3], in[4], parse_double(find_attr(a, "eps", "batch_norm"), "batch_norm"),
                      int_attr(a, "axis", "batch_norm"));
  }, nullptr, [](T in, const Tensor&, A a, Gpu gpu) {
    return hybra::detail::nn::cuda_batch_norm_launch(in, parse_double(find_attr(a, "eps", "batch_norm"), "batch_norm"),
                                                     int_attr(a, "axis", "batch_norm"), gpu);
  });
  auto gradient = [&](std::string_view name, int arity, Tensor (*eval)(T, A), Cost multiply_adds = nullptr,
                      Launch cuda_launch = nullptr) {
    defs.push_back(OpDef{name, arity, -1, {}, {}, eval, true, multiply_adds, cuda_launch});
  };
  static constexpr auto shape_attr = [](A a, std::string_view op) {
    auto s = parse_tuple(find_attr(a, "shape", op), op);
    return Shape(s.begin(), s.end());
  };
  gradient("slice_backward", 1, [](T in, A a) {
    return slice_backward(in[0], shape_attr(a, "slice_backward"), int_attr(a, "axis", "slice_backward"),
                          optional_int_attr(a, "begin", "slice_backward"), optional_int_attr(a, "end", "slice_backward"),
                          int_attr(a, "step", "slice_backward"));
  }, nullptr, [](T in, const Tensor& out, A a, Gpu gpu) {
    constexpr std::string_view op = "slice_backward";
    const Tensor read = slice(out, int_attr(a, "axis", op), optional_int_attr(a, "begin", op),
                              optional_int_attr(a, "end", op), int_attr(a, "step", op));
    return jit::cuda_write_views_launch(in, std::span(&read, 1), out, true, op, gpu);
  });
  // (dy, weight) and (dy, data), with the forward conv2d's attributes and the shape of what they return.
  gradient("conv2d_backward_data", 2, [](T in, A a) {
    constexpr std::string_view op = "conv2d_backward_data";
    return conv2d_backward_data(in[0], in[1], shape_attr(a, op), size2d(a, "stride", op), size2d(a, "pad", op),
                                size2d(a, "dilate", op), int_attr(a, "num_group", op));
  }, [](T in, const Tensor&) { return in[0].size() * per_filter(in[1]); }, [](T in, const Tensor& out, A a, Gpu gpu) {
    constexpr std::string_view op = "conv2d_backward_data";
    return hybra::detail::nn::cuda_conv2d_backward_launch(jit::ConvPass::backward_data, in, out.shape(),
                                                          size2d(a, "stride", op), size2d(a, "pad", op),
                                                          size2d(a, "dilate", op), int_attr(a, "num_group", op), gpu);
  });
  gradient("conv2d_backward_weight", 2, [](T in, A a) {
    constexpr std::string_view op = "conv2d_backward_weight";
    return conv2d_backward_weight(in[0], in[1], shape_attr(a, op), size2d(a, "stride", op), size2d(a, "pad", op),
                                  size2d(a, "dilate", op), int_attr(a, "num_group", op));
  }, [](T in, const Tensor& out) { return in[0].size() * per_filter(out); }, [](T in, const Tensor& out, A a, Gpu gpu) {
    constexpr std::string_view op = "conv2d_backward_weight";
    return hybra::detail::nn::cuda_conv2d_backward_launch(jit::ConvPass::backward_weight, in, out.shape(),
                                                          size2d(a, "stride", op), size2d(a, "pad", op),
                                                          size2d(a, "dilate", op), int_attr(a, "num_group", op), gpu);
  });
  // (dy, data), with the forward pool2d's attributes.
  gradient("pool2d_backward", 2, [](T in, A a) {
    constexpr std::string_view op = "pool2d_backward";
    const bool max = find_attr(a, "pool_type", op) == "max";
    if (parse_bool(find_attr(a, "global_pool", op), op)) {
      const Shape& s = in[1].shape();
      if (s.size() != 4) fail<ShapeError>(op, ": input of shape ", hybra::to_string(s), " is not 4-d");
      return pool2d_backward(in[0], in[1], max, Size2d(s[2], s[3]), 1, 0, true, PoolingConvention::valid);
    }
    return pool2d_backward(in[0], in[1], max, size2d(a, "kernel", op), size2d(a, "stride", op), size2d(a, "pad", op),
                           parse_bool(find_attr(a, "count_include_pad", op), op), pooling_convention(a, op));
  }, nullptr, [](T in, const Tensor&, A a, Gpu gpu) {
    constexpr std::string_view op = "pool2d_backward";
    const bool max = find_attr(a, "pool_type", op) == "max";
    if (parse_bool(find_attr(a, "global_pool", op), op)) {
      const Shape& s = in[1].shape();
      return hybra::detail::nn::cuda_pool2d_backward_launch(in, max, Size2d(s[2], s[3]), 1, 0, true,
                                                            PoolingConvention::valid, gpu);
    }
    return hybra::detail::nn::cuda_pool2d_backward_launch(in, max, size2d(a, "kernel", op), size2d(a, "stride", op),
                                                          size2d(a, "pad", op),
                                                          parse_bool(find_attr(a, "count_include_pad", op), op),
                                                          pooling_convention(a, op), gpu);
  });
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

// The entry for an op name; an unknown name is a ValueError naming it.
inline const OpDef& find_op(std::string_view name) {
  static const auto table = [] {
    std::unordered_map<std::string_view, OpDef> t;
    for (const auto& d : detail::op_defs()) t.emplace(d.name, d);
    return t;
  }();
  auto it = table.find(name);
  if (it == table.end()) fail<ValueError>("graph: unknown op '", name, "'");
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
inline Meta infer(const OpDef& def, std::span<const Meta> in, const Attrs& attrs) {
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
