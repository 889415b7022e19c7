#pragma once
// conv2d and its gradients on a GPU, around cuBLAS: the kernels that move a
// batch of images between NCHW tensors and the matrices the GEMMs multiply.
// include/hybra/ops/conv_cuda.hpp plans the steps (these kernels and the
// GEMMs) for a chunk of images at a time; include/hybra/ops/conv.hpp and
// conv_backward.hpp say what the ops compute.
//
// For a chunk of `images` images the GEMMs see the pixels of all its images
// side by side: the columns matrix has a row per (channel, kernel row,
// kernel column) tap and a column per (image, output pixel), and the
// filters' results are (F, images x P). That makes one GEMM per group and
// chunk, where a GEMM per image would be too small to fill a GPU.
//
// Every kernel computes each element it writes from what it reads, in one
// thread (a grid-stride loop over the elements): the data gradient gathers
// each input pixel's taps rather than adding columns into it, so there are
// no atomics and the sums do not depend on the launch's shape.
//
// NVRTC compiles this file with the entries ops/conv_cuda.hpp writes; tests
// run it on the CPU (tests/unit/simt.hpp).
#include "grid.cuh"

namespace hybra::kernels {

// A convolution's sizes, as ops/conv.hpp's Conv2dGeometry (the host passes
// that struct as the kernels' parameter, so the two must stay alike): input
// (N, C, H, W), weight (F, C / groups, KH, KW), output (N, F, OH, OW),
// stride, padding and dilation.
struct conv_geometry {
  long long N, C, H, W, F, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, groups;
};

// col (C KH KW, images OH OW) from x (images, C, H, W): the input each tap of
// each output pixel's window reads, zero in the padding.
template <class T>
__device__ void im2col(const T* x, T* col, conv_geometry g, long long images) {
  const long long P = g.OH * g.OW, cols = images * P, total = g.C * g.KH * g.KW * cols;
  for (long long i = first_element(); i < total; i += grid_stride()) {
    const long long row = i / cols, q = i % cols, n = q / P, p = q % P;
    const long long c = row / (g.KH * g.KW), kh = row / g.KW % g.KH, kw = row % g.KW;
    const long long ih = p / g.OW * g.sh - g.ph + kh * g.dh, iw = p % g.OW * g.sw - g.pw + kw * g.dw;
    col[i] = ih >= 0 && ih < g.H && iw >= 0 && iw < g.W ? x[((n * g.C + c) * g.H + ih) * g.W + iw] : T(0);
  }
}

// out (images, F, OH, OW) from the GEMMs' (F, images OH OW), plus bias (F,
// or null). A null y is a product with no terms (a convolution of zero
// channels): the bias alone.
template <class T>
__device__ void conv_output(const T* y, const T* bias, T* out, conv_geometry g, long long images) {
  const long long P = g.OH * g.OW, total = images * g.F * P;
  for (long long i = first_element(); i < total; i += grid_stride()) {
    const long long p = i % P, f = i / P % g.F, n = i / P / g.F;
    const T product = y ? y[(f * images + n) * P + p] : T(0);
    out[i] = bias ? product + bias[f] : product;
  }
}

// dy (images, F, OH, OW) as (F, images OH OW), for the GEMMs of both
// gradients.
template <class T>
__device__ void filters_major(const T* dy, T* out, conv_geometry g, long long images) {
  const long long P = g.OH * g.OW, total = images * g.F * P;
  for (long long i = first_element(); i < total; i += grid_stride()) {
    const long long p = i % P, n = i / P % images, f = i / P / images;
    out[i] = dy[(n * g.F + f) * P + p];
  }
}

// The first and one past the last window index o along an axis whose
// windows start at o stride - pad and read tap k at + k dilation, such that
// tap k reads position `at`: o stride = at + pad - k dilation.
__device__ inline bool window_of_tap(long long at, long long pad, long long k, long long dilation, long long stride,
                                     long long count, long long& o) {
  const long long start = at + pad - k * dilation;
  if (start < 0 || start % stride != 0) return false;
  o = start / stride;
  return o < count;
}

// dx (images, C, H, W) from the columns' gradient dcol (C KH KW, images OH
// OW): each input element sums the taps that read it, in tap order.
template <class T>
__device__ void col2im(const T* dcol, T* dx, conv_geometry g, long long images) {
  const long long P = g.OH * g.OW, cols = images * P, total = images * g.C * g.H * g.W;
  for (long long i = first_element(); i < total; i += grid_stride()) {
    const long long iw = i % g.W, ih = i / g.W % g.H, c = i / (g.H * g.W) % g.C, n = i / (g.H * g.W * g.C);
    T sum = T(0);
    for (long long kh = 0; kh < g.KH; ++kh) {
      long long oh;
      if (!window_of_tap(ih, g.ph, kh, g.dh, g.sh, g.OH, oh)) continue;
      for (long long kw = 0; kw < g.KW; ++kw) {
        long long ow;
        if (!window_of_tap(iw, g.pw, kw, g.dw, g.sw, g.OW, ow)) continue;
        sum += dcol[((c * g.KH + kh) * g.KW + kw) * cols + n * P + oh * g.OW + ow];
      }
    }
    dx[i] = sum;
  }
}

// out[0, count) = 0: a gradient nothing contributes to.
template <class T>
__device__ void fill_zero(T* out, long long count) {
  for (long long i = first_element(); i < count; i += grid_stride()) out[i] = T(0);
}

}  // namespace hybra::kernels
