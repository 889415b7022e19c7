// The gradients of conv2d and pooling (ops/conv_backward.hpp) against plain
// reference loops over many geometries, against central differences of the
// forward ops, with NaN and infinity, across thread counts and on two
// devices at once (bit for bit), every kernel variant this CPU runs, and
// their errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <hybra/eager.hpp>
#include <hybra/ops/conv_backward.hpp>
#include <hybra/ops/pool_backward.hpp>
#include <iterator>
#include <limits>
#include <numeric>
#include <thread>
#include <vector>

#include "reference.hpp"

using namespace hybra;

namespace {

struct Geometry {
  std::int64_t N, C, H, W, F, KH, KW;
  Size2d stride = 1, padding = 0, dilation = 1;
  std::int64_t groups = 1;

  Shape x() const { return {N, C, H, W}; }
  Shape w() const { return {F, C / groups, KH, KW}; }
  std::int64_t OH() const { return (H + 2 * padding.h - dilation.h * (KH - 1) - 1) / stride.h + 1; }
  std::int64_t OW() const { return (W + 2 * padding.w - dilation.w * (KW - 1) - 1) / stride.w + 1; }
  Shape y() const { return {N, F, OH(), OW()}; }
};

std::size_t at(std::int64_t i) { return static_cast<std::size_t>(i); }

// A sum in double, with the sum of its terms' magnitudes (the scale its
// rounding errors are measured against).
struct Sums {
  std::vector<double> value, scale;
};

// dx by the definition: every output pixel adds w * dy to the inputs its
// window holds.
Sums data_reference(const Tensor& dy, const Tensor& w, const Geometry& g) {
  const auto d = dy.to_vector<double>(), wv = w.to_vector<double>();
  const std::int64_t Cg = g.C / g.groups, Fg = g.F / g.groups, OH = g.OH(), OW = g.OW();
  Sums s{std::vector<double>(at(g.N * g.C * g.H * g.W)), std::vector<double>(at(g.N * g.C * g.H * g.W))};
  for (std::int64_t n = 0; n < g.N; ++n)
    for (std::int64_t f = 0; f < g.F; ++f)
      for (std::int64_t c = 0; c < Cg; ++c)
        for (std::int64_t kh = 0; kh < g.KH; ++kh)
          for (std::int64_t kw = 0; kw < g.KW; ++kw)
            for (std::int64_t oh = 0; oh < OH; ++oh)
              for (std::int64_t ow = 0; ow < OW; ++ow) {
                const std::int64_t ih = oh * g.stride.h - g.padding.h + kh * g.dilation.h;
                const std::int64_t iw = ow * g.stride.w - g.padding.w + kw * g.dilation.w;
                if (ih < 0 || ih >= g.H || iw < 0 || iw >= g.W) continue;
                const double term = wv[at(((f * Cg + c) * g.KH + kh) * g.KW + kw)] * d[at(((n * g.F + f) * OH + oh) * OW + ow)];
                const std::size_t i = at(((n * g.C + f / Fg * Cg + c) * g.H + ih) * g.W + iw);
                s.value[i] += term;
                s.scale[i] += std::abs(term);
              }
  return s;
}

// dw by the definition, im2col's way: a window's padding is zeros that
// multiply dy (so a NaN or an infinite dy there makes a NaN).
Sums weight_reference(const Tensor& dy, const Tensor& x, const Geometry& g) {
  const auto d = dy.to_vector<double>(), xv = x.to_vector<double>();
  const std::int64_t Cg = g.C / g.groups, Fg = g.F / g.groups, OH = g.OH(), OW = g.OW();
  Sums s{std::vector<double>(at(g.F * Cg * g.KH * g.KW)), std::vector<double>(at(g.F * Cg * g.KH * g.KW))};
  for (std::int64_t f = 0; f < g.F; ++f)
    for (std::int64_t c = 0; c < Cg; ++c)
      for (std::int64_t kh = 0; kh < g.KH; ++kh)
        for (std::int64_t kw = 0; kw < g.KW; ++kw) {
          double sum = 0, scale = 0;
          for (std::int64_t n = 0; n < g.N; ++n)
            for (std::int64_t oh = 0; oh < OH; ++oh)
              for (std::int64_t ow = 0; ow < OW; ++ow) {
                const std::int64_t ih = oh * g.stride.h - g.padding.h + kh * g.dilation.h;
                const std::int64_t iw = ow * g.stride.w - g.padding.w + kw * g.dilation.w;
                const bool inside = ih >= 0 && ih < g.H && iw >= 0 && iw < g.W;
                const double v = inside ? xv[at(((n * g.C + f / Fg * Cg + c) * g.H + ih) * g.W + iw)] : 0.0;
                const double term = d[at(((n * g.F + f) * OH + oh) * OW + ow)] * v;
                sum += term;
                scale += std::abs(term);
              }
          s.value[at(((f * Cg + c) * g.KH + kh) * g.KW + kw)] = sum;
          s.scale[at(((f * Cg + c) * g.KH + kh) * g.KW + kw)] = scale;
        }
  return s;
}

// Largest |got - value| / scale; NaN where one is NaN and the other not.
// Infinities must match exactly.
double scaled_error(const std::vector<double>& got, const Sums& ref) {
  REQUIRE(got.size() == ref.value.size());
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double a = got[i], b = ref.value[i];
    if (std::isnan(a) || std::isnan(b)) {
      if (std::isnan(a) != std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
      continue;
    }
    if (std::isinf(a) || std::isinf(b)) {
      if (a != b) return std::numeric_limits<double>::quiet_NaN();
      continue;
    }
    if (a != b) worst = std::max(worst, std::abs(a - b) / std::max(ref.scale[i], 1e-300));
  }
  return worst;
}

double backward_tolerance(DType dtype) { return dtype == DType::float64 ? 1e-13 : 1e-5; }

void check_conv_gradients(const Geometry& g, DType dtype) {
  CAPTURE(to_string(g.x()));
  CAPTURE(to_string(g.w()));
  CAPTURE(g.stride);
  CAPTURE(g.padding);
  CAPTURE(g.dilation);
  CAPTURE(g.groups);
  CAPTURE(name(dtype));
  Tensor x = random_normal(g.x(), 0, 1, dtype), w = random_normal(g.w(), 0, 1, dtype);
  Tensor dy = random_normal(g.y(), 0, 1, dtype);
  Tensor dx = conv2d_backward_data(dy, w, g.x(), g.stride, g.padding, g.dilation, g.groups);
  Tensor dw = conv2d_backward_weight(dy, x, g.w(), g.stride, g.padding, g.dilation, g.groups);
  CHECK(dx.shape() == g.x());
  CHECK(dw.shape() == g.w());
  CHECK(dx.dtype() == dtype);
  CHECK(dw.dtype() == dtype);
  CHECK(scaled_error(dx.to_vector<double>(), data_reference(dy, w, g)) <= backward_tolerance(dtype));
  CHECK(scaled_error(dw.to_vector<double>(), weight_reference(dy, x, g)) <= backward_tolerance(dtype));
}

// Pooling's gradient by the definition: each window in order adds its dy to
// its first maximum (its first NaN, if any), or dy / divisor to each of its
// input elements.
Sums pool_reference(const Tensor& dy, const Tensor& x, bool is_max, Size2d k, Size2d s, Size2d p,
                    bool count_include_pad) {
  // A window past the padded input (pooling_convention full) divides by its part inside it.
  const auto d = dy.to_vector<double>(), xv = x.to_vector<double>();
  const std::int64_t N = x.shape()[0], C = x.shape()[1], H = x.shape()[2], W = x.shape()[3];
  const std::int64_t OH = dy.shape()[2], OW = dy.shape()[3];
  Sums r{std::vector<double>(xv.size()), std::vector<double>(xv.size())};
  for (std::int64_t plane = 0; plane < N * C; ++plane)
    for (std::int64_t oh = 0; oh < OH; ++oh)
      for (std::int64_t ow = 0; ow < OW; ++ow) {
        std::vector<std::size_t> window;
        std::int64_t padded = 0;
        for (std::int64_t kh = 0; kh < k.h; ++kh)
          for (std::int64_t kw = 0; kw < k.w; ++kw) {
            const std::int64_t ih = oh * s.h - p.h + kh, iw = ow * s.w - p.w + kw;
            padded += ih < H + p.h && iw < W + p.w;
            if (ih >= 0 && ih < H && iw >= 0 && iw < W) window.push_back(at((plane * H + ih) * W + iw));
          }
        const double g = d[at((plane * OH + oh) * OW + ow)];
        if (is_max) {
          std::size_t best = window[0];
          for (std::size_t i : window)
            if (xv[i] > xv[best] || (std::isnan(xv[i]) && !std::isnan(xv[best]))) best = i;
          r.value[best] += g;
          r.scale[best] += std::abs(g);
        } else {
          const double share = g / static_cast<double>(count_include_pad ? padded : std::ssize(window));
          for (std::size_t i : window) {
            r.value[i] += share;
            r.scale[i] += std::abs(share);
          }
        }
      }
  return r;
}

struct PoolCase {
  Shape x;
  Size2d kernel, stride, padding;
  PoolingConvention convention = PoolingConvention::valid;
};

void check_pool_gradients(const PoolCase& c, DType dtype, const Tensor& given_x = {}) {
  CAPTURE(to_string(c.x));
  CAPTURE(c.kernel);
  CAPTURE(c.stride);
  CAPTURE(c.padding);
  CAPTURE(std::string(name(c.convention)));
  CAPTURE(name(dtype));
  Tensor x = given_x.defined() ? given_x : random_normal(c.x, 0, 1, dtype);
  Tensor dy = random_normal(max_pool2d(x, c.kernel, c.stride, c.padding, c.convention).shape(), 0, 1, dtype);
  for (bool is_max : {true, false})
    for (bool include : {true, false}) {
      if (is_max && !include) continue;
      CAPTURE(is_max);
      CAPTURE(include);
      Tensor dx = pool2d_backward(dy, x, is_max, c.kernel, c.stride, c.padding, include, c.convention);
      CHECK(dx.shape() == c.x);
      CHECK(dx.dtype() == dtype);
      CHECK(scaled_error(dx.to_vector<double>(), pool_reference(dy, x, is_max, c.kernel, c.stride, c.padding,
                                                                include)) <= backward_tolerance(dtype));
    }
}

// Restores the thread count a test changes.
struct ThreadCount {
  int saved = num_threads();
  ~ThreadCount() { set_num_threads(saved); }
};

// Distinct values (a permutation of 0.01 steps): no two in a pooling
// window within a finite-difference step of each other.
Tensor distinct(const Shape& shape) {
  const std::int64_t n = checked_numel(shape);
  std::int64_t step = 7919;
  while (std::gcd(step, n) != 1) ++step;
  std::vector<double> v(at(n));
  for (std::int64_t i = 0; i < n; ++i) v[at(i)] = static_cast<double>(i * step % n) * 0.01 - 0.005 * n;
  return array(v, shape);
}

// d sum(f(t) * r) / d t[i] by central differences, for every i.
template <class F>
std::vector<double> numeric_gradient(const Tensor& t, const Tensor& r, F&& f, double h) {
  auto v = t.to_vector<double>();
  const auto rv = r.to_vector<double>();
  auto loss = [&](const std::vector<double>& values) {
    const auto y = f(array(values, t.shape())).template to_vector<double>();
    double sum = 0;
    for (std::size_t i = 0; i < y.size(); ++i) sum += y[i] * rv[i];
    return sum;
  };
  std::vector<double> grad(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const double saved = v[i];
    v[i] = saved + h;
    const double up = loss(v);
    v[i] = saved - h;
    const double down = loss(v);
    v[i] = saved;
    grad[i] = (up - down) / (2 * h);
  }
  return grad;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

}  // namespace

TEST_SUITE_BEGIN("conv_backward");

TEST_CASE("conv2d gradients match the reference loops: stride, padding, dilation, groups, dtypes") {
  int count = 0;
  for (std::int64_t stride : {1, 2, 3})
    for (std::int64_t padding : {0, 1, 2})
      for (std::int64_t dilation : {1, 2})
        for (int grouping : {0, 1, 2}) {
          // One group; two (three filters each); depthwise with two filters a channel.
          const std::int64_t groups = grouping == 0 ? 1 : grouping == 1 ? 2 : 4;
          const std::int64_t C = 4, F = grouping == 0 ? 5 : grouping == 1 ? 6 : 8;
          const std::int64_t N = count % 2 ? 5 : 1;
          const DType dtype = count % 3 == 2 ? DType::float64 : DType::float32;
          ++count;
          check_conv_gradients({N, C, 9 + stride % 2, 8 + padding, F, 3, 2, stride, padding, dilation, groups}, dtype);
        }
}

TEST_CASE("conv2d gradients: LeNet's layers, wide channels, bands of large images, odd windows") {
  const DType f32 = DType::float32, f64 = DType::float64;
  check_conv_gradients({20, 1, 28, 28, 6, 5, 5, 1, 2}, f32);                   // LeNet's first layer, chunks of 2 images
  check_conv_gradients({37, 6, 14, 14, 16, 5, 5}, f32);                        // its second, 16 slots of 3 or 2
  check_conv_gradients({3, 64, 12, 12, 64, 3, 3, 1, 1}, f32);                  // 64 filters in 4 parts
  check_conv_gradients({2, 8, 11, 13, 20, 3, 3, 1, 1}, f64);                   // 20 filters
  check_conv_gradients({1, 16, 120, 120, 16, 3, 3, 1, 1}, f32);                // one image in bands of rows
  check_conv_gradients({1, 16, 121, 119, 16, 3, 3, 2, 1}, f32);                // and of pixels (im2col), stride 2
  check_conv_gradients({2, 3, 45, 37, 5, 7, 5, {2, 3}, {3, 2}, {1, 2}}, f32);  // unequal strides, paddings, dilations
  check_conv_gradients({2, 4, 9, 9, 4, 1, 1, 1, 1}, f32);                      // 1x1 with padding: wider than the kernel
  check_conv_gradients({2, 3, 5, 5, 2, 3, 3, 1, 4}, f64);                      // windows mostly padding
  check_conv_gradients({2, 3, 6, 7, 4, 6, 7}, f32);                            // one window: the whole image
  check_conv_gradients({3, 6, 10, 10, 6, 3, 3, 1, 1, 1, 6}, f32);              // depthwise, stride 1
  check_conv_gradients({2, 2, 7, 30, 3, 2, 2, {1, 3}, {0, 1}, {2, 1}}, f64);
  // ResNet's wider layers, where oneDNN computes float32 when built in (ops/conv_onednn.hpp): the weight
  // gradient cut by filters (4 parts of 32 filters in the first two, of 16 in the third; 2, 1, 1, 1 blocks
  // of 16 in the fourth) and by images (2, 1, 1, 1 in the last), the data gradient over 128 filters.
  check_conv_gradients({5, 64, 15, 15, 128, 3, 3, 2, 1}, f32);
  check_conv_gradients({4, 64, 16, 16, 128, 3, 3, 1, 1}, f32);
  check_conv_gradients({1, 64, 9, 9, 64, 3, 3, 1, 1}, f32);
  check_conv_gradients({2, 64, 8, 8, 80, 3, 3, 1, 1}, f32);
  check_conv_gradients({5, 64, 11, 11, 64, 1, 2}, f32);
}

TEST_CASE("conv2d gradients: empty batches, channels and filters") {
  Tensor w = random_normal({4, 3, 3, 3});
  CHECK(conv2d_backward_data(zeros({0, 4, 4, 4}), w, {0, 3, 6, 6}, 1, 0, 1, 1).shape() == Shape{0, 3, 6, 6});
  Tensor dw = conv2d_backward_weight(zeros({0, 4, 4, 4}), zeros({0, 3, 6, 6}), {4, 3, 3, 3}, 1, 0, 1, 1);
  CHECK(dw.to_vector<float>() == std::vector<float>(4 * 3 * 3 * 3, 0.0f));
  Tensor none = conv2d_backward_data(zeros({2, 0, 4, 4}), zeros({0, 3, 3, 3}), {2, 3, 6, 6}, 1, 0, 1, 1);
  CHECK(none.to_vector<float>() == std::vector<float>(2 * 3 * 6 * 6, 0.0f));
  Tensor strided = conv2d_backward_data(zeros({2, 0, 2, 2}), zeros({0, 3, 3, 3}), {2, 3, 6, 6}, 2, 0, 1, 1);
  CHECK(strided.to_vector<float>() == std::vector<float>(2 * 3 * 6 * 6, 0.0f));
  CHECK(conv2d_backward_weight(zeros({2, 4, 4, 4}), zeros({2, 0, 6, 6}), {4, 0, 3, 3}, 1, 0, 1, 1).size() == 0);
}

TEST_CASE("conv2d gradients are the forward's derivatives (central differences, float64)") {
  const Geometry cases[] = {
      {2, 3, 6, 5, 4, 3, 2, {2, 1}, {1, 0}, {1, 2}},
      {1, 4, 7, 7, 4, 3, 3, 1, 1, 1, 2},
      {2, 2, 8, 6, 2, 2, 3, 3, 2, 1, 2},
  };
  for (const auto& g : cases) {
    CAPTURE(to_string(g.x()));
    CAPTURE(to_string(g.w()));
    const DType f64 = DType::float64;
    Tensor x = random_normal(g.x(), 0, 1, f64), w = random_normal(g.w(), 0, 1, f64), r = random_normal(g.y(), 0, 1, f64);
    auto by_x = numeric_gradient(x, r, [&](const Tensor& t) { return conv2d(t, w, {}, g.stride, g.padding, g.dilation, g.groups); }, 1e-3);
    auto by_w = numeric_gradient(w, r, [&](const Tensor& t) { return conv2d(x, t, {}, g.stride, g.padding, g.dilation, g.groups); }, 1e-3);
    // conv2d is linear in each operand: the differences are exact but for rounding.
    CHECK(max_abs_diff(conv2d_backward_data(r, w, g.x(), g.stride, g.padding, g.dilation, g.groups).to_vector<double>(),
                       by_x) <= 1e-9);
    CHECK(max_abs_diff(conv2d_backward_weight(r, x, g.w(), g.stride, g.padding, g.dilation, g.groups).to_vector<double>(),
                       by_w) <= 1e-9);
  }
}

TEST_CASE("conv2d gradients with NaN and infinity: as im2col, and no wide pixel spreads them") {
  for (DType dtype : {DType::float32, DType::float64}) {
    CAPTURE(name(dtype));
    // Stride 1 (wide pixels) and 2 (im2col); padding 0 and 1; 20 images: chunks of two, so one falls back.
    for (std::int64_t stride : {1, 2})
      for (std::int64_t padding : {0, 1}) {
        const Geometry g{20, 2, 9, 8, 3, 3, 3, stride, padding};
        CAPTURE(stride);
        CAPTURE(padding);
        auto xv = random_normal(g.x(), 0, 1, dtype).to_vector<double>();
        // The last column: wide pixels that are no output read it with taps that do not.
        xv[at(((7 * g.C + 1) * g.H + 4) * g.W + g.W - 1)] = std::numeric_limits<double>::infinity();
        xv[at(((12 * g.C + 0) * g.H + 2) * g.W + g.W - 2)] = std::numeric_limits<double>::quiet_NaN();
        Tensor x = array(xv, g.x()).astype(dtype), w = random_normal(g.w(), 0, 1, dtype);
        auto dv = random_normal(g.y(), 0, 1, dtype).to_vector<double>();
        dv[at(((3 * g.F + 2) * g.OH() + 0) * g.OW() + 1)] = std::numeric_limits<double>::quiet_NaN();
        Tensor dy = array(dv, g.y()).astype(dtype);
        auto dw = conv2d_backward_weight(dy, x, g.w(), g.stride, g.padding, g.dilation, g.groups).to_vector<double>();
        const Sums ref = weight_reference(dy, x, g);
        CHECK(scaled_error(dw, ref) <= backward_tolerance(dtype));
        // Some of the gradient is finite, some not.
        CHECK(std::count_if(dw.begin(), dw.end(), [](double v) { return std::isfinite(v); }) > 0);
        CHECK(std::count_if(dw.begin(), dw.end(), [](double v) { return std::isnan(v); }) > 0);
        auto dx = conv2d_backward_data(dy, w, g.x(), g.stride, g.padding, g.dilation, g.groups).to_vector<double>();
        CHECK(scaled_error(dx, data_reference(dy, w, g)) <= backward_tolerance(dtype));
        CHECK(std::count_if(dx.begin(), dx.end(), [](double v) { return std::isnan(v); }) > 0);
      }
  }
}

TEST_CASE("conv2d, its gradients and pooling gradients do not depend on the thread count, bit for bit") {
  ThreadCount restore;
  // The third and the last six reach oneDNN where it is built in (ops/conv_onednn.hpp): the last its
  // weight gradient cut by images, the others by filters; the sixth its forward pass on the blocked layout.
  const Geometry convs[] = {{37, 6, 14, 14, 16, 5, 5},        {9, 1, 28, 28, 6, 5, 5, 1, 2},
                            {3, 64, 12, 12, 64, 3, 3, 1, 1},  {5, 8, 15, 13, 12, 3, 3, 2, 1, 1, 2},
                            {4, 64, 16, 16, 128, 3, 3, 1, 1}, {3, 512, 4, 4, 512, 3, 3, 1, 1},
                            {5, 64, 15, 15, 128, 3, 3, 2, 1}, {7, 128, 9, 9, 64, 3, 3, 1, 1},
                            {2, 64, 8, 8, 80, 3, 3, 1, 1},    {5, 64, 11, 11, 64, 1, 2}};
  for (const auto& g : convs) {
    CAPTURE(to_string(g.x()));
    CAPTURE(to_string(g.w()));
    Tensor x = random_normal(g.x()), w = random_normal(g.w()), dy = random_normal(g.y());
    std::vector<float> y1, dx1, dw1;
    for (int threads : {1, 2, 3}) {
      set_num_threads(threads);
      auto y = conv2d(x, w, Tensor{}, g.stride, g.padding, g.dilation, g.groups).to_vector<float>();
      auto dx = conv2d_backward_data(dy, w, g.x(), g.stride, g.padding, g.dilation, g.groups).to_vector<float>();
      auto dw = conv2d_backward_weight(dy, x, g.w(), g.stride, g.padding, g.dilation, g.groups).to_vector<float>();
      if (threads == 1) {
        y1 = y;
        dx1 = dx;
        dw1 = dw;
      }
      CHECK(y == y1);
      CHECK(dx == dx1);
      CHECK(dw == dw1);
    }
  }
  Tensor x = random_normal({9, 5, 13, 12}), dy = random_normal({9, 5, 6, 6}), dy3 = random_normal({9, 5, 7, 6});
  std::vector<float> ref[3];
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    std::vector<float> got[3] = {pool2d_backward(dy, x, true, 2, 2, 0, true).to_vector<float>(),
                                 pool2d_backward(dy3, x, true, 3, 2, 1, true).to_vector<float>(),
                                 pool2d_backward(dy3, x, false, 3, 2, 1, false).to_vector<float>()};
    for (int k = 0; k < 3; ++k) {
      if (threads == 1) ref[k] = got[k];
      CHECK(got[k] == ref[k]);
    }
  }
}

