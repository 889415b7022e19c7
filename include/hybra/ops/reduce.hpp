#pragma once
// Reductions: sum, mean, max, min over any set of axes, and argmax.
//
// The input is made contiguous and its dims are collapsed into runs of
// reduced and kept dims; each reduced run is then one pass of a kernel over a
// contiguous (outer, R, inner) block: with inner == 1 it reduces contiguous
// rows, otherwise it accumulates whole rows of `inner` elements at a time, so
// both loops read memory in order and vectorise. Only interleaved axes
// (e.g. axes 0 and 2 of a 3-d tensor) need a second pass.
//
// Accuracy: float sums (and every mean) accumulate in double, so a float32
// sum of 1e6 elements is correct to float32 rounding. Along a contiguous run
// the sum is also pairwise (blocks of 128, as NumPy), which keeps float64
// sums accurate; across rows (a reduced axis that is not innermost) each
// column adds row by row, as NumPy does. Integer sums accumulate modulo 2^64
// and return int64, wrapping like NumPy.
//
// Work is cut into tasks that depend only on the shape (never on the thread
// count), so a result is the same however many threads compute it.
//
// On a GPU the passes are the same; kernels/reduce.cuh computes them, in
// the steps backend/cuda/reduce.hpp plans (sums accumulate in double there too,
// in another order than here, so float sums may differ in the last bit).
#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "half.hpp"
#include "../backend/cpu/threads.hpp"
#include "../core/creation.hpp"
#include "../expr/evaluate.hpp"
#include "../backend/cuda/launch.hpp"
#include "../backend/cuda/reduce.hpp"
#include "layout.hpp"

