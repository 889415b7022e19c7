#pragma once
// Layout ops: reshape, transpose, slice and concat. Wherever the result can
// share the input's storage (reshape of contiguous data, every transpose and
// slice) it is a view, as in NumPy, so these cost no copy; a view's layout is
// then handled by whichever op reads it (fused loops take any strides).
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "../expr/evaluate.hpp"

namespace hybra {

// The layout ops' node attributes (graph/registry.hpp reads them back).
inline graph::Attrs axis_attrs(std::int64_t axis) { return {{"axis", graph::attr_text(axis)}}; }
inline graph::Attrs reshape_attrs(const Shape& shape) { return {{"shape", graph::attr_text(shape)}}; }
inline graph::Attrs transpose_attrs(std::optional<std::vector<std::int64_t>> axes) {
  return {{"axis", graph::attr_text(axes)}};
}
inline graph::Attrs slice_attrs(std::int64_t axis, std::optional<std::int64_t> begin, std::optional<std::int64_t> end,
                                std::int64_t step) {
  return {{"axis", graph::attr_text(axis)}, {"begin", graph::attr_text(begin)}, {"end", graph::attr_text(end)},
          {"step", graph::attr_text(step)}};
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
  std::vector<Tensor> views = detail::concat_views(tensors, out, ax);
  for (std::size_t k = 0; k < tensors.size(); ++k)
    if (tensors[k].size()) views[k].assign(tensors[k]);
  return rec.output(out, [&] { return axis_attrs(axis); });
}

}  // namespace hybra