// The same convolutions on two devices at once share the cached kernels
// (oneDNN's primitives among them) and each thread's buffers.
TEST_CASE("conv2d and its gradients on two devices at once give what each gives alone, bit for bit") {
  // The first two reach oneDNN where it is built in (ops/conv_onednn.hpp).
  const Geometry convs[] = {{8, 64, 4, 4, 64, 3, 3, 1, 1}, {8, 32, 7, 7, 64, 3, 3, 2, 1}, {6, 8, 9, 9, 16, 3, 3, 1, 1}};
  struct Result {
    std::vector<float> y, dx, dw;
    bool operator==(const Result&) const = default;
  };
  auto run = [](const Geometry& g, const Tensor& x, const Tensor& w, const Tensor& dy) {
    return Result{conv2d(x, w, Tensor{}, g.stride, g.padding, g.dilation, g.groups).to_vector<float>(),
                  conv2d_backward_data(dy, w, g.x(), g.stride, g.padding, g.dilation, g.groups).to_vector<float>(),
                  conv2d_backward_weight(dy, x, g.w(), g.stride, g.padding, g.dilation, g.groups).to_vector<float>()};
  };
  struct Operands {
    Tensor x, w, dy;
  };
  std::vector<Operands> operands[2];
  std::vector<Result> alone[2];
  for (int d = 0; d < 2; ++d)
    for (const auto& g : convs) {
      operands[d].push_back({random_normal(g.x()).to(cpu(d)), random_normal(g.w()).to(cpu(d)),
                             random_normal(g.y()).to(cpu(d))});
      alone[d].push_back(run(g, operands[d].back().x, operands[d].back().w, operands[d].back().dy));
    }
  int differing[2] = {0, 0};
  auto device = [&](int d) {
    for (int round = 0; round < 30; ++round)
      for (std::size_t i = 0; i < std::size(convs); ++i)
        if (!(run(convs[i], operands[d][i].x, operands[d][i].w, operands[d][i].dy) == alone[d][i])) ++differing[d];
  };
  std::thread other(device, 1);
  device(0);
  other.join();
  CHECK(differing[0] == 0);
  CHECK(differing[1] == 0);
}