namespace hybra {

namespace detail::reduce {

using i64 = std::int64_t;

template <class Acc, class In>
HYBRA_HD Acc load(In v) {
  if constexpr (std::is_same_v<Acc, std::uint64_t>) return static_cast<std::uint64_t>(static_cast<std::int64_t>(v));
  else return static_cast<Acc>(v);
}

// Where a reduction reads its operand, a contiguous block: from memory, or
// computed run by run (a CPU plan's sum of a loop's value, which is never
// written: backend/cpu/fused_loop.hpp's Reader, jit/plan.hpp). Each thread
// reads through its own cursor: run(at, n) gives elements [at, at + n).
template <class T>
struct in_memory {
  using value_type = T;
  struct cursor {
    const T* x;
    const T* run(i64 at, i64) const { return x + at; }
  };
  const T* x;
  cursor open() const { return {x}; }
};

inline constexpr i64 pairwise_block = 128;
// The most elements a sum or mean asks a cursor for at once: a row's columns
// (reduce_3d's task width) or a part of a row that the pairwise halving reaches.
inline constexpr i64 longest_run = 1024;

// The n elements at p summed pairwise.
template <class Acc, class T>
Acc pairwise_sum(const T* p, i64 n) {
  if (n <= pairwise_block) {
    Acc s = 0;
#pragma omp simd reduction(+ : s)
    for (i64 i = 0; i < n; ++i) s += load<Acc>(p[i]);
    return s;
  }
  const i64 half = n / 2 / 16 * 16;
  return pairwise_sum<Acc>(p, half) + pairwise_sum<Acc>(p + half, n - half);
}

// Elements [at, at + n) of a cursor summed pairwise, in the same order: a
// computed operand is asked for runs of at most longest_run elements, each
// the whole of a part the halving reaches, so that it computes them in
// long blocks (a sum that writes its loop's value computes each run there).
template <class Acc, class Cursor>
Acc pairwise_sum(Cursor& cur, i64 at, i64 n) {
  if (n <= longest_run) return pairwise_sum<Acc>(cur.run(at, n), n);
  const i64 half = n / 2 / 16 * 16;
  return pairwise_sum<Acc>(cur, at, half) + pairwise_sum<Acc>(cur, at + half, n - half);
}

// v replaces acc when it is more extreme or NaN; a NaN acc stays, so NaN
// propagates as in NumPy's max/min.
template <bool Max, class T>
HYBRA_HD T pick(T acc, T v) {
  if constexpr (Max) return (v > acc || v != v) ? v : acc;
  else return (v < acc || v != v) ? v : acc;
}

// max/min of a contiguous run (n >= 1). NaN is tracked in a separate flag
// so that the loop is a plain vector max/min reduction.
template <bool Max, class T>
T row_extreme(const T* p, i64 n) {
  T m = p[0];
  int nan = 0;
  if constexpr (Max) {
#pragma omp simd reduction(max : m) reduction(| : nan)
    for (i64 i = 0; i < n; ++i) {
      m = p[i] > m ? p[i] : m;
      nan |= p[i] != p[i];
    }
  } else {
#pragma omp simd reduction(min : m) reduction(| : nan)
    for (i64 i = 0; i < n; ++i) {
      m = p[i] < m ? p[i] : m;
      nan |= p[i] != p[i];
    }
  }
  if constexpr (std::is_floating_point_v<T>)
    if (nan) return std::numeric_limits<T>::quiet_NaN();
  return m;
}

// A policy reduces a contiguous row, elements [at, at + n) of a cursor
// (row), accumulates whole rows elementwise (first_row, next_row; r is the
// row's index along the reduced axis) and combines two partial results in
// order (combine).
template <class Acc>
struct sum_op {
  using acc = Acc;
  template <class Cursor>
  static Acc row(Cursor& cur, i64 at, i64 n, i64) {
    return pairwise_sum<Acc>(cur, at, n);
  }
  template <class In>
  static void first_row(Acc* o, const In* p, i64 n, i64) {
#pragma omp simd
    for (i64 j = 0; j < n; ++j) o[j] = load<Acc>(p[j]);
  }
  template <class In>
  static void next_row(Acc* o, const In* p, i64 n, i64) {
#pragma omp simd
    for (i64 j = 0; j < n; ++j) o[j] += load<Acc>(p[j]);
  }
  static Acc combine(Acc a, Acc b) { return a + b; }
};

template <class T, bool Max>
struct extreme_op {
  using acc = T;
  template <class Cursor>
  static T row(Cursor& cur, i64 at, i64 n, i64) {
    return row_extreme<Max>(cur.run(at, n), n);
  }
  static void first_row(T* o, const T* p, i64 n, i64) { std::copy_n(p, n, o); }
  static void next_row(T* o, const T* p, i64 n, i64) {
#pragma omp simd
    for (i64 j = 0; j < n; ++j) o[j] = pick<Max>(o[j], p[j]);
  }
  static T combine(T a, T b) { return pick<Max>(a, b); }
};

template <class T>
struct arg_entry {
  T value;
  i64 index;
};

// First index of the maximum; the first NaN wins over any number (NumPy).
template <class T>
struct argmax_op {
  using acc = arg_entry<T>;
  static bool better(T v, T best) { return v > best || (v != v && best == best); }
  // The maximum is found vectorised, then its first position: a block of
  // 16 at a time is tested with one vector compare, then the hit block.
  template <class Cursor>
  static acc row(Cursor& cur, i64 at, i64 n, i64 first) {
    const T* p = cur.run(at, n);
    const T m = row_extreme<true>(p, n);
    auto find = [&](auto is_max) {
      i64 i = 0;
      for (; i + 16 <= n; i += 16) {
        int hit = 0;
#pragma omp simd reduction(| : hit)
        for (i64 k = 0; k < 16; ++k) hit |= is_max(p[i + k]);
        if (hit) break;
      }
      while (!is_max(p[i])) ++i;
      return i;
    };
    const i64 i = m != m ? find([](T v) { return v != v; }) : find([m](T v) { return v == m; });
    return {m, first + i};
  }
  static void first_row(acc* o, const T* p, i64 n, i64 r) {
    for (i64 j = 0; j < n; ++j) o[j] = {p[j], r};
  }
  static void next_row(acc* o, const T* p, i64 n, i64 r) {
    for (i64 j = 0; j < n; ++j)
      if (better(p[j], o[j].value)) o[j] = {p[j], r};
  }
  static acc combine(acc a, acc b) { return better(b.value, a.value) ? b : a; }
};

// Reduces x, a contiguous (O, R, I) block with R >= 1 (a source, above),
// over its middle axis into out, a contiguous (O, I) block.
template <class P, class Source>
void reduce_3d(const Source& x, typename P::acc* out, i64 O, i64 R, i64 I) {
  using Acc = typename P::acc;
  // With fewer independent outputs (or column blocks) than `few`, the reduced
  // axis is cut into pieces of at least `task` elements so all threads work.
  constexpr i64 task = 1 << 16, few = 16, max_pieces = 64;
  if (I == 1) {
    const i64 len = O >= few ? R : std::max(task, (R + max_pieces - 1) / max_pieces);
    const i64 pieces = (R + len - 1) / len;
    if (pieces == 1) {
      backend::cpu::parallel_for(O, R, [&](i64 first, i64 last) {
        auto cur = x.open();
        for (i64 o = first; o < last; ++o) out[o] = P::row(cur, o * R, R, 0);
      });
      return;
    }
    std::vector<Acc> part(static_cast<std::size_t>(O * pieces));
    backend::cpu::parallel_for(O * pieces, len, [&](i64 first, i64 last) {
      auto cur = x.open();
      for (i64 t = first; t < last; ++t) {
        const i64 o = t / pieces, r0 = (t % pieces) * len;
        part[static_cast<std::size_t>(t)] = P::row(cur, o * R + r0, std::min(len, R - r0), r0);
      }
    });
    for (i64 o = 0; o < O; ++o) {
      Acc a = part[static_cast<std::size_t>(o * pieces)];
      for (i64 c = 1; c < pieces; ++c) a = P::combine(a, part[static_cast<std::size_t>(o * pieces + c)]);
      out[o] = a;
    }
    return;
  }
  const i64 width = std::min(I, longest_run);  // columns per task
  const i64 blocks = (I + width - 1) / width;
  const i64 len = O * blocks >= few ? R : std::max((task + width - 1) / width, (R + max_pieces - 1) / max_pieces);
  const i64 pieces = (R + len - 1) / len;
  std::vector<Acc> part(pieces > 1 ? static_cast<std::size_t>(O * pieces * I) : 0);
  backend::cpu::parallel_for(O * blocks * pieces, len * width, [&](i64 first, i64 last) {
    auto cur = x.open();
    for (i64 t = first; t < last; ++t) {
      const i64 c = t % pieces, block = (t / pieces) % blocks, o = t / pieces / blocks;
      const i64 j0 = block * width, n = std::min(width, I - j0);
      const i64 r0 = c * len, r1 = std::min(R, r0 + len);
      Acc* dst = pieces == 1 ? out + o * I + j0 : part.data() + (o * pieces + c) * I + j0;
      const i64 at = o * R * I + j0;
      P::first_row(dst, cur.run(at + r0 * I, n), n, r0);
      for (i64 r = r0 + 1; r < r1; ++r) P::next_row(dst, cur.run(at + r * I, n), n, r);
    }
  });
  if (pieces == 1) return;
  for (i64 o = 0; o < O; ++o)
    for (i64 j = 0; j < I; ++j) {
      Acc a = part[static_cast<std::size_t>(o * pieces * I + j)];
      for (i64 c = 1; c < pieces; ++c) a = P::combine(a, part[static_cast<std::size_t>((o * pieces + c) * I + j)]);
      out[o * I + j] = a;
    }
}

struct run {
  i64 extent;
  bool reduced;
};

// The contiguous shape as alternating runs of kept and reduced dims; dims of
// extent 1 are dropped, as they change no index.
inline std::vector<run> collapse(const Shape& shape, const std::vector<bool>& reduced) {
  std::vector<run> runs;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!runs.empty() && runs.back().reduced == reduced[d]) runs.back().extent *= shape[d];
    else runs.push_back({shape[d], reduced[d]});
  }
  return runs;
}

