#pragma once
// softmax and log_softmax along one axis, computed stably: the maximum is
// subtracted before exp, so no exp overflows (inputs of 1000 are fine), and
// log_softmax is x - max - log(sum(exp(x - max))) rather than log(softmax),
// which would turn underflowed probabilities into -inf. The exp sums
// accumulate in double. Integer inputs are computed in float32. On a GPU the
// same steps are kernels/softmax.cuh's.
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "half.hpp"
#include "../backend/cpu/threads.hpp"
#include "../expr/evaluate.hpp"
#include "reduce.hpp"

namespace hybra {

namespace detail::softmax {

using i64 = std::int64_t;

// y = softmax (or log_softmax) of x, both contiguous (O, R, I) blocks,
// normalised over the middle axis; R >= 1.
template <bool Log, class T>
void softmax_3d(const T* x, T* y, i64 O, i64 R, i64 I) {
  if (I == 1) {
    backend::cpu::parallel_for(O, R, [&](i64 first, i64 last) {
      for (i64 o = first; o < last; ++o) {
        const T* p = x + o * R;
        T* q = y + o * R;
        const T m = reduce::row_extreme<true>(p, R);
        double s = 0;
        if constexpr (Log) {
#pragma omp simd reduction(+ : s)
          for (i64 i = 0; i < R; ++i) s += std::exp(p[i] - m);
          const T log_s = static_cast<T>(std::log(s));
#pragma omp simd
          for (i64 i = 0; i < R; ++i) q[i] = (p[i] - m) - log_s;
        } else {
#pragma omp simd reduction(+ : s)
          for (i64 i = 0; i < R; ++i) {
            const T e = std::exp(p[i] - m);
            q[i] = e;
            s += e;
          }
          const T inv = static_cast<T>(1 / s);
#pragma omp simd
          for (i64 i = 0; i < R; ++i) q[i] *= inv;
        }
      }
    });
    return;
  }
  // Normalising over a non-last axis: each task handles a block of columns,
  // walking the R rows three times (max, exp-sum, scale) in memory order.
  const i64 width = std::min<i64>(I, 1024);
  const i64 blocks = (I + width - 1) / width;
  backend::cpu::parallel_for(O * blocks, R * width, [&](i64 first, i64 last) {
    std::vector<T> m(static_cast<std::size_t>(width));
    std::vector<double> s(static_cast<std::size_t>(width));
    for (i64 t = first; t < last; ++t) {
      const i64 o = t / blocks, j0 = (t % blocks) * width, n = std::min(width, I - j0);
      const T* p = x + o * R * I + j0;
      T* q = y + o * R * I + j0;
      std::copy_n(p, n, m.data());
      for (i64 r = 1; r < R; ++r) {
#pragma omp simd
        for (i64 j = 0; j < n; ++j) m[j] = reduce::pick<true>(m[j], p[r * I + j]);
      }
      std::fill_n(s.data(), n, 0.0);
      for (i64 r = 0; r < R; ++r) {
#pragma omp simd
        for (i64 j = 0; j < n; ++j) {
          const T e = std::exp(p[r * I + j] - m[j]);
          if constexpr (!Log) q[r * I + j] = e;
          s[j] += e;
        }
      }
      for (i64 j = 0; j < n; ++j) s[j] = Log ? std::log(s[j]) : 1 / s[j];
      for (i64 r = 0; r < R; ++r) {
#pragma omp simd
        for (i64 j = 0; j < n; ++j) {
          if constexpr (Log) q[r * I + j] = (p[r * I + j] - m[j]) - static_cast<T>(s[j]);
          else q[r * I + j] *= static_cast<T>(s[j]);
        }
      }
    }
  });
}

// The (O, R, I) block that softmax along `axis` normalises over R.
inline std::array<i64, 3> softmax_block(const Shape& shape, std::int64_t axis, std::string_view op) {
  // A 0-d tensor is one element along its only "axis" (-1 or 0), as PyTorch.
  const Shape as_1d = shape.empty() ? Shape{1} : shape;
  if (shape.empty() && axis != 0 && axis != -1)
    fail<AxisError>(op, ": axis ", axis, " is out of range for a tensor of shape ()");
  const auto ax = static_cast<std::size_t>(detail::checked_axis(axis, as_1d, op));
  i64 O = 1, I = 1;
  for (std::size_t d = 0; d < as_1d.size(); ++d) {
    if (d < ax) O *= as_1d[d];
    if (d > ax) I *= as_1d[d];
  }
  return {O, as_1d[ax], I};
}

// softmax (or log_softmax) of the contiguous x on a GPU; nullopt where the
// op launches nothing of its own (x is empty, or an integer dtype the eager
// op converts first).
template <bool Log>
std::optional<backend::cuda::CudaLaunch> cuda_softmax_launch(const Tensor& x, std::int64_t axis, std::string_view op,
                                                             backend::cuda::Gpu& gpu) {
  const auto [O, R, I] = softmax_block(x.shape(), axis, op);
  if (x.size() == 0 || !is_floating(x.dtype())) return std::nullopt;
  return backend::cuda::CudaLaunch{
      0, [O = O, R = R, I = I, op, launch = backend::cuda::cuda_softmax_launcher(Log, x.dtype(), gpu)](
             backend::cuda::Gpu& g, std::span<const void* const> in, void* out, void*) {
        launch(g, in[0], out, O, R, I, op);
      }};
}

template <bool Log>
Tensor run(Tensor x, std::int64_t axis, std::string_view op) {
  x.require(op.data());
  if (auto r = compute_in_float32({x}, [&](std::span<const Tensor> f) { return run<Log>(f[0], axis, op); })) return *r;
  const auto [O, R, I] = softmax_block(x.shape(), axis, op);
  if (!is_floating(x.dtype())) x = x.astype(DType::float32);
  x = x.contiguous();
  Tensor out(x.shape(), x.dtype(), x.device());
  if (out.size() == 0) return out;
  if (x.device().kind == DeviceKind::cuda) {
    backend::cuda::push_cuda_launch(op, {x}, out,
                                    *cuda_softmax_launch<Log>(x, axis, op, backend::cuda::gpu(x.device().id)));
    return out;
  }
  push_kernel(op, {x}, {out}, [x, out, O = O, R = R, I = I] {
    dispatch(x.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_floating_point_v<T>)
        softmax_3d<Log>(static_cast<const T*>(x.raw_data()), static_cast<T*>(out.raw_data()), O, R, I);
    });
  });
  return out;
}

}  // namespace detail::softmax

