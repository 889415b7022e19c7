#pragma once
// Layout ops: reshape, transpose, slice, concat, broadcast_to and astype. Wherever the result can
// share the input's storage (reshape of contiguous data, every transpose and
// slice) it is a view, as in NumPy, so these cost no copy; a view's layout is
// then handled by whichever op reads it (fused loops take any strides).
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../expr/evaluate.hpp"
#include "../backend/cuda/convert.hpp"
#include "../backend/cuda/layout.hpp"

namespace hybra {

// The layout ops' node attributes (their entries below read them back).
inline op::Attrs axis_attrs(std::int64_t axis) { return {{"axis", op::attr_text(axis)}}; }
inline op::Attrs reshape_attrs(const Shape& shape) { return {{"shape", op::attr_text(shape)}}; }
inline op::Attrs transpose_attrs(std::optional<std::vector<std::int64_t>> axes) {
  return {{"axis", op::attr_text(axes)}};
}
inline op::Attrs slice_attrs(std::int64_t axis, std::optional<std::int64_t> begin, std::optional<std::int64_t> end,
                             std::int64_t step) {
  return {{"axis", op::attr_text(axis)},
          {"begin", op::attr_text(begin)},
          {"end", op::attr_text(end)},
          {"step", op::attr_text(step)}};
}

namespace detail {
// Checks an axis against a shape; the message names the op and the shape.
inline int checked_axis(std::int64_t axis, const Shape& shape, std::string_view op) {
  const auto n = static_cast<std::int64_t>(shape.size());
  if (axis < -n || axis >= n)
    fail<AxisError>(op, ": axis ", axis, " is out of range for a tensor of shape ", to_string(shape));
  return normalize_axis(axis, shape.size(), op);
}

inline std::string axes_string(const std::vector<std::int64_t>& axes) {
  return to_string(Shape(axes.begin(), axes.end()));
}
}  // namespace detail

// `shape` may hold one -1, inferred from the element count. A view when x is
// contiguous, otherwise a contiguous copy.
template <tensor_like X>
Tensor reshape(X&& x_in, const Shape& shape) {
  Tensor x = eval(x_in);
  x.require("reshape");
  autograd::op_record rec("reshape", {x});
  auto attrs = [&] { return reshape_attrs(shape); };
  const std::int64_t n = x.size();
  auto mismatch = [&](const char* why) {
    fail<ShapeError>("reshape: cannot reshape a tensor of shape ", to_string(x.shape()), " (", n,
                     " elements) into shape ", to_string(shape), why);
  };
  Shape out = shape;
  std::optional<std::size_t> unknown;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      if (unknown) mismatch(": only one dimension may be -1");
      unknown = i;
      out[i] = 1;
    } else if (out[i] < 0) {
      mismatch(": negative dimension");
    }
  }
  const std::int64_t known = checked_numel(out, "reshape");
  if (unknown) {
    if (known == 0 || n % known != 0) mismatch("");
    out[*unknown] = n / known;
  } else if (known != n) {
    mismatch("");
  }
  if (x.is_contiguous()) return rec.output(x.view(out, contiguous_strides(out), x.offset()), attrs);
  return rec.output(x.copy().view(out, contiguous_strides(out), 0), attrs);
}

// A view with its axes permuted: result axis i is input axis axes[i].
template <tensor_like X>
Tensor transpose(X&& x_in, const std::vector<std::int64_t>& axes) {
  Tensor x = eval(x_in);
  x.require("transpose");
  autograd::op_record rec("transpose", {x});
  const Shape& shape = x.shape();
  auto bad = [&] {
    fail<AxisError>("transpose: axes ", detail::axes_string(axes), " are not a permutation of the axes of shape ",
                    to_string(shape));
  };
  if (axes.size() != shape.size()) bad();
  const auto nd = static_cast<std::int64_t>(shape.size());
  Shape out_shape(shape.size());
  Strides out_strides(shape.size());
  std::vector<bool> seen(shape.size(), false);
  for (std::size_t i = 0; i < axes.size(); ++i) {
    if (axes[i] < -nd || axes[i] >= nd) bad();
    auto a = static_cast<std::size_t>(axes[i] < 0 ? axes[i] + nd : axes[i]);
    if (seen[a]) bad();
    seen[a] = true;
    out_shape[i] = shape[a];
    out_strides[i] = x.strides()[a];
  }
  return rec.output(x.view(out_shape, out_strides, x.offset()), [&] { return transpose_attrs(axes); });
}