// The passes that reduce every reduced run of a contiguous tensor,
// innermost first, as (O, R, I) blocks: each pass reduces the middle axis of
// the previous pass's result (the first, of the tensor). The last result
// holds the kept elements in order. Needs at least one reduced run.
inline std::vector<std::array<i64, 3>> passes(std::vector<run> runs) {
  std::vector<std::array<i64, 3>> blocks;
  for (;;) {
    auto it = std::find_if(runs.rbegin(), runs.rend(), [](const run& r) { return r.reduced; });
    if (it == runs.rend()) break;
    const auto k = static_cast<std::size_t>(runs.rend() - it - 1);
    i64 O = 1, I = 1;
    for (std::size_t d = 0; d < k; ++d) O *= runs[d].extent;
    for (std::size_t d = k + 1; d < runs.size(); ++d) I *= runs[d].extent;
    blocks.push_back({O, runs[k].extent, I});
    runs.erase(runs.begin() + static_cast<std::ptrdiff_t>(k));
    if (k > 0 && k < runs.size()) {
      runs[k - 1].extent *= runs[k].extent;
      runs.erase(runs.begin() + static_cast<std::ptrdiff_t>(k));
    }
  }
  return blocks;
}

template <class P, class Source>
std::vector<typename P::acc> reduce_runs(const Source& x, const std::vector<run>& runs) {
  using Acc = typename P::acc;
  std::vector<Acc> cur;
  bool first = true;
  for (const auto& [O, R, I] : passes(runs)) {
    std::vector<Acc> next(static_cast<std::size_t>(O * I));
    if (first) reduce_3d<P>(x, next.data(), O, R, I);
    else reduce_3d<P>(in_memory<Acc>{cur.data()}, next.data(), O, R, I);
    cur = std::move(next);
    first = false;
  }
  return cur;
}