TEST_CASE("the pixel-sum product: every variant this CPU runs on every tile shape") {
  auto check = [](auto tag) {
    using T = typename decltype(tag)::type;
    const std::int64_t len = 48, segments = 3, ldc = 40;
    for (std::int64_t M : {1, 3, 4, 5, 6, 7, 13, 16})
      for (std::int64_t N : {1, 2, 4, 5, 6, 7, 25}) {
        const std::int64_t a_seg = M * len + 16, b_seg = (N + 2) * len;
        auto a = random_normal({segments * a_seg}, 0, 1, dtype_of_v<T>).template to_vector<T>();
        auto b = random_normal({segments * b_seg}, 0, 1, dtype_of_v<T>).template to_vector<T>();
        std::vector<std::int64_t> rows;
        for (std::int64_t j = 0; j < N; ++j) rows.push_back((N - 1 - j) * len + j % 3);  // any offsets
        std::vector<double> ref;
        for (std::int64_t i = 0; i < M; ++i)
          for (std::int64_t j = 0; j < N; ++j) {
            double sum = 1;  // C's value before
            for (std::int64_t s = 0; s < segments; ++s)
              for (std::int64_t q = 0; q < len; ++q)
                sum += double(a[at(s * a_seg + i * len + q)]) * b[at(s * b_seg + rows[at(j)] + q)];
            ref.push_back(sum);
          }
        for (auto variant : hybra::backend::cpu::dot_variants<T>()) {
          CAPTURE(M);
          CAPTURE(N);
          std::vector<T> c(at(M * ldc), T(1));
          variant(hybra::backend::cpu::DotProduct<T>{a.data(), len, b.data(), rows.data(), c.data(), ldc, M, N, len,
                                                     segments, a_seg, b_seg});
          double worst = 0;
          for (std::int64_t i = 0; i < M; ++i) {
            for (std::int64_t j = 0; j < N; ++j)
              worst = std::max(worst, std::abs(c[at(i * ldc + j)] - ref[at(i * N + j)]) / (1 + std::abs(ref[at(i * N + j)])));
            for (std::int64_t j = N; j < ldc; ++j) CHECK(c[at(i * ldc + j)] == T(1));
          }
          CHECK(worst <= (sizeof(T) == 8 ? 1e-13 : 1e-5));
        }
      }
  };
  check(type_tag<float>{});
  check(type_tag<double>{});
}