// Reverses the axes (a matrix's transpose).
template <tensor_like X>
Tensor transpose(X&& x_in) {
  Tensor x = eval(x_in);
  std::vector<std::int64_t> axes(static_cast<std::size_t>(x.ndim()));
  for (std::size_t i = 0; i < axes.size(); ++i) axes[i] = static_cast<std::int64_t>(axes.size() - 1 - i);
  return transpose(x, axes);
}

// x[begin:end:step] along one axis, with Python's rules: negative indices
// count from the end, out-of-range bounds clamp, nullopt means "from the
// start / to the end" in the direction of step. Always a view.
template <tensor_like X>
Tensor slice(X&& x_in, std::int64_t axis, std::optional<std::int64_t> begin, std::optional<std::int64_t> end,
             std::int64_t step = 1) {
  Tensor x = eval(x_in);
  x.require("slice");
  autograd::op_record rec("slice", {x});
  const int ax = detail::checked_axis(axis, x.shape(), "slice");
  if (step == 0) fail<ValueError>("slice: step must not be zero (axis ", axis, " of shape ", to_string(x.shape()), ")");
  const std::int64_t n = x.shape()[ax];
  // The same clamping as CPython's PySlice_AdjustIndices.
  auto adjust = [&](std::optional<std::int64_t> v, std::int64_t if_none) {
    if (!v) return if_none;
    std::int64_t i = *v;
    if (i < 0) {
      i += n;
      if (i < 0) i = step < 0 ? -1 : 0;
    } else if (i >= n) {
      i = step < 0 ? n - 1 : n;
    }
    return i;
  };
  const std::int64_t b = adjust(begin, step < 0 ? n - 1 : 0);
  const std::int64_t e = adjust(end, step < 0 ? -1 : n);
  std::int64_t len = 0;
  if (step > 0 && b < e) len = (e - b - 1) / step + 1;
  if (step < 0 && e < b) len = (e - b + 1) / step + 1;
  Shape shape = x.shape();
  Strides strides = x.strides();
  shape[ax] = len;
  if (len > 1) strides[ax] *= step;
  return rec.output(x.view(shape, strides, len > 0 ? x.offset() + b * x.strides()[ax] : x.offset()), [&] { return slice_attrs(axis, begin, end, step); });
}


// x repeated along its size-1 (or missing leading) axes to `shape`, as
// NumPy's broadcast_to: a view that reads each element many times (stride 0),
// so nothing is copied; ops read it like any other view.
template <tensor_like X>
Tensor broadcast_to(X&& x_in, const Shape& shape) {
  Tensor x = eval(x_in);
  x.require("broadcast_to");
  autograd::op_record rec("broadcast_to", {x});
  if (broadcast_shapes(x.shape(), shape, "broadcast_to") != shape)
    fail<ShapeError>("broadcast_to: a tensor of shape ", to_string(x.shape()), " cannot be broadcast to shape ",
                     to_string(shape));
  return rec.output(x.view(shape, detail::broadcast_strides(x, shape), x.offset()), [&] { return reshape_attrs(shape); });
}

// The gradient of slice: zeros of the sliced tensor's shape with dy written
// where the slice read.
inline Tensor slice_backward(const Tensor& dy, const Shape& shape, std::int64_t axis, std::optional<std::int64_t> begin,
                             std::optional<std::int64_t> end, std::int64_t step) {
  Tensor dx = zeros(shape, dy.require("slice_backward").dtype(), dy.device());
  slice(dx, axis, begin, end, step).assign(dy);
  return dx;
}

