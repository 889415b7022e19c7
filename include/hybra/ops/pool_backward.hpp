#pragma once
// The gradient of pooling (pool.hpp): an op of its own, one engine op on
// contiguous float32/float64 NCHW tensors. Apart from pool.hpp because nvcc
// cannot read its GCC vector code, and programs nvcc compiles include the
// forward ops (eager.hpp).
//
// Max pooling recomputes each window's first maximum (a NaN wins, its first
// one, as the forward's max) and adds dy there; 2x2 windows with stride 2 and
// no padding that stay inside the input (LeNet's) go eight windows at a time,
// writing every element of dx once. Average pooling spreads dy / divisor along each
// window's columns into a row, then adds that row to the window's rows.
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <ostream>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "half.hpp"
#include "../backend/cpu/isa.hpp"
#include "../backend/cuda/launch.hpp"
#include "conv_cuda.hpp"
#include "pool.hpp"

namespace hybra {

namespace detail::nn {

// 2x2 windows, stride 2, no padding (LeNet's): each input element is in at
// most one window, so dx is written once, Lanes windows (two rows of 2 Lanes
// elements) at a time, the last block of a row overlapping the one before;
// a row or column left over by an odd size is zero. Vectors of the CPU's
// width, as GCC compares wider ones one element at a time.
template <class V, std::size_t... I>
inline void even_odd_lanes(V& even, V& odd, const V& lo, const V& hi, std::index_sequence<I...>) {
  even = __builtin_shufflevector(lo, hi, (2 * I)...);
  odd = __builtin_shufflevector(lo, hi, (2 * I + 1)...);
}
// a[From], b[From], a[From + 1], b[From + 1], ...
template <std::size_t From, class V, std::size_t... I>
inline void interleave(V& out, const V& a, const V& b, std::index_sequence<I...>) {
  out = __builtin_shufflevector(a, b, (From + I / 2 + (I % 2) * sizeof...(I))...);
}

template <class T, bool Max, int Lanes>
inline void pool2x2_block(const T* x0, const T* x1, const T* dyr, T* d0, T* d1, std::int64_t ow) {
  typedef T V __attribute__((vector_size(Lanes * sizeof(T))));
  constexpr auto lanes = std::make_index_sequence<Lanes>{};
  V lo, hi, dv, a, b, c, d;
  std::memcpy(&lo, x0 + 2 * ow, sizeof(V));
  std::memcpy(&hi, x0 + 2 * ow + Lanes, sizeof(V));
  even_odd_lanes(a, b, lo, hi, lanes);
  std::memcpy(&lo, x1 + 2 * ow, sizeof(V));
  std::memcpy(&hi, x1 + 2 * ow + Lanes, sizeof(V));
  even_odd_lanes(c, d, lo, hi, lanes);
  std::memcpy(&dv, dyr + ow, sizeof(V));
  V oa, ob, oc, od;
  if constexpr (Max) {
    // The window's first maximum, or its first NaN.
    const V zero{};
    V best = a;
    const auto take_b = (b > best) | ((b != b) & (best == best));
    best = take_b ? b : best;
    const auto take_c = (c > best) | ((c != c) & (best == best));
    best = take_c ? c : best;
    const auto take_d = (d > best) | ((d != d) & (best == best));
    od = take_d ? dv : zero;
    oc = (take_c & ~take_d) ? dv : zero;
    ob = (take_b & ~take_c & ~take_d) ? dv : zero;
    oa = (take_b | take_c | take_d) ? zero : dv;
  } else {
    oa = ob = oc = od = dv / T(4);
  }
  interleave<0>(lo, oa, ob, lanes);
  interleave<Lanes / 2>(hi, oa, ob, lanes);
  std::memcpy(d0 + 2 * ow, &lo, sizeof(V));
  std::memcpy(d0 + 2 * ow + Lanes, &hi, sizeof(V));
  interleave<0>(lo, oc, od, lanes);
  interleave<Lanes / 2>(hi, oc, od, lanes);
  std::memcpy(d1 + 2 * ow, &lo, sizeof(V));
  std::memcpy(d1 + 2 * ow + Lanes, &hi, sizeof(V));
}

template <class T, bool Max>
inline void pool2x2_window(const T* x0, const T* x1, const T* dyr, T* d0, T* d1, std::int64_t ow) {
  const T v[4] = {x0[2 * ow], x0[2 * ow + 1], x1[2 * ow], x1[2 * ow + 1]};
  T out[4] = {0, 0, 0, 0};
  if constexpr (Max) {
    int at = 0;
    for (int i = 1; i < 4; ++i)
      if (v[i] > v[at] || (v[i] != v[i] && v[at] == v[at])) at = i;
    out[at] = dyr[ow];
  } else {
    out[0] = out[1] = out[2] = out[3] = dyr[ow] / T(4);
  }
  d0[2 * ow] = out[0];
  d0[2 * ow + 1] = out[1];
  d1[2 * ow] = out[2];
  d1[2 * ow + 1] = out[3];
}

// One output row's windows: in blocks of Lanes, or of fewer lanes when the
// row is shorter (LeNet's are 14 and 5 windows long).
template <class T, bool Max, int Lanes>
inline void pool2x2_row(const T* x0, const T* x1, const T* dyr, T* d0, T* d1, std::int64_t OW) {
  if constexpr (Lanes >= 2) {
    if (OW >= Lanes) {
      std::int64_t ow = 0;
      for (; ow + Lanes <= OW; ow += Lanes) pool2x2_block<T, Max, Lanes>(x0, x1, dyr, d0, d1, ow);
      if (ow < OW) pool2x2_block<T, Max, Lanes>(x0, x1, dyr, d0, d1, OW - Lanes);
      return;
    }
    pool2x2_row<T, Max, Lanes / 2>(x0, x1, dyr, d0, d1, OW);
  } else {
    for (std::int64_t ow = 0; ow < OW; ++ow) pool2x2_window<T, Max>(x0, x1, dyr, d0, d1, ow);
  }
}

template <class T, bool Max, int Lanes>
inline void pool2x2_planes(const T* x, const T* dy, T* dx, const Pool2dGeometry& g, std::int64_t first,
                           std::int64_t last) {
  for (std::int64_t plane = first; plane < last; ++plane) {
    const T* xp = x + plane * g.H * g.W;
    const T* dyp = dy + plane * g.OH * g.OW;
    T* dxp = dx + plane * g.H * g.W;
    if (g.H % 2) std::fill_n(dxp + (g.H - 1) * g.W, g.W, T(0));
    for (std::int64_t oh = 0; oh < g.OH; ++oh) {
      T* d0 = dxp + 2 * oh * g.W;
      if (g.W % 2) d0[g.W - 1] = d0[2 * g.W - 1] = T(0);
      pool2x2_row<T, Max, Lanes>(xp + 2 * oh * g.W, xp + (2 * oh + 1) * g.W, dyp + oh * g.OW, d0, d0 + g.W, g.OW);
    }
  }
}

// Any window: dx starts at zero and each window, in order, adds its dy to
// its first maximum. The window at (oh, ow) reads rows [hs, he) (clipped to
// the input) from column ow sw - pw.
template <class T>
inline void max_pool_window(const T* xp, T* dxp, const Pool2dGeometry& g, std::int64_t hs, std::int64_t he,
                            std::int64_t ow, T dy) {
  const std::int64_t w0 = ow * g.sw - g.pw;
  const std::int64_t ws = std::max<std::int64_t>(w0, 0), we = std::min(w0 + g.KW, g.W);
  std::int64_t at = hs * g.W + ws;
  T best = xp[at];
  for (std::int64_t h = hs; h < he; ++h)
    for (std::int64_t w = ws; w < we; ++w) {
      const T v = xp[h * g.W + w];
      if (v > best || (v != v && best == best)) {
        best = v;
        at = h * g.W + w;
      }
    }
  dxp[at] += dy;
}

// Lanes windows from column ow on, each wholly inside the row's columns:
// their maxima found together (a tap at a time, each tap's Lanes elements
// Stride apart: Stride 1 and 2 as vector loads, 0 for any stride, gathered),
// then each adds its dy in order, lanes [from, Lanes) only.
template <class T, int Lanes, int Stride>
inline void max_pool_block(const T* xp, const T* dyr, T* dxp, const Pool2dGeometry& g, std::int64_t hs,
                           std::int64_t he, std::int64_t ow, std::int64_t from) {
  typedef T V __attribute__((vector_size(Lanes * sizeof(T))));
  using Mask = decltype(V{} < V{});
  const std::int64_t left = ow * g.sw - g.pw;
  const T* first = xp + hs * g.W + left;
  // A stride-2 load reads one element past the last it uses: inside the plane, or gathered.
  const bool gather = Stride == 0 || (Stride == 2 && (he - 1) * g.W + left + g.KW - 1 + 2 * Lanes - 1 >= g.H * g.W);
  V best{}, v{};
  Mask at{};
  for (std::int64_t kh = 0; kh < he - hs; ++kh)
    for (std::int64_t kw = 0; kw < g.KW; ++kw) {
      const T* p = first + kh * g.W + kw;
      if (Stride == 1) {
        std::memcpy(&v, p, sizeof(V));
      } else if (!gather) {
        V lo, hi, odd;
        std::memcpy(&lo, p, sizeof(V));
        std::memcpy(&hi, p + Lanes, sizeof(V));
        even_odd_lanes(v, odd, lo, hi, std::make_index_sequence<Lanes>{});
      } else {
#pragma GCC unroll 16
        for (int l = 0; l < Lanes; ++l) v[l] = p[l * g.sw];
      }
      if (kh == 0 && kw == 0) {
        best = v;
        continue;
      }
      const Mask take = (v > best) | ((v != v) & (best == best));
      best = take ? v : best;
      at = take ? Mask{} + static_cast<std::remove_reference_t<decltype(at[0])>>(kh * g.W + kw) : at;
    }
  for (std::int64_t l = from; l < Lanes; ++l) dxp[hs * g.W + left + l * g.sw + at[l]] += dyr[ow + l];
}

// The windows of one output row: those the left and right padding cut
// alone, the others in blocks of Lanes (or of fewer, for short rows), the
// last block overlapping the one before and adding only its new lanes.
template <class T, int Lanes, int Stride>
inline void max_pool_row(const T* xp, const T* dyr, T* dxp, const Pool2dGeometry& g, std::int64_t hs,
                         std::int64_t he, std::int64_t lo, std::int64_t hi) {
  if constexpr (Lanes >= 2) {
    if (hi - lo >= Lanes) {
      std::int64_t ow = lo;
      for (; ow + Lanes <= hi; ow += Lanes) max_pool_block<T, Lanes, Stride>(xp, dyr, dxp, g, hs, he, ow, 0);
      if (ow < hi) max_pool_block<T, Lanes, Stride>(xp, dyr, dxp, g, hs, he, hi - Lanes, ow - (hi - Lanes));
      return;
    }
    max_pool_row<T, Lanes / 2, Stride>(xp, dyr, dxp, g, hs, he, lo, hi);
  } else {
    for (std::int64_t ow = lo; ow < hi; ++ow) max_pool_window(xp, dxp, g, hs, he, ow, dyr[ow]);
  }
}

template <class T, int Lanes>
inline void max_pool_planes(const T* x, const T* dy, T* dx, const Pool2dGeometry& g, std::int64_t first,
                            std::int64_t last) {
  // Windows [lo, hi) of a row lie wholly inside its columns.
  const std::int64_t lo = std::min(g.OW, first_inside(-g.pw, g.sw));
  const std::int64_t hi = std::max(lo, std::min(g.OW, end_inside(g.KW - 1 - g.pw, g.sw, g.W)));
  for (std::int64_t plane = first; plane < last; ++plane) {
    const T* xp = x + plane * g.H * g.W;
    const T* dyp = dy + plane * g.OH * g.OW;
    T* dxp = dx + plane * g.H * g.W;
    std::fill_n(dxp, g.H * g.W, T(0));
    for (std::int64_t oh = 0; oh < g.OH; ++oh) {
      const std::int64_t h0 = oh * g.sh - g.ph;
      const std::int64_t hs = std::max<std::int64_t>(h0, 0), he = std::min(h0 + g.KH, g.H);
      const T* dyr = dyp + oh * g.OW;
      for (std::int64_t ow = 0; ow < lo; ++ow) max_pool_window(xp, dxp, g, hs, he, ow, dyr[ow]);
      if (g.sw == 1) max_pool_row<T, Lanes, 1>(xp, dyr, dxp, g, hs, he, lo, hi);
      else if (g.sw == 2) max_pool_row<T, Lanes, 2>(xp, dyr, dxp, g, hs, he, lo, hi);
      else max_pool_row<T, Lanes, 0>(xp, dyr, dxp, g, hs, he, lo, hi);
      for (std::int64_t ow = hi; ow < g.OW; ++ow) max_pool_window(xp, dxp, g, hs, he, ow, dyr[ow]);
    }
  }
}

// The vectorised pooling gradients, planes [first, last) each: 2x2 max
// (Kind::max2x2), 2x2 average, any max window; compiled per instruction set.
enum class PoolKind { max2x2, avg2x2, max };

template <class T, PoolKind Kind, int Lanes>
inline void pool_planes(const T* x, const T* dy, T* dx, const Pool2dGeometry& g, std::int64_t first,
                        std::int64_t last) {
  if constexpr (Kind == PoolKind::max) max_pool_planes<T, Lanes>(x, dy, dx, g, first, last);
  else pool2x2_planes<T, Kind == PoolKind::max2x2, Lanes>(x, dy, dx, g, first, last);
}

template <class T>
using PoolPlanesFn = void (*)(const T*, const T*, T*, const Pool2dGeometry&, std::int64_t, std::int64_t);

#ifdef HYBRA_ISA_VARIANTS
template <class T, PoolKind Kind>
__attribute__((target("arch=x86-64-v4"), flatten)) void pool_avx512(const T* x, const T* dy, T* dx,
                                                                   const Pool2dGeometry& g, std::int64_t first,
                                                                   std::int64_t last) {
  pool_planes<T, Kind, 64 / sizeof(T)>(x, dy, dx, g, first, last);
}
template <class T, PoolKind Kind>
__attribute__((target("arch=x86-64-v3"), flatten)) void pool_avx2(const T* x, const T* dy, T* dx,
                                                                 const Pool2dGeometry& g, std::int64_t first,
                                                                 std::int64_t last) {
  pool_planes<T, Kind, 32 / sizeof(T)>(x, dy, dx, g, first, last);
}
#endif
template <class T, PoolKind Kind>
__attribute__((flatten)) void pool_generic(const T* x, const T* dy, T* dx, const Pool2dGeometry& g,
                                           std::int64_t first, std::int64_t last) {
  pool_planes<T, Kind, 16 / sizeof(T)>(x, dy, dx, g, first, last);
}

template <class T, PoolKind Kind>
std::vector<PoolPlanesFn<T>> pool_variants() {
#ifdef HYBRA_ISA_VARIANTS
  return backend::cpu::runnable_variants<PoolPlanesFn<T>>(&pool_avx512<T, Kind>, &pool_avx2<T, Kind>,
                                                          &pool_generic<T, Kind>);
#else
  return backend::cpu::runnable_variants<PoolPlanesFn<T>>(nullptr, nullptr, &pool_generic<T, Kind>);
#endif
}

// Any window: per output row, dy / divisor spread along each window's
// columns into `row`, then row added to each of the window's rows.
template <class T>
void avg_pool_backward_plane(const T* dyp, T* dxp, T* row, const Pool2dGeometry& g, bool count_include_pad) {
  std::fill_n(dxp, g.H * g.W, T(0));
  for (std::int64_t oh = 0; oh < g.OH; ++oh) {
    const std::int64_t h0 = oh * g.sh - g.ph;
    const std::int64_t hs = std::max<std::int64_t>(h0, 0), he = std::min(h0 + g.KH, g.H);
    const std::int64_t height = pool_divisor_extent(h0, g.KH, g.H, g.ph, count_include_pad);
    std::fill_n(row, g.W, T(0));
    for (std::int64_t ow = 0; ow < g.OW; ++ow) {
      const std::int64_t w0 = ow * g.sw - g.pw;
      const std::int64_t ws = std::max<std::int64_t>(w0, 0), we = std::min(w0 + g.KW, g.W);
      const std::int64_t divisor = height * pool_divisor_extent(w0, g.KW, g.W, g.pw, count_include_pad);
      const T share = dyp[oh * g.OW + ow] / static_cast<T>(divisor);
      for (std::int64_t w = ws; w < we; ++w) row[w] += share;
    }
    for (std::int64_t h = hs; h < he; ++h) {
      T* d = dxp + h * g.W;
#pragma omp simd
      for (std::int64_t w = 0; w < g.W; ++w) d[w] += row[w];
    }
  }
}

// dx from dy through pooling windows: a max window's gradient goes to its
// first maximum (the element the forward picked), an average window's is
// spread over the elements it divided by. Planes are independent, one
// thread each.
template <class T, bool Max>
void pool2d_backward(const T* dy, const T* x, T* dx, const Pool2dGeometry& g, bool count_include_pad) {
  const std::int64_t planes = g.N * g.C;
  if (planes == 0 || g.H * g.W == 0) return;
  const std::int64_t cost = g.H * g.W + g.OH * g.OW * g.KH * g.KW;
  const bool tiles2x2 = g.KH == 2 && g.KW == 2 && g.sh == 2 && g.sw == 2 && g.ph == 0 && g.pw == 0 &&
                        2 * g.OH <= g.H && 2 * g.OW <= g.W;
  PoolPlanesFn<T> planes_fn = nullptr;
  if (tiles2x2) {
    static const PoolPlanesFn<T> fastest = pool_variants<T, Max ? PoolKind::max2x2 : PoolKind::avg2x2>().front();
    planes_fn = fastest;
  } else if constexpr (Max) {
    static const PoolPlanesFn<T> fastest = pool_variants<T, PoolKind::max>().front();
    planes_fn = fastest;
  }
  if (planes_fn) {
    backend::cpu::parallel_for(planes, cost, [&](std::int64_t first, std::int64_t last) {
      planes_fn(x, dy, dx, g, first, last);
    });
    return;
  }
  std::atomic<bool> failed{false};
  backend::cpu::parallel_for(planes, cost, [&](std::int64_t first, std::int64_t last) {
    ThreadBuffer<T> row(g.W, failed);
    if (!row.get()) return;
    for (std::int64_t plane = first; plane < last; ++plane)
      avg_pool_backward_plane(dy + plane * g.OH * g.OW, dx + plane * g.H * g.W, row.get(), g, count_include_pad);
  });
  check_buffers(failed, "pool2d_backward");
}

// pool2d_backward's operands (dy, x).
inline std::optional<backend::cuda::CudaLaunch> cuda_pool2d_backward_launch(std::span<const Tensor> in, bool max,
                                                                            Size2d kernel, Size2d stride,
                                                                            Size2d padding, bool count_include_pad,
                                                                            PoolingConvention convention,
                                                                            backend::cuda::Gpu& gpu) {
  const auto dtype = launch_dtype(in);
  if (!dtype) return std::nullopt;
  const Pool2dGeometry g = pool2d_geometry("pool2d_backward", in[1].shape(), kernel, stride, padding, convention);
  return hybra::detail::nn::cuda_pool2d_launch(max, true, g, count_include_pad, *dtype, gpu);
}

}  // namespace detail::nn

// The gradient of a pooling with respect to its input x (pool_type "max" or
// "avg"; global pools pass the whole plane as kernel with stride 1, padding 0).
inline Tensor pool2d_backward(const Tensor& dy, const Tensor& x, bool max, Size2d kernel, Size2d stride,
                              Size2d padding, bool count_include_pad,
                              PoolingConvention convention = PoolingConvention::valid) {
  namespace nn = detail::nn;
  constexpr std::string_view op = "pool2d_backward";
  if (auto r = detail::compute_in_float32({dy, x}, [&](std::span<const Tensor> f) { return pool2d_backward(f[0], f[1], max, kernel, stride, padding,
                                                                                count_include_pad, convention); }))
    return *r;
  const nn::Pool2dGeometry g =
      nn::pool2d_geometry(op, x.require(op.data()).shape(), kernel, stride, padding, convention);
  if (dy.require(op.data()).shape() != Shape{g.N, g.C, g.OH, g.OW})
    fail<ShapeError>(op, ": gradient of shape ", to_string(dy.shape()), " does not match the output (", g.N, ", ",
                     g.C, ", ", g.OH, ", ", g.OW, ") of input ", to_string(x.shape()), " and kernel ", kernel);
  const auto operands = nn::float_operands<2>(op, {dy, x});
  const Tensor &d = operands[0], &xc = operands[1];
  Tensor dx(xc.shape(), d.dtype(), d.device());
  if (d.device().kind == DeviceKind::cuda) {
    backend::cuda::push_cuda_launch(op, {d, xc}, dx,
                                    hybra::detail::nn::cuda_pool2d_launch(max, true, g, count_include_pad, d.dtype(),
                                                                          backend::cuda::gpu(d.device().id)));
    return dx;
  }
  push_kernel(op, {d, xc}, {dx}, [d, xc, dx, g, max, count_include_pad] {
    dispatch(dx.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_floating_point_v<T>) {
        auto* out = static_cast<T*>(dx.raw_data());
        const auto* dyp = static_cast<const T*>(d.raw_data());
        const auto* xp = static_cast<const T*>(xc.raw_data());
        if (max) nn::pool2d_backward<T, true>(dyp, xp, out, g, count_include_pad);
        else nn::pool2d_backward<T, false>(dyp, xp, out, g, count_include_pad);
      }
    });
  });
  return dx;
}