TEST_CASE("pooling gradients match the reference loop: max, average, overlapping, padded, global") {
  const PoolCase cases[] = {
      {{2, 3, 8, 8}, 2, 2, 0},     {{3, 4, 28, 28}, 2, 2, 0},  {{2, 5, 10, 10}, 2, 2, 0},  // LeNet's 2x2
      {{2, 3, 7, 9}, 2, 2, 0},     {{1, 2, 3, 3}, 2, 2, 0},    {{1, 2, 40, 67}, 2, 2, 0},  // odd sizes, long rows
      {{2, 3, 7, 9}, 3, 2, 1},     {{1, 2, 11, 6}, {3, 2}, {1, 2}, {1, 0}},
      {{2, 1, 5, 5}, 5, 1, 2},     {{1, 2, 9, 7}, {2, 4}, 3, {1, 2}},
      {{1, 1, 4, 4}, 4, 4, 0},     {{2, 3, 6, 5}, {6, 5}, 1, 0},  // global
      {{2, 2, 9, 9}, 3, 1, 1},
      // pooling_convention full: odd sizes give 2x2 windows past the input, 3x3 ones past the padding
      {{2, 3, 7, 9}, 2, 2, 0, PoolingConvention::full}, {{1, 2, 40, 67}, 2, 2, 0, PoolingConvention::full},
      {{2, 3, 10, 9}, 3, 2, 1, PoolingConvention::full}, {{1, 2, 8, 7}, {2, 3}, {1, 2}, {1, 1}, PoolingConvention::full},
  };
  for (const auto& c : cases)
    for (DType dtype : {DType::float32, DType::float64}) check_pool_gradients(c, dtype);
}