namespace detail {
// Where concat writes each part: views of out, one after another along axis ax.
inline std::vector<Tensor> concat_views(std::span<const Tensor> parts, const Tensor& out, int ax) {
  std::vector<Tensor> views;
  std::int64_t at = 0;
  for (const Tensor& t : parts) {
    views.push_back(out.view(t.shape(), out.strides(), out.offset() + at * out.strides()[ax]));
    at += t.shape()[ax];
  }
  return views;
}
// Whether t, its dims in the order given, lies densely, row-major (dims of
// extent 1 aside, whose strides say nothing).
inline bool dense_in_order(const Tensor& t) {
  std::int64_t next = 1;
  for (int d = t.ndim() - 1; d >= 0; --d) {
    if (t.shape()[d] == 1) continue;
    if (t.strides()[d] != next) return false;
    next *= t.shape()[d];
  }
  return true;
}

// concat where out and every part lie densely in out's memory order (walked
// below) in one dtype on the host: out is rows of one run of each part after
// the other (DenseNet's NHWC concatenations: per pixel, the channels so far,
// then the layer's 32; an NCHW one along channels: per image), copied with
// memcpy in one pass over out, split evenly over the threads. The per-part
// copies below walk out once per part, and a part of few channels moves runs
// of a few cache lines each (docs/benchmarks.md, "Concatenations in one
// pass").
inline void concat_rows(std::vector<Tensor> parts, const Tensor& out, int at) {
  std::int64_t rows = 1;
  for (int d = 0; d < at; ++d) rows *= out.shape()[d];
  std::vector<std::int64_t> starts{0};  // each part's first element within a row of out
  for (const Tensor& t : parts) starts.push_back(starts.back() + (rows ? t.size() / rows : 0));
  push_kernel("concat", parts, {out}, [parts, out, rows, starts] {
    const std::int64_t row = starts.back(), bytes = static_cast<std::int64_t>(size_of(out.dtype()));
    auto* dst = static_cast<char*>(out.raw_data());
    backend::cpu::parallel_for(rows * row, 1, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end;) {
        const std::int64_t r = i / row, within = i % row;
        const auto k = static_cast<std::size_t>(std::upper_bound(starts.begin(), starts.end(), within) - starts.begin() - 1);
        const std::int64_t block = starts[k + 1] - starts[k], n = std::min(starts[k + 1] - within, end - i);
        const auto* src = static_cast<const char*>(parts[k].raw_data()) + (r * block + within - starts[k]) * bytes;
        std::memcpy(dst + i * bytes, src, static_cast<std::size_t>(n * bytes));
        i += n;
      }
    });
  });
}

// Writes each part into its place in out along axis ax, converting to out's
// dtype. Parts never overlap out: out is fresh, or a CPU plan's buffer that
// no live value shares (jit/plan.hpp).
inline void concat_into(std::span<const Tensor> parts, const Tensor& out, int ax) {
  const std::vector<Tensor> views = concat_views(parts, out, ax);
  // Each copy walks out's dims in the order out lies in memory (a plan's NHWC
  // value: channels innermost), so that it moves runs, not single elements.
  std::vector<std::size_t> order(static_cast<std::size_t>(out.ndim()));
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return out.strides()[a] > out.strides()[b]; });
  auto walked = [&](const Tensor& t) {
    Shape shape;
    Strides strides;
    for (std::size_t d : order) {
      shape.push_back(t.shape()[d]);
      strides.push_back(t.strides()[d]);
    }
    return t.view(shape, strides, t.offset());
  };
  std::vector<Tensor> walked_parts;
  bool one_pass = out.device().kind == DeviceKind::cpu && dense_in_order(walked(out));
  for (const Tensor& t : parts) {
    walked_parts.push_back(walked(t));
    one_pass = one_pass && t.device().kind == DeviceKind::cpu && t.dtype() == out.dtype() &&
               dense_in_order(walked_parts.back());
  }
  if (one_pass)
    return concat_rows(std::move(walked_parts), walked(out),
                       static_cast<int>(std::find(order.begin(), order.end(), static_cast<std::size_t>(ax)) - order.begin()));
  for (std::size_t k = 0; k < parts.size(); ++k)
    if (parts[k].size()) copy_into(walked_parts[k], walked(views[k]));
}
}  // namespace detail