namespace op {

// pool2d's gradient: (dy, data), with the forward pool2d's attributes.
struct pool2d_backward {
  static constexpr std::string_view name = "pool2d_backward";
  static constexpr int arity = 2;
  static constexpr bool gradient_only = true;
  // A global pool's window is the input's whole plane.
  static hybra::detail::nn::PoolWindow window(std::span<const Tensor> in, const op::Attrs& a) {
    auto p = hybra::detail::nn::PoolWindow::read(a, name);
    if (p.global) {
      const Shape& s = in[1].shape();
      if (s.size() != 4) fail<ShapeError>(name, ": input of shape ", hybra::to_string(s), " is not 4-d");
      p.kernel = Size2d(s[2], s[3]);
    }
    return p;
  }
  static Tensor eval(std::span<const Tensor> in, const op::Attrs& a) {
    const auto p = window(in, a);
    return hybra::pool2d_backward(in[0], in[1], p.max, p.kernel, p.stride, p.pad, p.count_include_pad, p.convention);
  }
  static std::optional<backend::cuda::CudaLaunch> cuda_launch(std::span<const Tensor> in, const Tensor&,
                                                              const op::Attrs& a, backend::cuda::Gpu& gpu) {
    const auto p = window(in, a);
    return hybra::detail::nn::cuda_pool2d_backward_launch(in, p.max, p.kernel, p.stride, p.pad, p.count_include_pad,
                                                          p.convention, gpu);
  }
};

}  // namespace op

}  // namespace hybra