TEST_CASE("max pooling's gradient goes to the first maximum, or the first NaN, as the forward picks") {
  for (DType dtype : {DType::float32, DType::float64}) {
    CAPTURE(name(dtype));
    const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
    // One window each: ties, NaN first and later, two NaNs, every element -inf.
    const std::vector<std::vector<double>> windows = {{1, 3, 3, 2}, {nan, 5, 6, 7}, {1, 2, nan, 9}, {1, nan, 2, nan},
                                                      {-inf, -inf, -inf, -inf}, {4, 4, 4, 4}, {-1, -2, -3, -4}};
    const std::vector<std::int64_t> expected = {1, 0, 2, 1, 0, 0, 0};
    for (std::size_t k = 0; k < windows.size(); ++k) {
      CAPTURE(k);
      const auto& v = windows[k];
      Tensor x = array(std::vector<double>{v[0], v[1], v[2], v[3]}, {1, 1, 2, 2}).astype(dtype);
      auto dx = pool2d_backward(full({1, 1, 1, 1}, 5.0, dtype), x, true, 2, 2, 0, true).to_vector<double>();
      for (std::int64_t i = 0; i < 4; ++i) CHECK(dx[at(i)] == (i == expected[k] ? 5 : 0));
    }
    // The same in long rows (the vector blocks) and through the general path (3x3 windows, stride 2).
    const PoolCase cases[] = {{{2, 3, 12, 40}, 2, 2, 0}, {{2, 3, 12, 41}, 3, 2, 1}, {{1, 2, 6, 12}, 2, 2, 0}};
    for (const auto& c : cases) {
      auto xv = random_normal(c.x, 0, 1, DType::float64).to_vector<double>();
      for (std::size_t i = 0; i < xv.size(); i += 7) xv[i] = nan;
      for (std::size_t i = 3; i < xv.size(); i += 11) xv[i] = -inf;
      check_pool_gradients(c, dtype, array(xv, c.x).astype(dtype));
    }
  }
}