// Joins tensors along an existing axis. Extents must match on every other
// axis; the result has the promoted dtype of all inputs.
inline Tensor concat(const std::vector<Tensor>& tensors, std::int64_t axis = 0) {
  if (tensors.empty()) fail<ValueError>("concat: needs at least one tensor");
  for (const auto& t : tensors) t.require("concat");
  const Tensor& first = tensors.front();
  autograd::op_record rec("concat", tensors);
  if (first.ndim() == 0) fail<ShapeError>("concat: a 0-d tensor (shape ()) cannot be concatenated");
  const int ax = detail::checked_axis(axis, first.shape(), "concat");
  Shape out_shape = first.shape();
  out_shape[ax] = 0;
  DType dtype = first.dtype();
  for (const auto& t : tensors) {
    bool same = t.ndim() == first.ndim();
    for (int d = 0; same && d < first.ndim(); ++d) same = d == ax || t.shape()[d] == first.shape()[d];
    if (!same)
      fail<ShapeError>("concat: shapes ", to_string(first.shape()), " and ", to_string(t.shape()),
                       " do not match outside axis ", ax);
    require_same_device("concat", first, t);
    out_shape[ax] += t.shape()[ax];
    dtype = promote_types(dtype, t.dtype());
  }
  Tensor out(out_shape, dtype, first.device());
  detail::concat_into(tensors, out, ax);
  return rec.output(out, [&] { return axis_attrs(axis); });
}

namespace detail {
// A reshape of a contiguous operand is a view of it, which needs no launch;
// of any other, a copy into the result in the operand's order.
inline std::optional<backend::cuda::CudaLaunch> copy_unless_view(std::span<const Tensor> in, const Tensor& out,
                                                                 std::string_view op, backend::cuda::Gpu& gpu) {
  if (in[0].is_contiguous()) return std::nullopt;
  const Tensor whole(in[0].shape(), out.dtype(), meta());
  return backend::cuda::cuda_write_views_launch(in, std::span(&whole, 1), whole, false, op, gpu);
}
// An op MXNet writes under its own spelling with hybra's attrs unchanged.
template <class W>
auto keep_attrs(const W& w, std::string op, std::initializer_list<std::string_view> keys) {
  op::Attrs a;
  for (auto key : keys) a.emplace_back(std::string(key), w.attr(key));
  return w.keep_all(std::move(op), std::move(a));
}
// A shape attr MXNet writes with special codes hybra does not read.
template <class R>
std::vector<std::int64_t> plain_shape(const R& r, std::string_view why) {
  auto shape = r.tuple("shape");
  if (!shape) r.reject("attr 'shape' is missing");
  for (auto d : *shape)
    if (d == 0 || d < -1) r.reject(why);
  return *shape;
}
}  // namespace detail