// Which dims are reduced: all when axes is nullopt. Axes may be negative;
// out-of-range and repeated axes are AxisErrors naming the op and shape.
inline std::vector<bool> axis_mask(const Shape& shape, const std::optional<std::vector<i64>>& axes,
                                   std::string_view op) {
  std::vector<bool> mask(shape.size(), !axes);
  if (!axes) return mask;
  for (auto a : *axes) {
    const int d = detail::checked_axis(a, shape, op);
    if (mask[static_cast<std::size_t>(d)])
      fail<AxisError>(op, ": axis ", a, " is repeated in axes ", detail::axes_string(*axes), " for shape ",
                      to_string(shape));
    mask[static_cast<std::size_t>(d)] = true;
  }
  return mask;
}

using backend::cuda::Reduction;

// The size of kernels/reduce.cuh's accumulator of reduction r of `in`: a
// (value, index) pair for argmax, the value for max and min, a double or a
// 64-bit integer for sums.
inline i64 gpu_acc_bytes(Reduction r, DType in) {
  if (r == Reduction::argmax) return 16;
  if (r == Reduction::max || r == Reduction::min) return static_cast<i64>(size_of(in));
  return 8;
}

// A reduction of a contiguous tensor of dtype `in` on a GPU, in the passes
// the CPU would make (backend/cuda/reduce.hpp plans the launches).
inline backend::cuda::CudaLaunch cuda_reduction(Reduction r, std::string_view op, DType in,
                                                const std::vector<std::array<i64, 3>>& blocks,
                                                backend::cuda::Gpu& gpu) {
  auto plan = std::make_shared<const backend::cuda::ReducePlan>(
      backend::cuda::plan_reduce(blocks, gpu_acc_bytes(r, in), gpu.info().multiprocessors));
  return {plan->scratch_bytes, [plan, op, launch = backend::cuda::cuda_reduce_launcher(r, in, gpu)](
                                   backend::cuda::Gpu& g, std::span<const void* const> x, void* out, void* scratch) {
            launch(g, *plan, x[0], out, scratch, op);
          }};
}

