#pragma once
// Max and average pooling and their gradients on a GPU, as
// include/hybra/ops/conv.hpp and conv_backward.hpp compute them on the CPU
// (either pooling convention: the geometry's output size says which; global
// pools are the window of a whole plane): a thread per element written. The gradient gathers, for each input
// element, what the windows holding it give it, windows in the order the
// CPU visits them, so there are no atomics and the sums are the CPU's.
// include/hybra/ops/conv_cuda.hpp writes the entries and launches them;
// tests run them on the CPU (tests/unit/simt.hpp).
#include "grid.cuh"

namespace hybra::kernels {

// A pooling's sizes, as ops/conv.hpp's Pool2dGeometry (the host passes that
// struct as the kernels' parameter): input (N, C, H, W), window KH x KW,
// output (N, C, OH, OW), stride and padding.
struct pool_geometry {
  long long N, C, H, W, KH, KW, OH, OW, sh, sw, ph, pw;
};

// The input rows (or columns) [first, last) of window o along an axis,
// clipped to the input.
__device__ inline void window_span(long long o, long long stride, long long pad, long long size, long long extent,
                                   long long& first, long long& last) {
  const long long start = o * stride - pad;
  first = start > 0 ? start : 0;
  last = start + size < extent ? start + size : extent;
}

// What an average divides by along an axis, as ops/conv_geometry.hpp's
// pool_divisor_extent: the window up to the end of the padded input
// (count_include_pad), or the input it holds.
__device__ inline long long divisor_extent(long long o, long long stride, long long pad, long long size,
                                          long long extent, bool count_include_pad) {
  const long long start = o * stride - pad, end = start + size;
  if (count_include_pad) return (end < extent + pad ? end : extent + pad) - start;
  return (end < extent ? end : extent) - (start > 0 ? start : 0);
}

// v replaces best when it is larger, or a NaN where best is none: a NaN
// wins, its first one (as hybra's max and the CPU's pooling).
template <class T>
__device__ bool beats(T v, T best) {
  return v > best || (v != v && best == best);
}

// y (N, C, OH, OW) from x (N, C, H, W): each window's maximum (Max), or its
// sum over the input it holds divided by the whole window's area
// (count_include_pad) or by the input elements it holds. Sums run down each
// column of the window, then across the columns, as the CPU's.
template <class T, bool Max>
__device__ void pool2d(const T* x, T* y, pool_geometry g, bool count_include_pad) {
  const long long total = g.N * g.C * g.OH * g.OW;
  for (long long i = first_element(); i < total; i += grid_stride()) {
    const long long ow = i % g.OW, oh = i / g.OW % g.OH, plane = i / (g.OW * g.OH);
    const T* xp = x + plane * g.H * g.W;
    long long hs, he, ws, we;
    window_span(oh, g.sh, g.ph, g.KH, g.H, hs, he);
    window_span(ow, g.sw, g.pw, g.KW, g.W, ws, we);
    T acc = Max ? xp[hs * g.W + ws] : T(0);
    for (long long w = ws; w < we; ++w) {
      T column = xp[hs * g.W + w];
      for (long long h = hs + 1; h < he; ++h) {
        const T v = xp[h * g.W + w];
        if (Max) column = beats(v, column) ? v : column;
        else column += v;
      }
      if (Max) acc = beats(column, acc) ? column : acc;
      else acc += column;
    }
    if (Max) y[i] = acc;
    else
      y[i] = acc / (static_cast<T>(divisor_extent(oh, g.sh, g.ph, g.KH, g.H, count_include_pad)) *
                    static_cast<T>(divisor_extent(ow, g.sw, g.pw, g.KW, g.W, count_include_pad)));
  }
}

// The flat index in its plane of window (oh, ow)'s first maximum, in the
// window's row-major order (its first NaN, if it holds one).
template <class T>
__device__ long long first_maximum(const T* xp, pool_geometry g, long long oh, long long ow) {
  long long hs, he, ws, we;
  window_span(oh, g.sh, g.ph, g.KH, g.H, hs, he);
  window_span(ow, g.sw, g.pw, g.KW, g.W, ws, we);
  long long at = hs * g.W + ws;
  T best = xp[at];
  for (long long h = hs; h < he; ++h)
    for (long long w = ws; w < we; ++w)
      if (beats(xp[h * g.W + w], best)) {
        best = xp[h * g.W + w];
        at = h * g.W + w;
      }
  return at;
}

// The windows o along an axis that hold input position `at`: [first, last).
__device__ inline void windows_holding(long long at, long long stride, long long pad, long long size, long long count,
                                       long long& first, long long& last) {
  // Window o holds `at` when o stride - pad <= at < o stride - pad + size.
  const long long lowest = at + pad - size + 1;
  first = lowest > 0 ? (lowest + stride - 1) / stride : 0;
  const long long highest = (at + pad) / stride + 1;
  last = highest < count ? highest : count;
}

// dx (N, C, H, W) from dy (N, C, OH, OW) through the windows of x: each
// element sums dy over the windows whose first maximum it is (Max), or dy /
// divisor over the windows holding it, in the CPU's order: window by window
// (Max), or each output row's shares first (average).
template <class T, bool Max>
__device__ void pool2d_backward(const T* dy, const T* x, T* dx, pool_geometry g, bool count_include_pad) {
  const long long total = g.N * g.C * g.H * g.W;
  for (long long i = first_element(); i < total; i += grid_stride()) {
    const long long w = i % g.W, h = i / g.W % g.H, plane = i / (g.W * g.H);
    const T* dyp = dy + plane * g.OH * g.OW;
    long long oh0, oh1, ow0, ow1;
    windows_holding(h, g.sh, g.ph, g.KH, g.OH, oh0, oh1);
    windows_holding(w, g.sw, g.pw, g.KW, g.OW, ow0, ow1);
    T sum = T(0);
    for (long long oh = oh0; oh < oh1; ++oh) {
      T row = T(0);
      const long long height = divisor_extent(oh, g.sh, g.ph, g.KH, g.H, count_include_pad);
      for (long long ow = ow0; ow < ow1; ++ow) {
        const T d = dyp[oh * g.OW + ow];
        if (Max) {
          if (first_maximum(x + plane * g.H * g.W, g, oh, ow) == h * g.W + w) sum += d;
        } else {
          row += d / static_cast<T>(height * divisor_extent(ow, g.sw, g.pw, g.KW, g.W, count_include_pad));
        }
      }
      if (!Max) sum += row;
    }
    dx[i] = sum;
  }
}

// The max pool's gradient where windows do not overlap (ops/conv_cuda.hpp's
// disjoint_windows: LeNet's 2x2 windows of stride 2, a global pool): a
// thread per window puts its dy on its first maximum, into a dx the launch
// has zeroed. Each input element is in at most one window, so this writes
// what pool2d_backward gathers, finding a window's maximum once rather than
// once for every element it holds (for a global pool, once per plane rather
// than once per pixel).
template <class T>
__device__ void max_pool2d_backward_disjoint(const T* dy, const T* x, T* dx, pool_geometry g) {
  const long long total = g.N * g.C * g.OH * g.OW;
  for (long long i = first_element(); i < total; i += grid_stride()) {
    const long long ow = i % g.OW, oh = i / g.OW % g.OH, plane = i / (g.OW * g.OH);
    dx[plane * g.H * g.W + first_maximum(x + plane * g.H * g.W, g, oh, ow)] = dy[i];
  }
}

}  // namespace hybra::kernels