namespace op {

struct reshape {
  static constexpr std::string_view name = "reshape";
  static Tensor eval(std::span<const Tensor> in, const op::Attrs& a) {
    return hybra::reshape(in[0], op::shape_attr(a, "shape", name));
  }
  static std::optional<backend::cuda::CudaLaunch> cuda_launch(std::span<const Tensor> in, const Tensor& out,
                                                              const op::Attrs&, backend::cuda::Gpu& gpu) {
    return hybra::detail::copy_unless_view(in, out, name, gpu);
  }
  template <class G> static auto gradient(const G& g) { return g.grads(g.reshape(g.dy, g.shape(0))); }
  static constexpr std::array<std::string_view, 2> mxnet{"Reshape", "reshape"};
  template <class W> static auto write(const W& w) { return hybra::detail::keep_attrs(w, "Reshape", {"shape"}); }
  template <class R>
  static auto read(const R& r) {
    r.arity(1, 1);
    auto shape = hybra::detail::plain_shape(r, "MXNet's special reshape codes (0, -2, -3, -4) are not supported");
    return r.make("reshape", {{"shape", op::attr_text(shape)}});
  }
};

struct transpose {
  static constexpr std::string_view name = "transpose";
  static Tensor eval(std::span<const Tensor> in, const op::Attrs& a) {
    auto axes = op::optional_tuple_attr(a, "axis", name);
    return axes ? hybra::transpose(in[0], *axes) : hybra::transpose(in[0]);
  }
  template <class G>
  static auto gradient(const G& g) {
    auto axes = op::optional_tuple_attr(g.attrs, "axis", "gradient");
    if (!axes) return g.grads(g.transpose(g.dy));
    std::vector<std::int64_t> back(axes->size());
    for (std::size_t i = 0; i < axes->size(); ++i)
      back[static_cast<std::size_t>(normalize_axis((*axes)[i], axes->size(), "gradient"))] = static_cast<std::int64_t>(i);
    return g.grads(g.transpose(g.dy, back));
  }
  static constexpr std::array<std::string_view, 1> mxnet{"transpose"};
  template <class W>
  static auto write(const W& w) {
    op::Attrs a;
    if (w.attr("axis") != "None") a.emplace_back("axes", w.attr("axis"));
    return w.keep_all("transpose", std::move(a));
  }
  template <class R>
  static auto read(const R& r) {
    r.arity(1, 1);
    auto axes = r.tuple("axes");
    return r.make("transpose", {{"axis", axes && !axes->empty() ? op::attr_text(*axes) : "None"}});
  }
};

struct slice {
  static constexpr std::string_view name = "slice";
  static Tensor eval(std::span<const Tensor> in, const op::Attrs& a) {
    return hybra::slice(in[0], op::int_attr(a, "axis", name), op::optional_int_attr(a, "begin", name),
                        op::optional_int_attr(a, "end", name), op::int_attr(a, "step", name));
  }
  template <class G> static auto gradient(const G& g) {
    return g.grads(g.make("slice_backward", g.with_shape(g.attrs, g.shape(0)), {g.dy}));
  }
  static constexpr std::array<std::string_view, 1> mxnet{"slice_axis"};
  template <class W>
  static auto write(const W& w) {
    if (w.attr("step") != "1") w.reject("with a step other than 1");
    return hybra::detail::keep_attrs(w, "slice_axis", {"axis", "begin", "end"});
  }
  template <class R>
  static auto read(const R& r) {
    r.arity(1, 1);
    auto bound = [&](std::string_view key) {
      return r.parsed(key, [&](std::string_view t) { return op::parse_int(t, key); });
    };
    return r.make("slice", {{"axis", op::attr_text(r.integer("axis", 0))},
                            {"begin", op::attr_text(bound("begin"))},
                            {"end", op::attr_text(bound("end"))},
                            {"step", "1"}});
  }
};

// The gradient of slice: slice's attributes, and the shape it sliced.
struct slice_backward {
  static constexpr std::string_view name = "slice_backward";
  static constexpr bool gradient_only = true;
  static Tensor eval(std::span<const Tensor> in, const op::Attrs& a) {
    return hybra::slice_backward(in[0], op::shape_attr(a, "shape", name), op::int_attr(a, "axis", name),
                                 op::optional_int_attr(a, "begin", name), op::optional_int_attr(a, "end", name),
                                 op::int_attr(a, "step", name));
  }
  static std::optional<backend::cuda::CudaLaunch> cuda_launch(std::span<const Tensor> in, const Tensor& out,
                                                              const op::Attrs& a, backend::cuda::Gpu& gpu) {
    const Tensor read = hybra::slice(out, op::int_attr(a, "axis", name), op::optional_int_attr(a, "begin", name),
                                     op::optional_int_attr(a, "end", name), op::int_attr(a, "step", name));
    return backend::cuda::cuda_write_views_launch(in, std::span(&read, 1), out, true, name, gpu);
  }
};

struct concat {
  static constexpr std::string_view name = "concat";
  static constexpr int arity = -1;
  static Tensor eval(std::span<const Tensor> in, const op::Attrs& a) {
    return hybra::concat(std::vector<Tensor>(in.begin(), in.end()), op::int_attr(a, "axis", name));
  }
  static void eval_into(std::span<const Tensor> in, const Tensor& out, const op::Attrs& a) {
    hybra::detail::concat_into(in, out, hybra::detail::checked_axis(op::int_attr(a, "axis", name), out.shape(), name));
  }
  static std::optional<backend::cuda::CudaLaunch> cuda_launch(std::span<const Tensor> in, const Tensor& out,
                                                              const op::Attrs& a, backend::cuda::Gpu& gpu) {
    const int ax = hybra::detail::checked_axis(op::int_attr(a, "axis", name), out.shape(), name);
    return backend::cuda::cuda_write_views_launch(in, hybra::detail::concat_views(in, out, ax), out, false, name, gpu);
  }
  template <class G>
  static auto gradient(const G& g) {
    const std::int64_t axis = normalize_axis(g.int_attr("axis"), g.shape(0).size(), "gradient");
    auto r = g.grads();
    std::int64_t at = 0;
    for (std::size_t i = 0; i < g.in.size(); ++i) {
      const std::int64_t n = g.shape(i)[static_cast<std::size_t>(axis)];
      r.push_back(g.slice(g.dy, axis, at, at + n, 1));
      at += n;
    }
    return r;
  }
  static constexpr std::array<std::string_view, 2> mxnet{"Concat", "concat"};
  template <class W>
  static auto write(const W& w) {
    return w.keep_all("Concat", {{"dim", w.attr("axis")}, {"num_args", std::to_string(w.node.inputs.size())}});
  }
  template <class R>
  static auto read(const R& r) {
    r.arity(1, static_cast<std::size_t>(-1));
    if (r.integer("num_args", static_cast<std::int64_t>(r.inputs.size())) != static_cast<std::int64_t>(r.inputs.size()))
      r.reject("attr 'num_args' does not match its " + std::to_string(r.inputs.size()) + " inputs");
    return r.make("concat", {{"axis", op::attr_text(r.integer("dim", 1))}});
  }
};

struct broadcast_to {
  static constexpr std::string_view name = "broadcast_to";
  static Tensor eval(std::span<const Tensor> in, const op::Attrs& a) {
    return hybra::broadcast_to(in[0], op::shape_attr(a, "shape", name));
  }
  template <class G> static auto gradient(const G& g) { return g.grads(g.sum_to(g.dy, g.shape(0))); }
  static constexpr std::array<std::string_view, 1> mxnet{"broadcast_to"};
  template <class W> static auto write(const W& w) { return hybra::detail::keep_attrs(w, "broadcast_to", {"shape"}); }
  template <class R>
  static auto read(const R& r) {
    r.arity(1, 1);
    auto shape = hybra::detail::plain_shape(r, "MXNet's 0 (keep this dimension) in 'shape' is not supported");
    for (auto d : shape)
      if (d < 0) r.reject("MXNet's 0 (keep this dimension) in 'shape' is not supported");
    return r.make("broadcast_to", {{"shape", op::attr_text(shape)}});
  }
};

// A copy to another dtype (Tensor::astype, expr/evaluate.hpp).
struct astype {
  static constexpr std::string_view name = "astype";
  static Tensor eval(std::span<const Tensor> in, const op::Attrs& a) {
    return in[0].astype(parse_dtype(op::find_attr(a, "dtype", name), name));
  }
  static std::optional<backend::cuda::CudaLaunch> cuda_launch(std::span<const Tensor> in, const Tensor& out,
                                                              const op::Attrs&, backend::cuda::Gpu& gpu) {
    if (in[0].dtype() == out.dtype())
      return backend::cuda::cuda_write_views_launch(in, std::span(&out, 1), out, false, name, gpu);
    return backend::cuda::cuda_convert_launch(in[0].dtype(), out.dtype(), out.size(), gpu);
  }
  template <class G> static auto gradient(const G& g) { return g.grads(g.dy); }
  static constexpr std::array<std::string_view, 2> mxnet{"Cast", "cast"};
  template <class W> static auto write(const W& w) { return hybra::detail::keep_attrs(w, "Cast", {"dtype"}); }
  template <class R>
  static auto read(const R& r) {
    r.arity(1, 1);
    auto d = r.attr("dtype");
    if (!d) r.reject("attr 'dtype' is missing");
    return r.make("astype", {{"dtype", *d}});
  }
};

}  // namespace op

}  // namespace hybra