// Reduction K of the contiguous x over `axes` on a GPU; nullopt where the
// op launches nothing (x is empty, or each result is one element of x: the
// eager op fills or converts).
template <Reduction K>
std::optional<backend::cuda::CudaLaunch> cuda_reduce_launch(const Tensor& x,
                                                            const std::optional<std::vector<i64>>& axes,
                                                            std::string_view op, backend::cuda::Gpu& gpu) {
  const auto mask = axis_mask(x.shape(), axes, op);
  i64 count = 1;
  for (std::size_t d = 0; d < mask.size(); ++d)
    if (mask[d]) count *= x.shape()[d];
  if (x.size() == 0 || count == 1) return std::nullopt;
  return cuda_reduction(K, op, x.dtype(), passes(collapse(x.shape(), mask)), gpu);
}

// argmax's (O, R, I) block: R along `axis`, or the whole tensor.
inline std::array<i64, 3> argmax_block(const Shape& shape, std::optional<i64> axis) {
  if (!axis) return {1, checked_numel(shape, "argmax"), 1};
  const auto ax = static_cast<std::size_t>(detail::checked_axis(*axis, shape, "argmax"));
  i64 O = 1, I = 1;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (d < ax) O *= shape[d];
    if (d > ax) I *= shape[d];
  }
  return {O, shape[ax], I};
}

// argmax of the contiguous x on a GPU; nullopt for an empty x (the eager op
// launches nothing).
inline std::optional<backend::cuda::CudaLaunch> cuda_argmax_launch(const Tensor& x, std::optional<i64> axis,
                                                                   backend::cuda::Gpu& gpu) {
  if (x.size() == 0) return std::nullopt;
  return cuda_reduction(Reduction::argmax, "argmax", x.dtype(), {argmax_block(x.shape(), axis)}, gpu);
}

// Reduces the contiguous operand x (a source, above), whose dims collapse to
// `runs`, into out; `count` elements reduce into each output element. A sum
// or a mean asks a cursor for at most longest_run elements at once; a max or
// min for whole rows.
template <Reduction K, class Source>
void reduce_into(const Source& x, const Tensor& out, const std::vector<run>& runs, i64 count) {
  using T = typename Source::value_type;
  auto write = [&](const auto& values, auto convert) {
    using O = decltype(convert(values[0]));
    O* dst = static_cast<O*>(out.raw_data());
    backend::cpu::parallel_for(out.size(), 1, [&](i64 first, i64 last) {
      for (i64 i = first; i < last; ++i) dst[i] = convert(values[static_cast<std::size_t>(i)]);
    });
  };
  if constexpr (K == Reduction::sum) {
    using Acc = std::conditional_t<std::is_floating_point_v<T>, double, std::uint64_t>;
    using O = std::conditional_t<std::is_floating_point_v<T>, T, std::int64_t>;
    write(reduce_runs<sum_op<Acc>>(x, runs), [](Acc v) { return static_cast<O>(v); });
  } else if constexpr (K == Reduction::mean) {
    const double n = static_cast<double>(count);
    write(reduce_runs<sum_op<double>>(x, runs), [n](double v) { return static_cast<floating_t<T>>(v / n); });
  } else {
    write(reduce_runs<extreme_op<T, K == Reduction::max>>(x, runs), [](T v) { return v; });
  }
}