TEST_CASE("pooling gradients are the forward's derivatives (central differences, float64)") {
  const PoolCase cases[] = {{{2, 2, 6, 6}, 2, 2, 0},
                            {{1, 3, 7, 6}, 3, 2, 1},
                            {{2, 1, 5, 7}, {2, 3}, 1, {1, 1}},
                            {{1, 2, 8, 7}, 3, 2, 1, PoolingConvention::full}};
  for (const auto& c : cases) {
    CAPTURE(to_string(c.x));
    Tensor x = distinct(c.x);
    const auto cv = c.convention;
    Tensor r = random_normal(max_pool2d(x, c.kernel, c.stride, c.padding, cv).shape(), 0, 1, DType::float64);
    auto by_max = numeric_gradient(
        x, r, [&](const Tensor& t) { return max_pool2d(t, c.kernel, c.stride, c.padding, cv); }, 1e-4);
    CHECK(max_abs_diff(pool2d_backward(r, x, true, c.kernel, c.stride, c.padding, true, cv).to_vector<double>(),
                       by_max) <= 1e-9);
    for (bool include : {true, false}) {
      auto by_avg = numeric_gradient(
          x, r, [&](const Tensor& t) { return avg_pool2d(t, c.kernel, c.stride, c.padding, include, cv); }, 1e-3);
      CHECK(max_abs_diff(pool2d_backward(r, x, false, c.kernel, c.stride, c.padding, include, cv).to_vector<double>(),
                         by_avg) <= 1e-9);
    }
  }
}