// exp(x) / sum(exp(x)) along `axis`.
template <tensor_like X>
Tensor softmax(X&& x_in, std::int64_t axis = -1) {
  Tensor x = eval(x_in);
  autograd::op_record rec("softmax", {x});
  return rec.output(detail::softmax::run<false>(x, axis, "softmax"), [&] { return axis_attrs(axis); });
}

// log(softmax(x)) along `axis`, without forming softmax(x).
template <tensor_like X>
Tensor log_softmax(X&& x_in, std::int64_t axis = -1) {
  Tensor x = eval(x_in);
  autograd::op_record rec("log_softmax", {x});
  return rec.output(detail::softmax::run<true>(x, axis, "log_softmax"), [&] { return axis_attrs(axis); });
}

namespace detail::softmax {
// softmax and log_softmax share their attribute (axis) and their MXNet form.
template <bool Log>
struct entry {
  static constexpr std::string_view name = Log ? "log_softmax" : "softmax";
  static Tensor eval(std::span<const Tensor> in, const op::Attrs& a) {
    const std::int64_t axis = op::int_attr(a, "axis", name);
    if constexpr (Log) return hybra::log_softmax(in[0], axis);
    else return hybra::softmax(in[0], axis);
  }
  static std::optional<backend::cuda::CudaLaunch> cuda_launch(std::span<const Tensor> in, const Tensor&,
                                                              const op::Attrs& a, backend::cuda::Gpu& gpu) {
    return cuda_softmax_launch<Log>(in[0], op::int_attr(a, "axis", name), name, gpu);
  }
  static constexpr std::array<std::string_view, 1> mxnet{name};
  template <class W> static auto write(const W& w) { return w.keep_all(std::string(name), {{"axis", w.attr("axis")}}); }
  template <class R>
  static auto read(const R& r) {
    r.arity(1, 1);
    if (r.attr("temperature") && r.real("temperature", 1) != 1) r.reject("temperature is not supported");
    return r.make(std::string(name), {{"axis", op::attr_text(r.integer("axis", -1))}});
  }
};
}  // namespace detail::softmax

namespace op {
struct softmax : hybra::detail::softmax::entry<false> {
  template <class G> static auto gradient(const G& g) {
    return g.grads(g.out * (g.dy - g.sum(g.sym(g.dy * g.out), g.int_attr("axis"), true)));
  }
};
struct log_softmax : hybra::detail::softmax::entry<true> {
  template <class G> static auto gradient(const G& g) {
    return g.grads(g.dy - g.exp(g.out) * g.sum(g.dy, g.int_attr("axis"), true));
  }
};
}  // namespace op

}  // namespace hybra