template <Reduction K>
Tensor reduce(const Tensor& x, const std::optional<std::vector<i64>>& axes, bool keepdims, std::string_view op) {
  x.require(op.data());
  if (auto r = compute_in_float32({x}, [&](std::span<const Tensor> f) { return reduce<K>(f[0], axes, keepdims, op); })) return *r;
  const Shape& shape = x.shape();
  const auto mask = axis_mask(shape, axes, op);
  Shape out_shape;
  i64 count = 1;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (!mask[d]) out_shape.push_back(shape[d]);
    else if (keepdims) out_shape.push_back(1);
    if (mask[d]) count *= shape[d];
  }
  const DType in = x.dtype();
  const DType out_dtype = K == Reduction::sum    ? (is_floating(in) ? in : DType::int64)
                          : K == Reduction::mean ? (is_floating(in) ? in : DType::float32)
                                            : in;
  if (checked_numel(out_shape, op) == 0) return Tensor(out_shape, out_dtype, x.device());
  if (count == 0) {
    if constexpr (K == Reduction::sum) return zeros(out_shape, out_dtype, x.device());
    if constexpr (K == Reduction::mean) return full(out_shape, std::numeric_limits<double>::quiet_NaN(), out_dtype, x.device());
    fail<ValueError>(op, ": cannot reduce a zero-size axis of shape ", to_string(shape), " (", op,
                     " has no identity)");
  }
  // Nothing to reduce: a copy in the result's dtype.
  if (count == 1) return x.astype(out_dtype).view(out_shape, contiguous_strides(out_shape), 0);

  const Tensor xc = x.contiguous();
  Tensor out(out_shape, out_dtype, x.device());
  if (x.device().kind == DeviceKind::cuda) {
    backend::cuda::push_cuda_launch(op, {xc}, out,
                                    *cuda_reduce_launch<K>(xc, axes, op, backend::cuda::gpu(x.device().id)));
    return out;
  }
  push_kernel(op, {xc}, {out}, [xc, out, runs = collapse(shape, mask), count] {
    dispatch(xc.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      reduce_into<K>(in_memory<T>{static_cast<const T*>(xc.raw_data())}, out, runs, count);
    });
  });
  return out;
}

}  // namespace detail::reduce

// The axes a reduction runs over: all of them (the default, also written
// std::nullopt or {}), one axis, or a list such as {0, -1}. Negative axes
// count from the end. An explicitly empty std::vector reduces over no axis.
class Axes {
 public:
  Axes() = default;
  Axes(std::nullopt_t) {}  // NOLINT(google-explicit-constructor): sum(x, std::nullopt, true)
  Axes(std::int64_t axis) : list_(std::vector<std::int64_t>{axis}) {}  // NOLINT: sum(x, 1)
  Axes(std::initializer_list<std::int64_t> axes) : list_(std::vector<std::int64_t>(axes)) {}
  Axes(std::vector<std::int64_t> axes) : list_(std::move(axes)) {}  // NOLINT
  const std::optional<std::vector<std::int64_t>>& list() const { return list_; }

 private:
  std::optional<std::vector<std::int64_t>> list_;
};

// A reduction's node attributes (op::sum and the others read them back).
inline op::Attrs reduce_attrs(const Axes& axes, bool keepdims) {
  return {{"axis", op::attr_text(axes.list())}, {"keepdims", op::attr_text(keepdims)}};
}

// Sum; integers sum to int64, floats keep their dtype; an empty sum is 0.
template <tensor_like X>
Tensor sum(X&& x_in, const Axes& axes = {}, bool keepdims = false) {
  Tensor x = eval(x_in);
  autograd::op_record rec("sum", {x});
  return rec.output(detail::reduce::reduce<detail::reduce::Reduction::sum>(x, axes.list(), keepdims, "sum"),
                    [&] { return reduce_attrs(axes, keepdims); });
}

// Mean; integers give float32. An empty mean is NaN.
template <tensor_like X>
Tensor mean(X&& x_in, const Axes& axes = {}, bool keepdims = false) {
  Tensor x = eval(x_in);
  autograd::op_record rec("mean", {x});
  return rec.output(detail::reduce::reduce<detail::reduce::Reduction::mean>(x, axes.list(), keepdims, "mean"),
                    [&] { return reduce_attrs(axes, keepdims); });
}

// Maximum, in x's dtype; NaN wins. Reducing an empty axis is a ValueError.
template <tensor_like X>
Tensor max(X&& x_in, const Axes& axes = {}, bool keepdims = false) {
  Tensor x = eval(x_in);
  autograd::op_record rec("max", {x});
  return rec.output(detail::reduce::reduce<detail::reduce::Reduction::max>(x, axes.list(), keepdims, "max"),
                    [&] { return reduce_attrs(axes, keepdims); });
}