TEST_CASE("the vectorised pooling gradients: every variant this CPU runs, every row length") {
  namespace nn = hybra::detail::nn;
  auto check = [](auto tag) {
    using T = typename decltype(tag)::type;
    const PoolCase cases[] = {{{2, 3, 7, 2}, 2, 2, 0},  {{2, 3, 7, 3}, 2, 2, 0},  {{2, 3, 7, 9}, 2, 2, 0},
                              {{2, 3, 7, 14}, 2, 2, 0}, {{2, 3, 7, 17}, 2, 2, 0}, {{2, 3, 7, 33}, 2, 2, 0},
                              {{2, 3, 7, 65}, 2, 2, 0}, {{2, 3, 8, 5}, 3, 1, 1},  {{2, 3, 8, 40}, 3, 1, 1},
                              {{2, 3, 9, 35}, 3, 2, 1}, {{2, 3, 9, 36}, 3, 2, 0}, {{2, 3, 9, 70}, {2, 3}, 3, {1, 2}},
                              {{2, 3, 5, 48}, {5, 4}, 2, 2}, {{2, 3, 6, 33}, 2, 1, 0}};
    for (const auto& c : cases) {
      CAPTURE(to_string(c.x));
      CAPTURE(c.kernel);
      CAPTURE(c.stride);
      CAPTURE(c.padding);
      const auto g = nn::pool2d_geometry("test", c.x, c.kernel, c.stride, c.padding);
      auto xv = random_normal(c.x, 0, 1, DType::float64).to_vector<double>();
      for (std::size_t i = 5; i < xv.size(); i += 13) xv[i] = std::numeric_limits<double>::quiet_NaN();
      Tensor x = array(xv, c.x).astype(dtype_of_v<T>), dy = random_normal({2, 3, g.OH, g.OW}, 0, 1, dtype_of_v<T>);
      const auto xs = x.template to_vector<T>(), dys = dy.template to_vector<T>();
      const bool tiles = c.kernel == Size2d(2) && c.stride == Size2d(2) && c.padding == Size2d(0);
      for (int kind = 0; kind < (tiles ? 3 : 1); ++kind) {
        CAPTURE(kind);
        const auto variants = kind == 0   ? nn::pool_variants<T, nn::PoolKind::max>()
                              : kind == 1 ? nn::pool_variants<T, nn::PoolKind::max2x2>()
                                          : nn::pool_variants<T, nn::PoolKind::avg2x2>();
        const Sums ref = pool_reference(dy, x, kind != 2, c.kernel, c.stride, c.padding, true);
        for (auto variant : variants) {
          std::vector<T> dx(xs.size(), T(-7));
          variant(xs.data(), dys.data(), dx.data(), g, 0, 6);
          CHECK(scaled_error(std::vector<double>(dx.begin(), dx.end()), ref) <= backward_tolerance(dtype_of_v<T>));
        }
      }
    }
  };
  check(type_tag<float>{});
  check(type_tag<double>{});
}