// Minimum, in x's dtype; NaN wins. Reducing an empty axis is a ValueError.
template <tensor_like X>
Tensor min(X&& x_in, const Axes& axes = {}, bool keepdims = false) {
  Tensor x = eval(x_in);
  autograd::op_record rec("min", {x});
  return rec.output(detail::reduce::reduce<detail::reduce::Reduction::min>(x, axes.list(), keepdims, "min"),
                    [&] { return reduce_attrs(axes, keepdims); });
}

// int64 index of the first maximum along `axis`, or into the flattened
// tensor when axis is omitted (as NumPy); the first NaN counts as the maximum.
template <tensor_like X>
Tensor argmax(X&& x_in, std::optional<std::int64_t> axis = std::nullopt, bool keepdims = false) {
  using detail::reduce::i64;
  Tensor x = eval(x_in);
  x.require("argmax");
  if (auto r = detail::compute_in_float32({x}, [&](std::span<const Tensor> f) { return argmax(f[0], axis, keepdims); }))
    return *r;
  const Shape& shape = x.shape();
  const auto [O, R, I] = detail::reduce::argmax_block(shape, axis);
  Shape out_shape;
  if (axis) {
    const auto ax = static_cast<std::size_t>(detail::checked_axis(*axis, shape, "argmax"));
    for (std::size_t d = 0; d < shape.size(); ++d) {
      if (d != ax) out_shape.push_back(shape[d]);
      else if (keepdims) out_shape.push_back(1);
    }
  } else if (keepdims) {
    out_shape.assign(shape.size(), 1);
  }
  Tensor out(out_shape, DType::int64, x.device());
  if (out.size() == 0) return out;
  if (R == 0) fail<ValueError>("argmax: cannot reduce a zero-size axis of shape ", to_string(shape), " (argmax has no identity)");
  const Tensor xc = x.contiguous();
  if (xc.device().kind == DeviceKind::cuda) {
    backend::cuda::push_cuda_launch("argmax", {xc}, out,
                                    *detail::reduce::cuda_argmax_launch(xc, axis, backend::cuda::gpu(xc.device().id)));
    return out;
  }
  push_kernel("argmax", {xc}, {out}, [xc, out, O = O, R = R, I = I] {
    dispatch(xc.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      using P = detail::reduce::argmax_op<T>;
      std::vector<typename P::acc> found(static_cast<std::size_t>(O * I));
      detail::reduce::reduce_3d<P>(detail::reduce::in_memory<T>{static_cast<const T*>(xc.raw_data())}, found.data(), O, R, I);
      auto* dst = static_cast<std::int64_t*>(out.raw_data());
      for (std::size_t i = 0; i < found.size(); ++i) dst[i] = found[i].index;
    });
  });
  return out;
}

namespace detail::reduce {
// A reduction's node attributes as ops/op.hpp's facets read them.
inline Axes axes_attr(const op::Attrs& a, std::string_view op) {
  auto axes = op::optional_tuple_attr(a, "axis", op);
  return axes ? Axes(*axes) : Axes();
}
// The four reductions share their attributes (axis, keepdims) and their MXNet form.
template <Reduction K>
struct reduction {
  static constexpr std::string_view name = backend::cuda::detail::reduction_name(K);
  static Tensor eval(std::span<const Tensor> in, const op::Attrs& a) {
    return reduce<K>(in[0], axes_attr(a, name).list(), op::bool_attr(a, "keepdims", name), name);
  }
  static std::optional<backend::cuda::CudaLaunch> cuda_launch(std::span<const Tensor> in, const Tensor&,
                                                              const op::Attrs& a, backend::cuda::Gpu& gpu) {
    return cuda_reduce_launch<K>(in[0], op::optional_tuple_attr(a, "axis", name), name, gpu);
  }
  static constexpr std::array<std::string_view, 1> mxnet{name};
  template <class W>
  static auto write(const W& w) {
    op::Attrs a;
    const std::string axis = w.attr("axis");
    if (axis == "()") w.reject("reduces no axis");
    if (axis != "None") a.emplace_back("axis", axis);
    a.emplace_back("keepdims", w.bool_text(op::parse_bool(w.attr("keepdims"), name)));
    return w.keep_all(std::string(name), std::move(a));
  }
  template <class R>
  static auto read(const R& r) {
    r.arity(1, 1);
    if (r.flag("exclude", false)) r.reject("exclude=True is not supported");
    auto axis = r.tuple("axis");
    return r.make(std::string(name), {{"axis", axis && !axis->empty() ? op::attr_text(*axis) : "None"},
                                      {"keepdims", op::attr_text(r.flag("keepdims", false))}});
  }
  // The minimum and maximum: the gradient goes to the elements equal to the
  // result, shared equally among ties.
  template <class G>
  static auto extreme_gradient(const G& g) {
    auto hit = g.sym(g.in[0] == g.keep_reduced_axes(g.out)).astype(g.dy.dtype());
    auto ties = g.sum(hit, g.reduced_axes(), true);
    return g.grads(hit * g.broadcast_to(g.keep_reduced_axes(g.dy), g.shape(0)) / ties);
  }
};
}  // namespace detail::reduce

namespace op {

struct sum : hybra::detail::reduce::reduction<backend::cuda::Reduction::sum> {
  template <class G> static auto gradient(const G& g) {
    return g.grads(g.broadcast_to(g.keep_reduced_axes(g.dy), g.shape(0)));
  }
};
struct mean : hybra::detail::reduce::reduction<backend::cuda::Reduction::mean> {
  template <class G> static auto gradient(const G& g) {
    const double count = static_cast<double>(checked_numel(g.shape(0))) /
                         static_cast<double>(std::max<std::int64_t>(1, checked_numel(g.out.shape())));
    return g.grads(g.broadcast_to(g.keep_reduced_axes(g.dy), g.shape(0)) / count);
  }
};
struct max : hybra::detail::reduce::reduction<backend::cuda::Reduction::max> {
  template <class G> static auto gradient(const G& g) { return extreme_gradient(g); }
};
struct min : hybra::detail::reduce::reduction<backend::cuda::Reduction::min> {
  template <class G> static auto gradient(const G& g) { return extreme_gradient(g); }
};

struct argmax {
  static constexpr std::string_view name = "argmax";
  static Tensor eval(std::span<const Tensor> in, const op::Attrs& a) {
    return hybra::argmax(in[0], op::optional_int_attr(a, "axis", name), op::bool_attr(a, "keepdims", name));
  }
  static std::optional<backend::cuda::CudaLaunch> cuda_launch(std::span<const Tensor> in, const Tensor&,
                                                              const op::Attrs& a, backend::cuda::Gpu& gpu) {
    return hybra::detail::reduce::cuda_argmax_launch(in[0], op::optional_int_attr(a, "axis", name), gpu);
  }
  // An index: no gradient flows through it.
  template <class G> static auto gradient(const G& g) { return g.grads(); }
  static constexpr std::array<std::string_view, 1> mxnet{"argmax"};
  template <class W>
  static auto write(const W& w) {
    op::Attrs a;
    if (w.attr("axis") != "None") a.emplace_back("axis", w.attr("axis"));
    a.emplace_back("keepdims", w.bool_text(op::parse_bool(w.attr("keepdims"), name)));
    return w.keep_all("argmax", std::move(a));
  }
  template <class R>
  static auto read(const R& r) {
    r.arity(1, 1);
    auto axis = r.parsed("axis", [](std::string_view t) { return op::parse_int(t, "axis"); });
    return r.make("argmax", {{"axis", op::attr_text(axis)}, {"keepdims", op::attr_text(r.flag("keepdims", false))}});
  }
};

}  // namespace op

}  // namespace hybra