TEST_CASE("gradient errors name the op and the shapes") {
  Tensor w = zeros({4, 3, 3, 3}), x = zeros({2, 3, 8, 8}), dy = zeros({2, 4, 6, 6});
  CHECK_THROWS_WITH_AS(conv2d_backward_data(zeros({2, 4, 5, 5}), w, {2, 3, 8, 8}, 1, 0, 1, 1),
                       "conv2d_backward_data: gradient of shape (2, 4, 5, 5) does not match the output (2, 4, 6, 6) of "
                       "input (2, 3, 8, 8) and weight (4, 3, 3, 3)",
                       ShapeError);
  CHECK_THROWS_WITH_AS(conv2d_backward_weight(dy, x, {4, 3, 3, 3}, 2, 0, 1, 1),
                       "conv2d_backward_weight: gradient of shape (2, 4, 6, 6) does not match the output (2, 4, 3, 3) "
                       "of input (2, 3, 8, 8) and weight (4, 3, 3, 3)",
                       ShapeError);
  CHECK_THROWS_WITH_AS(conv2d_backward_data(dy, w, {2, 2, 8, 8}, 1, 0, 1, 1),
                       "conv2d_backward_data: conv2d: input of shape (2, 2, 8, 8) (2 channels in 1 group) does not "
                       "match weight of shape (4, 3, 3, 3) (expected (4, 2, 3, 3))",
                       ShapeError);
  CHECK_THROWS_WITH_AS(conv2d_backward_weight(dy, x, {4, 3, 9, 3}, 1, 0, 1, 1),
                       doctest::Contains("conv2d_backward_weight: conv2d: kernel (9, 3) with dilation (1, 1) spans"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(conv2d_backward_weight(dy, x, {4, 3, 3, 3}, 0, 0, 1, 1),
                       "conv2d_backward_weight: conv2d: stride (0, 0) must be positive", ValueError);
  CHECK_THROWS_WITH_AS(conv2d_backward_data(dy, w, {2, 3, 8}, 1, 0, 1, 1),
                       "conv2d_backward_data: conv2d: input of shape (2, 3, 8) is not 4-d (batch, channels, height, "
                       "width)",
                       ShapeError);
  CHECK_THROWS_WITH_AS(conv2d_backward_data(zeros({2, 4, 6, 6}, DType::int32), zeros({4, 3, 3, 3}, DType::int32),
                                            {2, 3, 8, 8}, 1, 0, 1, 1),
                       "conv2d_backward_data: dtype int32 is not supported (float32 or float64)", DTypeError);
  CHECK_THROWS_WITH_AS(pool2d_backward(zeros({2, 3, 3, 3}), x, true, 2, 2, 0, true),
                       "pool2d_backward: gradient of shape (2, 3, 3, 3) does not match the output (2, 3, 4, 4) of "
                       "input (2, 3, 8, 8) and kernel (2, 2)",
                       ShapeError);
  CHECK_THROWS_WITH_AS(pool2d_backward(zeros({2, 3, 4, 4}), x, false, 2, 2, 2, true),
                       "pool2d_backward: padding (2, 2) must be smaller than the kernel (2, 2)", ValueError);
  CHECK_THROWS_WITH_AS(pool2d_backward(zeros({2, 3, 4, 4}), zeros({3, 8, 8}), true, 2, 2, 0, true),
                       "pool2d_backward: input of shape (3, 8, 8) is not 4-d (batch, channels, height, width)",
                       ShapeError);
  CHECK_THROWS_AS(conv2d_backward_data(Tensor{}, w, {2, 3, 8, 8}, 1, 0, 1, 1), Error);
  // Mixed dtypes promote, as the forward's operands do.
  Tensor dx = conv2d_backward_data(random_normal({2, 4, 6, 6}), random_normal({4, 3, 3, 3}, 0, 1, DType::float64),
                                   {2, 3, 8, 8}, 1, 0, 1, 1);
  CHECK(dx.dtype() == DType::float64);
}

TEST_SUITE_END();
