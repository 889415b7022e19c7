// The convolution-network ops (conv2d, pooling, batch_norm) against plain
// reference loops, their errors, their graph nodes and fused epilogues, and
// the layers (Conv2D, the pooling layers, BatchNorm, LeNet-5) eager and
// hybridized.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <hybra/hybra.hpp>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "reference.hpp"

using namespace hybra;
namespace nn = hybra::nn;

namespace {

using test::max_rel_diff;

// Largest |a - b| / (1 + |b|): sums of products of normal values, so an
// absolute error on values near 0 and a relative one on large values.
double max_error(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / (1 + std::abs(b[i])));
  return worst;
}

double tolerance(DType dtype) { return dtype == DType::float64 ? 1e-12 : 2e-5; }

std::int64_t out_extent(std::int64_t in, std::int64_t pad, std::int64_t span, std::int64_t stride) {
  return (in + 2 * pad - span) / stride + 1;
}

// conv2d by its definition, in double.
std::vector<double> conv2d_reference(const Tensor& x, const Tensor& w, const Tensor& b, Size2d s, Size2d p, Size2d d,
                                     std::int64_t groups) {
  const auto xv = x.to_vector<double>(), wv = w.to_vector<double>();
  const auto bv = b.defined() ? b.to_vector<double>() : std::vector<double>(static_cast<std::size_t>(w.shape()[0]), 0);
  const std::int64_t N = x.shape()[0], C = x.shape()[1], H = x.shape()[2], W = x.shape()[3];
  const std::int64_t F = w.shape()[0], KH = w.shape()[2], KW = w.shape()[3], Cg = C / groups, Fg = F / groups;
  const std::int64_t OH = out_extent(H, p.h, d.h * (KH - 1) + 1, s.h), OW = out_extent(W, p.w, d.w * (KW - 1) + 1, s.w);
  std::vector<double> out;
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t f = 0; f < F; ++f)
      for (std::int64_t oh = 0; oh < OH; ++oh)
        for (std::int64_t ow = 0; ow < OW; ++ow) {
          double sum = bv[static_cast<std::size_t>(f)];
          const std::int64_t g = f / Fg;
          for (std::int64_t c = 0; c < Cg; ++c)
            for (std::int64_t kh = 0; kh < KH; ++kh)
              for (std::int64_t kw = 0; kw < KW; ++kw) {
                const std::int64_t ih = oh * s.h - p.h + kh * d.h, iw = ow * s.w - p.w + kw * d.w;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                sum += xv[static_cast<std::size_t>(((n * C + g * Cg + c) * H + ih) * W + iw)] *
                       wv[static_cast<std::size_t>(((f * Cg + c) * KH + kh) * KW + kw)];
              }
          out.push_back(sum);
        }
  return out;
}

// Pooling by its definition: max ignores the padding (NaN wins), avg
// divides by the window or by the input elements in it.
// Windows past the padded input (PoolingConvention::full) count only their
// taps inside it, as MXNet's.
std::vector<double> pool2d_reference(const Tensor& x, bool is_max, Size2d k, Size2d s, Size2d p,
                                     bool count_include_pad, bool full = false) {
  const auto xv = x.to_vector<double>();
  const std::int64_t N = x.shape()[0], C = x.shape()[1], H = x.shape()[2], W = x.shape()[3];
  auto extent = [&](std::int64_t in, std::int64_t pad, std::int64_t size, std::int64_t stride) {
    return full ? (in + 2 * pad - size + stride - 1) / stride + 1 : out_extent(in, pad, size, stride);
  };
  const std::int64_t OH = extent(H, p.h, k.h, s.h), OW = extent(W, p.w, k.w, s.w);
  std::vector<double> out;
  for (std::int64_t plane = 0; plane < N * C; ++plane)
    for (std::int64_t oh = 0; oh < OH; ++oh)
      for (std::int64_t ow = 0; ow < OW; ++ow) {
        double acc = is_max ? -std::numeric_limits<double>::infinity() : 0;
        std::int64_t count = 0, padded = 0;
        for (std::int64_t kh = 0; kh < k.h; ++kh)
          for (std::int64_t kw = 0; kw < k.w; ++kw) {
            const std::int64_t ih = oh * s.h - p.h + kh, iw = ow * s.w - p.w + kw;
            padded += ih < H + p.h && iw < W + p.w;
            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
            const double v = xv[static_cast<std::size_t>((plane * H + ih) * W + iw)];
            if (!is_max) acc += v;
            else if (!std::isnan(acc) && (v > acc || std::isnan(v))) acc = v;
            ++count;
          }
        out.push_back(is_max ? acc : acc / static_cast<double>(count_include_pad ? padded : count));
      }
  return out;
}

struct ConvCase {
  Shape x, w;
  Size2d stride = 1, padding = 0, dilation = 1;
  std::int64_t groups = 1;
  bool bias = true;
  DType dtype = DType::float32;
};

void check_conv(const ConvCase& c) {
  CAPTURE(to_string(c.x));
  CAPTURE(to_string(c.w));
  CAPTURE(c.groups);
  CAPTURE(name(c.dtype));
  Tensor x = random_normal(c.x, 0, 1, c.dtype), w = random_normal(c.w, 0, 1, c.dtype);
  Tensor b = c.bias ? random_normal({c.w[0]}, 0, 1, c.dtype) : Tensor{};
  Tensor y = conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups);
  const auto ref = conv2d_reference(x, w, b, c.stride, c.padding, c.dilation, c.groups);
  CHECK(y.dtype() == c.dtype);
  CHECK(y.shape()[0] == c.x[0]);
  CHECK(y.shape()[1] == c.w[0]);
  // A sum's rounding error grows with its terms (576 in ResNet's 3x3 layers of 64 channels).
  const double terms = static_cast<double>(c.w[1] * c.w[2] * c.w[3]);
  CHECK(max_error(y.to_vector<double>(), ref) <= tolerance(c.dtype) * std::max(1.0, terms / 64));
}

}  // namespace

TEST_SUITE_BEGIN("conv");

TEST_CASE("conv2d matches the reference loop: stride, padding, dilation, groups, bias, dtypes") {
  const ConvCase cases[] = {
      {{2, 3, 7, 9}, {4, 3, 3, 3}},
      {{2, 3, 9, 8}, {4, 3, 3, 2}, {2, 1}, {1, 0}, {1, 2}},
      {{3, 5, 11, 13}, {7, 5, 4, 2}, 3, 2},
      {{2, 4, 6, 6}, {6, 2, 3, 3}, 1, 1, 1, 2},          // two groups
      {{2, 3, 8, 8}, {3, 1, 3, 3}, 1, 1, 1, 3},          // depthwise
      {{2, 6, 9, 9}, {12, 1, 3, 3}, 2, 1, 1, 6, false},  // depthwise, two filters a channel, no bias
      {{2, 8, 5, 7}, {20, 8, 1, 1}},                     // 1x1; 20 filters: three row blocks
      {{1, 1, 5, 5}, {1, 1, 5, 5}},                      // the whole image
      {{1, 2, 3, 3}, {3, 2, 3, 3}, 1, 2, 2},             // windows mostly padding
      {{5, 1, 28, 28}, {6, 1, 5, 5}, 1, 2},              // LeNet's first layer
      {{3, 6, 14, 14}, {16, 6, 5, 5}},                   // and its second
      {{1, 8, 64, 64}, {16, 8, 3, 3}, 1, 1},             // one image in several bands
      {{1, 3, 45, 37}, {5, 3, 7, 5}, {2, 3}, {3, 2}, {1, 2}},
      {{2, 3, 7, 9}, {4, 3, 3, 3}, 1, 1, 1, 1, true, DType::float64},
      {{2, 4, 10, 6}, {4, 1, 3, 3}, 2, 1, 2, 4, false, DType::float64},
      // ResNet's wider layers, where oneDNN computes float32 when built in (ops/conv_onednn.hpp).
      {{4, 64, 16, 16}, {128, 64, 3, 3}, 1, 1},
      {{1, 64, 40, 36}, {64, 64, 3, 3}, 1, 1, 1, 1, false},
      {{2, 64, 47, 45}, {64, 64, 3, 3}, 2, 1},   // stride 2, the last window reaching into the padding
      {{2, 64, 48, 48}, {64, 64, 3, 3}, 2, 0},   // stride 2, the last input row unread
      {{2, 256, 8, 6}, {64, 256, 1, 1}, 2, 0},   // ResNet-50 v1's strided 1x1: the last row and column unread
      {{2, 64, 7, 8}, {64, 64, 1, 1}, 2, 0, 1, 1, false},  // ResNet-18's, no bias: the last column unread
      {{2, 128, 9, 9}, {32, 128, 3, 3}, 1, 1},  // DenseNet's 3x3 layer: 32 filters over 128 channels
      {{2, 512, 4, 3}, {512, 512, 3, 3}, 1, 1},  // a wide layer on few pixels: oneDNN's blocked layout
      {{2, 64, 16, 16}, {96, 64, 1, 1}},           // a 1x1 layer over 64 channels
      {{4, 64, 16, 16}, {128, 64, 3, 3}, 1, 1, 1, 1, true, DType::float64},
  };
  for (const auto& c : cases) check_conv(c);
#ifdef HYBRA_ONEDNN_CALLS
  // unit_onednn_avx2 (tests/CMakeLists.txt) runs these as a CPU without AVX-512 runs them.
  const char* isa = std::getenv("DNNL_MAX_CPU_ISA");
  if (isa && std::string_view(isa) == "AVX2") CHECK_FALSE(backend::cpu::onednn::avx512());
#endif
}

TEST_CASE("conv2d's product: every variant this CPU runs (AVX-512, AVX2, generic) on every tile shape") {
  auto check = [](auto tag, std::int64_t K) {
    using T = typename decltype(tag)::type;
    const std::int64_t ld = 80;
    for (std::int64_t M : {1, 5, 6, 7, 13, 16}) {
      for (std::int64_t n : {1, 7, 16, 33, 64, 70}) {
        auto a = random_normal({M, K}, 0, 1, dtype_of_v<T>).template to_vector<T>();
        auto b = random_normal({K, ld}, 0, 1, dtype_of_v<T>).template to_vector<T>();
        auto bias = random_normal({M}, 0, 1, dtype_of_v<T>).template to_vector<T>();
        std::vector<std::int64_t> rows;
        for (std::int64_t k = 0; k < K; ++k) rows.push_back((K - 1 - k) * ld);  // any order of B's rows
        std::vector<double> ref;
        for (std::int64_t i = 0; i < M; ++i)
          for (std::int64_t j = 0; j < n; ++j) {
            double sum = bias[static_cast<std::size_t>(i)];
            for (std::int64_t k = 0; k < K; ++k)
              sum += double(a[static_cast<std::size_t>(i * K + k)]) * b[static_cast<std::size_t>(rows[k] + j)];
            ref.push_back(sum);
          }
        // Summed in k order (backend/cpu/product.hpp): a plain loop's bits, each multiply-add fused (the AVX2
        // and AVX-512 variants) or not (the generic one).
        auto in_k_order = [&](bool fused) {
          std::vector<T> r;
          for (std::int64_t i = 0; i < M; ++i)
            for (std::int64_t j = 0; j < n; ++j) {
              T sum = bias[static_cast<std::size_t>(i)];
              for (std::int64_t k = 0; k < K; ++k) {
                const T x = a[static_cast<std::size_t>(i * K + k)], y = b[static_cast<std::size_t>(rows[k] + j)];
                sum = fused ? std::fma(x, y, sum) : static_cast<T>(sum + x * y);
              }
              r.push_back(sum);
            }
          return r;
        };
        const auto fused = in_k_order(true), unfused = in_k_order(false);
        for (auto variant : hybra::backend::cpu::product_variants<T>()) {
          CAPTURE(M);
          CAPTURE(n);
          CAPTURE(K);
          std::vector<T> c(static_cast<std::size_t>(M * (n + 3)), T(-7));
          variant(hybra::backend::cpu::Product<T>{a.data(), K, b.data(), rows.data(), bias.data(), c.data(), n + 3, M,
                                                  K, n});
          std::vector<double> got;
          std::vector<T> bits;
          for (std::int64_t i = 0; i < M; ++i) {
            for (std::int64_t j = 0; j < n; ++j) got.push_back(c[static_cast<std::size_t>(i * (n + 3) + j)]);
            for (std::int64_t j = 0; j < n; ++j) bits.push_back(c[static_cast<std::size_t>(i * (n + 3) + j)]);
            for (std::int64_t j = n; j < n + 3; ++j) CHECK(c[static_cast<std::size_t>(i * (n + 3) + j)] == T(-7));
          }
          CHECK(max_error(got, ref) <= tolerance(dtype_of_v<T>) * static_cast<double>(K) / 9);
          CHECK((bits == fused || bits == unfused));
        }
      }
    }
  };
  for (std::int64_t K : {9, 300}) {
    check(type_tag<float>{}, K);
    check(type_tag<double>{}, K);
  }
}

TEST_CASE("conv2d: mixed dtypes promote, views and expressions are accepted, empty batches and channels") {
  Tensor x = random_normal({2, 3, 6, 6}), w = random_normal({4, 3, 3, 3}, 0, 1, DType::float64);
  Tensor y = conv2d(x, w);
  CHECK(y.dtype() == DType::float64);
  CHECK(max_error(y.to_vector<double>(), conv2d_reference(x.astype(DType::float64), w, {}, 1, 0, 1, 1)) <= 1e-12);
  Tensor t = transpose(random_normal({2, 3, 6, 6}), {0, 1, 3, 2});
  Tensor wf = w.astype(DType::float32);
  CHECK(max_error(conv2d(t * 2, wf).to_vector<double>(), conv2d_reference(eval(t * 2), wf, {}, 1, 0, 1, 1)) <= 2e-5);
  CHECK(conv2d(zeros({0, 3, 6, 6}), wf).shape() == Shape{0, 4, 4, 4});
  Tensor none = conv2d(zeros({2, 0, 4, 4}), zeros({3, 0, 1, 1}), array<float>({1, 2, 3}));
  CHECK(none.shape() == Shape{2, 3, 4, 4});
  CHECK(none.to_vector<float>()[16] == 2);
}

TEST_CASE("conv2d errors name the op and the shapes") {
  Tensor x = zeros({2, 3, 8, 8}), w = zeros({4, 3, 3, 3});
  CHECK_THROWS_WITH_AS(conv2d(x, zeros({4, 2, 3, 3})),
                       "conv2d: input of shape (2, 3, 8, 8) (3 channels in 1 group) does not match weight of shape "
                       "(4, 2, 3, 3) (expected (4, 3, 3, 3))",
                       ShapeError);
  CHECK_THROWS_WITH_AS(conv2d(x, zeros({4, 3, 9, 3})),
                       "conv2d: kernel (9, 3) with dilation (1, 1) spans (9, 3), more than the padded input (8, 8) "
                       "(input of shape (2, 3, 8, 8), padding (0, 0))",
                       ShapeError);
  CHECK_THROWS_WITH_AS(conv2d(x, w, {}, 1, 0, 4),
                       doctest::Contains("kernel (3, 3) with dilation (4, 4) spans (9, 9), more than the padded input"),
                       ShapeError);
  CHECK_NOTHROW(conv2d(x, zeros({4, 3, 9, 3}), {}, 1, {1, 0}));
  CHECK_THROWS_WITH_AS(conv2d(x, zeros({4, 1, 3, 3}), {}, 1, 0, 1, 2),
                       "conv2d: input of shape (2, 3, 8, 8) has 3 channels, which 2 groups do not divide", ShapeError);
  CHECK_THROWS_WITH_AS(conv2d(zeros({2, 4, 8, 8}), zeros({3, 2, 3, 3}), {}, 1, 0, 1, 2),
                       "conv2d: weight of shape (3, 2, 3, 3) has 3 filters, which 2 groups do not divide", ShapeError);
  CHECK_THROWS_WITH_AS(conv2d(x, w, {}, 1, 0, 1, 0), "conv2d: groups must be positive, not 0", ValueError);
  CHECK_THROWS_WITH_AS(conv2d(x, w, zeros({3})),
                       "conv2d: bias of shape (3,) does not match weight of shape (4, 3, 3, 3) (expected (4,))",
                       ShapeError);
  CHECK_THROWS_WITH_AS(conv2d(zeros({2, 3, 8, 8}, DType::int32), zeros({4, 3, 3, 3}, DType::int32)),
                       "conv2d: dtype int32 is not supported (float32 or float64)", DTypeError);
  CHECK_THROWS_WITH_AS(conv2d(zeros({3, 8, 8}), w),
                       "conv2d: input of shape (3, 8, 8) is not 4-d (batch, channels, height, width)", ShapeError);
  CHECK_THROWS_WITH_AS(conv2d(x, zeros({4, 3, 3})), doctest::Contains("conv2d: weight of shape (4, 3, 3) is not 4-d"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(conv2d(x, w, {}, {0, 1}), "conv2d: stride (0, 1) must be positive", ValueError);
  CHECK_THROWS_WITH_AS(conv2d(x, w, {}, 1, -1), "conv2d: padding (-1, -1) must not be negative", ValueError);
  CHECK_THROWS_WITH_AS(conv2d(x, w, {}, 1, 0, 0), "conv2d: dilation (0, 0) must be positive", ValueError);
  CHECK_THROWS_AS(conv2d(x, zeros({4, 3, 3, 3}, DType::float32, cpu(1))), DeviceError);
}

struct PoolingCase {
  Shape x;
  Size2d kernel, stride, padding;
  DType dtype = DType::float32;
  PoolingConvention convention = PoolingConvention::valid;
};

TEST_CASE("pooling matches the reference loop: max, average with and without the padding, global") {
  const PoolingCase cases[] = {
      {{2, 3, 8, 8}, 2, 2, 0}, {{2, 3, 7, 9}, 3, 2, 1},   {{1, 2, 11, 6}, {3, 2}, {1, 2}, {1, 0}},
      {{2, 1, 5, 5}, 5, 1, 2}, {{3, 4, 28, 28}, 2, 2, 0}, {{1, 2, 9, 7}, {2, 4}, 3, {1, 2}, DType::float64},
      {{1, 1, 4, 4}, 4, 4, 0},
  };
  for (const auto& c : cases) {
    CAPTURE(to_string(c.x));
    CAPTURE(c.kernel.h);
    CAPTURE(c.padding.h);
    Tensor x = random_normal(c.x, 0, 1, c.dtype);
    const double tol = tolerance(c.dtype);
    CHECK(max_error(max_pool2d(x, c.kernel, c.stride, c.padding).to_vector<double>(),
                    pool2d_reference(x, true, c.kernel, c.stride, c.padding, true)) == 0);
    CHECK(max_error(avg_pool2d(x, c.kernel, c.stride, c.padding).to_vector<double>(),
                    pool2d_reference(x, false, c.kernel, c.stride, c.padding, true)) <= tol);
    CHECK(max_error(avg_pool2d(x, c.kernel, c.stride, c.padding, false).to_vector<double>(),
                    pool2d_reference(x, false, c.kernel, c.stride, c.padding, false)) <= tol);
    Tensor gmax = global_max_pool2d(x), gavg = global_avg_pool2d(x);
    CHECK(gmax.shape() == Shape{c.x[0], c.x[1], 1, 1});
    CHECK(max_error(gmax.to_vector<double>(), pool2d_reference(x, true, {c.x[2], c.x[3]}, 1, 0, true)) == 0);
    CHECK(max_error(gavg.to_vector<double>(), pool2d_reference(x, false, {c.x[2], c.x[3]}, 1, 0, true)) <= tol);
  }
  // NaN wins a max, as in hybra's max.
  Tensor x = array<float>({1, std::nanf(""), 3, 4}, {1, 1, 2, 2});
  CHECK(std::isnan(max_pool2d(x, 2, 2).item<float>()));
  CHECK(std::isnan(global_max_pool2d(x).item<float>()));
  CHECK(max_pool2d(array<float>({1, 2, 3, 4}, {1, 1, 2, 2}), 2, 2).item<float>() == 4);
}

// A captured plan keeps NHWC through poolings between oneDNN's convolutions (jit/channels_last.hpp), so the
// NHWC kernel must give pool2d's bits: every window, padding, stride, convention, divisor; signed zeros,
// infinities and a NaN among the values.
TEST_CASE("pooling on NHWC operands gives the bits of pooling on NCHW") {
  const auto full = PoolingConvention::full;
  const PoolingCase cases[] = {
      {{2, 16, 8, 8}, 2, 2, 0},  {{2, 5, 7, 9}, 3, 2, 1},  {{1, 3, 11, 6}, {3, 2}, {1, 2}, {1, 0}},
      {{2, 2, 5, 5}, 5, 1, 2},   {{1, 7, 9, 7}, {2, 4}, 3, {1, 2}},
      {{2, 6, 10, 7}, 3, 2, 1, DType::float32, full}, {{1, 9, 6, 6}, 2, 2, 0, DType::float32, full},
      // Windows that do not overlap, which pool2d_nhwc reads in place: with padding, uneven, and
      // the full convention's last window past the right edge.
      {{1, 5, 7, 9}, 2, 2, 1},  {{2, 4, 9, 7}, {3, 2}, {3, 2}, {1, 1}},  {{1, 3, 7, 7}, 2, 2, 0, DType::float32, full},
  };
  for (const DType dtype : {DType::float32, DType::float64})
    for (const auto& c : cases) {
      CAPTURE(name(dtype));
      CAPTURE(to_string(c.x));
      CAPTURE(c.kernel.h);
      CAPTURE(c.padding.h);
      std::vector<double> values = random_normal(c.x, 0, 1, DType::float64).to_vector<double>();
      values[1] = -0.0;
      values[4] = std::numeric_limits<double>::infinity();
      values[7] = -std::numeric_limits<double>::infinity();
      values[values.size() / 2] = std::nan("");
      const Tensor nchw = array<double>(values, c.x).astype(dtype);
      const Tensor nhwc = transpose(nchw, {0, 2, 3, 1}).contiguous();
      const auto g = detail::nn::pool2d_geometry("pool2d", c.x, c.kernel, c.stride, c.padding, c.convention);
      for (const bool max : {true, false})
        for (const bool include : {true, false}) {
          CAPTURE(max);
          CAPTURE(include);
          Tensor want({g.N, g.C, g.OH, g.OW}, dtype), got({g.N, g.OH, g.OW, g.C}, dtype);
          dispatch(dtype, [&](auto tag) {
            using T = typename decltype(tag)::type;
            if constexpr (std::is_floating_point_v<T>) {
              const T* x = nchw.data<T>();
              const T* xt = nhwc.data<T>();
              T* w = want.data<T>();
              T* o = got.data<T>();
              if (max) {
                detail::nn::pool2d<T, true>(x, w, g, include);
                detail::nn::pool2d_nhwc<T, true>(xt, o, g, include);
              } else {
                detail::nn::pool2d<T, false>(x, w, g, include);
                detail::nn::pool2d_nhwc<T, false>(xt, o, g, include);
              }
            }
          });
          // Widened to double, which keeps each value's bits apart (signed zeros, the NaN's payload).
          const auto back = transpose(got, {0, 3, 1, 2}).to_vector<double>(), ref = want.to_vector<double>();
          REQUIRE(back.size() == ref.size());
          CHECK(std::memcmp(back.data(), ref.data(), back.size() * sizeof(double)) == 0);
        }
    }
}

TEST_CASE("pooling_convention full: ceil's extra windows, which an average divides by their part in the padded input") {
  const PoolingConvention full = PoolingConvention::full;
  // SqueezeNet's 3x3 windows of stride 2 on 54 columns: 27 windows, not valid's 26.
  Tensor x = random_normal({1, 2, 54, 11});
  CHECK(max_pool2d(x, 3, 2, 0, full).shape() == Shape{1, 2, 27, 5});
  CHECK(max_pool2d(x, 3, 2).shape() == Shape{1, 2, 26, 5});
  struct Case {
    Shape x;
    Size2d kernel, stride, padding;
  };
  for (const Case& c : {Case{{2, 3, 10, 9}, 3, 2, 1}, Case{{1, 2, 7, 8}, {2, 3}, {1, 2}, {1, 1}},
                        Case{{2, 1, 9, 7}, 2, 2, 0}, Case{{1, 1, 54, 54}, 3, 2, 0}}) {
    CAPTURE(to_string(c.x));
    CAPTURE(c.kernel);
    for (DType d : {DType::float32, DType::float64}) {
      Tensor in = random_normal(c.x, 0, 1, d);
      const double tol = tolerance(d);
      CHECK(max_error(max_pool2d(in, c.kernel, c.stride, c.padding, full).to_vector<double>(),
                      pool2d_reference(in, true, c.kernel, c.stride, c.padding, true, true)) == 0);
      for (bool include : {true, false})
        CHECK(max_error(avg_pool2d(in, c.kernel, c.stride, c.padding, include, full).to_vector<double>(),
                        pool2d_reference(in, false, c.kernel, c.stride, c.padding, include, true)) <= tol);
    }
  }
  // Captured, the node says which convention, and the block computes what the op does.
  Symbol s = max_pool2d(sym::var("x", Shape{1, 2, 54, 11}), 3, 2, 0, full);
  CHECK(s.shape() == Shape{1, 2, 27, 5});
  CHECK(op::find_attr(s.node().attrs, "pooling_convention", "test") == "full");
  nn::MaxPool2D pool(3, 2, 0, full);
  pool.hybridize();
  CHECK(max_error(pool(x).to_vector<double>(), max_pool2d(x, 3, 2, 0, full).to_vector<double>()) == 0);
  // A last window that would hold padding alone is refused, not filled with -inf.
  CHECK_THROWS_WITH_AS(max_pool2d(zeros({1, 1, 5, 5}), 1, 3, 0, full),
                       "max_pool2d: with pooling_convention full, the last window of kernel (1, 1) and stride (3, 3) "
                       "holds no input (input of shape (1, 1, 5, 5), padding (0, 0))",
                       ShapeError);
}

TEST_CASE("pooling errors name the op and the shapes") {
  Tensor x = zeros({2, 3, 4, 4});
  CHECK_THROWS_WITH_AS(max_pool2d(x, 5, 1),
                       "max_pool2d: kernel (5, 5) is larger than the padded input (4, 4) (input of shape (2, 3, 4, 4), "
                       "padding (0, 0))",
                       ShapeError);
  CHECK_NOTHROW(max_pool2d(x, 5, 1, 1));
  CHECK_THROWS_WITH_AS(avg_pool2d(x, 2, 2, 2), "avg_pool2d: padding (2, 2) must be smaller than the kernel (2, 2)",
                       ValueError);
  CHECK_THROWS_WITH_AS(max_pool2d(x, {0, 2}, 1), "max_pool2d: kernel (0, 2) must be positive", ValueError);
  CHECK_THROWS_WITH_AS(avg_pool2d(x, 2, 0), "avg_pool2d: stride (0, 0) must be positive", ValueError);
  CHECK_THROWS_WITH_AS(max_pool2d(zeros({3, 4, 4}), 2, 2),
                       "max_pool2d: input of shape (3, 4, 4) is not 4-d (batch, channels, height, width)", ShapeError);
  CHECK_THROWS_WITH_AS(global_avg_pool2d(zeros({2, 3, 4})),
                       doctest::Contains("global_avg_pool2d: input of shape (2, 3, 4)"), ShapeError);
  CHECK_THROWS_WITH_AS(global_max_pool2d(zeros({2, 3, 0, 4})),
                       "global_max_pool2d: input of shape (2, 3, 0, 4) has empty (height, width) planes", ShapeError);
  CHECK_THROWS_WITH_AS(max_pool2d(zeros({2, 3, 4, 4}, DType::int64), 2, 2),
                       "max_pool2d: dtype int64 is not supported (float32 or float64)", DTypeError);
}

TEST_CASE("batch_norm matches its definition along any axis, and its errors name the shapes") {
  for (DType dtype : {DType::float32, DType::float64}) {
    for (std::int64_t axis : {1, -1, 0}) {
      CAPTURE(axis);
      const Shape shape{3, 4, 5};
      const std::int64_t C = shape[static_cast<std::size_t>(axis < 0 ? axis + 3 : axis)];
      Tensor x = random_normal(shape, 0, 2, dtype), gamma = random_normal({C}, 1, 0.5, dtype);
      Tensor beta = random_normal({C}, 0, 1, dtype), mean = random_normal({C}, 0, 1, dtype);
      Tensor var = random_uniform({C}, 0.5, 2, dtype);
      Tensor y = batch_norm(x, gamma, beta, mean, var, 1e-3, axis);
      auto xv = x.to_vector<double>(), gv = gamma.to_vector<double>(), bv = beta.to_vector<double>();
      auto mv = mean.to_vector<double>(), vv = var.to_vector<double>();
      std::vector<double> ref;
      for (std::size_t i = 0; i < xv.size(); ++i) {
        const auto idx = test::unravel(static_cast<std::int64_t>(i), shape);
        const auto c = static_cast<std::size_t>(idx[static_cast<std::size_t>(axis < 0 ? axis + 3 : axis)]);
        ref.push_back((xv[i] - mv[c]) / std::sqrt(vv[c] + 1e-3) * gv[c] + bv[c]);
      }
      CHECK(max_error(y.to_vector<double>(), ref) <= tolerance(dtype) * 10);
    }
  }
  Tensor x = zeros({2, 3, 4, 4}), p = ones({3});
  CHECK_THROWS_WITH_AS(batch_norm(x, ones({4}), p, p, p),
                       "batch_norm: gamma of shape (4,) does not match input of shape (2, 3, 4, 4) (expected (3,), the "
                       "size of axis 1)",
                       ShapeError);
  CHECK_THROWS_WITH_AS(batch_norm(x, p, p, p, ones({3, 1})),
                       doctest::Contains("batch_norm: running_var of shape (3, 1)"), ShapeError);
  CHECK_THROWS_AS(batch_norm(x, p, p, p, p, 1e-5, 4), AxisError);
  CHECK_THROWS_WITH_AS(batch_norm(x, p, p, p, p, 0), "batch_norm: eps 0 must be positive", ValueError);
  Tensor ints = ones({3}, DType::int32);
  CHECK_THROWS_WITH_AS(batch_norm(zeros({2, 3}, DType::int32), ints, ints, ints, ints),
                       "batch_norm: dtype int32 is not supported (float32 or float64)", DTypeError);
}

TEST_CASE("conv2d, pool2d and batch_norm nodes: attributes, inference and the interpreter") {
  Symbol x = sym::var("data", Shape{2, 3, 10, 10});
  Symbol w = sym::var("w", Shape{4, 3, 3, 3}), b = sym::var("b", Shape{4});
  Symbol c = conv2d(x, w, b, {2, 1}, 1, {1, 2});
  CHECK(c.shape() == Shape{2, 4, 5, 8});
  CHECK(c.node().attrs == op::Attrs{{"kernel", "(3, 3)"},
                                    {"stride", "(2, 1)"},
                                    {"pad", "(1, 1)"},
                                    {"dilate", "(1, 2)"},
                                    {"num_group", "1"},
                                    {"num_filter", "4"},
                                    {"no_bias", "false"}});
  Symbol pooled = avg_pool2d(max_pool2d(c, 2, {1, 2}), {2, 1}, 1, 0, false);
  CHECK(pooled.shape() == Shape{2, 4, 3, 4});
  CHECK(pooled.node().op == "pool2d");
  CHECK(pooled.node().attrs == op::Attrs{{"kernel", "(2, 1)"},
                                         {"stride", "(1, 1)"},
                                         {"pad", "(0, 0)"},
                                         {"pool_type", "avg"},
                                         {"global_pool", "false"},
                                         {"count_include_pad", "false"},
                                         {"pooling_convention", "valid"}});
  Symbol g = sym::var("g", Shape{4}), m = sym::var("m", Shape{4}), v = sym::var("v", Shape{4});
  Symbol normed = batch_norm(global_max_pool2d(pooled), g, b, m, v, 1e-3);
  CHECK(normed.shape() == Shape{2, 4, 1, 1});
  CHECK(normed.node().attrs == op::Attrs{{"eps", "0.001"}, {"axis", "1"}});
  Symbol unbiased = conv2d(x, sym::var("w1", Shape{6, 1, 1, 1}), {}, 1, 0, 1, 3);
  CHECK(unbiased.node().attrs.back() == std::pair<std::string, std::string>{"no_bias", "true"});

  std::unordered_map<std::string, Tensor> in{{"data", random_normal({2, 3, 10, 10})},
                                             {"w", random_normal({4, 3, 3, 3})},
                                             {"b", random_normal({4})},
                                             {"g", random_normal({4})},
                                             {"m", random_normal({4})},
                                             {"v", random_uniform({4}, 1, 2)},
                                             {"w1", random_normal({6, 1, 1, 1})}};
  const Tensor conv_eager = conv2d(in["data"], in["w"], in["b"], {2, 1}, 1, {1, 2});
  const Tensor expected =
      batch_norm(global_max_pool2d(avg_pool2d(max_pool2d(conv_eager, 2, {1, 2}), {2, 1}, 1, 0, false)), in["g"],
                 in["b"], in["m"], in["v"], 1e-3);
  const auto graph = graph::trace({normed, global_avg_pool2d(unbiased)});
  const auto out = graph::run(graph, in);
  CHECK(max_rel_diff(out[0], expected) == 0);
  CHECK(max_rel_diff(out[1], global_avg_pool2d(conv2d(in["data"], in["w1"], {}, 1, 0, 1, 3))) == 0);
  CHECK(max_rel_diff(graph::run(graph::optimize(graph), in)[0], expected) == 0);

  // A node's attributes must agree with its operands (as when a model file is read).
  const graph::OpDef& conv_def = graph::find_op("conv2d");
  const std::vector<Tensor> operands{zeros({1, 3, 5, 5}), zeros({4, 3, 3, 3})};
  op::Attrs attrs{{"kernel", "(5, 5)"}, {"stride", "1"},     {"pad", "(0, 0)"},  {"dilate", "(1, 1)"},
                  {"num_group", "1"},   {"num_filter", "4"}, {"no_bias", "true"}};
  CHECK_THROWS_WITH_AS(conv_def.eval(operands, attrs),
                       "conv2d: weight of shape (4, 3, 3, 3) does not match num_filter=4 kernel=(5, 5)", ShapeError);
  attrs[0].second = "(3, 3)";
  CHECK(conv_def.eval(operands, attrs).shape() == Shape{1, 4, 3, 3});
  attrs[6].second = "false";
  CHECK_THROWS_WITH_AS(conv_def.eval(operands, attrs), "conv2d: takes (data, weight, bias), not 2 inputs", ValueError);
  const op::Attrs sum_pool{{"kernel", "(2, 2)"}, {"stride", "(2, 2)"},     {"pad", "(0, 0)"},
                           {"pool_type", "sum"}, {"global_pool", "false"}, {"count_include_pad", "true"}};
  CHECK_THROWS_WITH_AS(graph::find_op("pool2d").eval(std::vector<Tensor>{zeros({1, 1, 4, 4})}, sum_pool),
                       "pool2d: pool_type 'sum' is not max or avg", ValueError);

  // The eager op's errors, from the line that makes the node.
  CHECK_THROWS_WITH_AS(conv2d(x, sym::var("w2", Shape{4, 2, 3, 3})),
                       doctest::Contains("(3 channels in 1 group) does not match"), ShapeError);
  CHECK_THROWS_WITH_AS(conv2d(x, sym::var("w3")), doctest::Contains("symbol 'w3': its shape is unknown"), ShapeError);
  CHECK_THROWS_WITH_AS(max_pool2d(x, 11, 1), doctest::Contains("max_pool2d: kernel (11, 11) is larger"), ShapeError);
}

TEST_CASE("a conv2d followed by relu is one planned node: the kernel, then the epilogue in place") {
  nn::HybridSequential net;
  net.add(nn::Conv2D(8, 3, 1, 1, 1, 1, "relu"), nn::Conv2D(6, {3, 2}, 2, 0, 1, 2), nn::Activation("tanh"));
  net.initialize(nn::init::Xavier());
  Tensor x = random_normal({3, 4, 12, 12});
  Tensor eager = net(x);
  net.hybridize();
  Tensor hybrid = net(x);
  CHECK(hybrid.shape() == Shape{3, 6, 5, 6});
  CHECK(max_rel_diff(eager, hybrid) <= 1e-6);
  // Nodes: the input, two weights, two biases, and each conv2d with its activation as epilogue.
  const graph::Graph& planned = net.plan().graph();
  const std::string g = graph::to_string(planned);
  CAPTURE(g);
  CHECK(planned.nodes.size() == 7);
  CHECK(g.find("conv2d(%0, %1, %2) epilogue[relu($0)] kernel=(3, 3) stride=(1, 1) pad=(1, 1) dilate=(1, 1) num_group=1 "
               "num_filter=8 no_bias=false : (3, 8, 12, 12) float32") != std::string::npos);
  CHECK(g.find("epilogue[tanh($0)] kernel=(3, 2) stride=(2, 2) pad=(0, 0) dilate=(1, 1) num_group=2 num_filter=6 "
               "no_bias=false : (3, 6, 5, 6) float32") != std::string::npos);
  // A second input, and float64: a new capture, the same numbers as eager.
  Tensor x64 = random_normal({1, 4, 7, 9}, 0, 1, DType::float64);
  net.hybridize(false);
  Tensor eager64 = net(x64);
  net.hybridize();
  CHECK(max_rel_diff(net(x64), eager64) <= 1e-12);
}

#ifdef HYBRA_ONEDNN_CALLS
TEST_CASE("HYBRA_ONEDNN: 0, 1 (or unset) and always are its settings; anything else is an error naming it") {
  using backend::cpu::onednn::parse_use;
  using backend::cpu::onednn::Use;
  CHECK(parse_use("") == Use::where_faster);
  CHECK(parse_use("1") == Use::where_faster);
  CHECK(parse_use("0") == Use::off);
  CHECK(parse_use("always") == Use::always);
  CHECK_THROWS_WITH_AS(parse_use("allways"),
                       doctest::Contains("HYBRA_ONEDNN=allways is not a setting; use 1, 0 or always"), ValueError);
}
#endif

// Where oneDNN is built in, these convolutions run on it and keep its blocked copy of the weights with their
// storage (core/derived_forms.hpp). Each case changes the weights by another path between two calls: a kept copy
// that outlived its weights would give the first call's values again.
TEST_CASE("conv2d's kept weight layouts never outlive the weights, however they are written") {
  Tensor x = random_normal({1, 64, 6, 5});
  // check_conv's bound for 576 terms; a stale copy errs by the change made to the weights, O(1) here.
  const double bound = tolerance(DType::float32) * 576 / 64;
  auto check = [&](const Tensor& w, const std::string& after) {
    CAPTURE(after);
    const auto ref = conv2d_reference(x, w, {}, 1, 1, 1, 1);
    CHECK(max_error(conv2d(x, w, {}, 1, 1).to_vector<double>(), ref) <= bound);
  };
  Tensor w = random_normal({64, 64, 3, 3});
  check(w, "first call");
  check(w, "second call, same weights");
  w.assign(w * 2.0f + 1.0f);
  check(w, "an in-place op");
  random_normal({64, 64, 3, 3}).copy_to(w);
  check(w, "copy_to");
  float* raw = w.data<float>();
  check(w, "data<float>");
  raw[0] += 100.0f;  // written through the pointer, unseen: the storage keeps no copy since data<float>() handed it out
  check(w, "a write through data<float>()'s pointer");
  std::vector<float> user(static_cast<std::size_t>(64 * 64 * 9), 0.5f);
  Tensor blob = from_blob(user.data(), {64, 64, 3, 3});
  check(blob, "a user's buffer");
  user[7] = -3.0f;
  check(blob, "a write to the user's buffer");
  // Two weights in one storage: each view's copy is its own.
  Tensor both = random_normal({128, 64, 3, 3});
  check(slice(both, 0, 0, 64), "the first half of a storage");
  check(slice(both, 0, 64, 128), "its second half");
  check(slice(both, 0, 0, 64), "the first half again");
  // A captured graph's parameters, changed between calls by an optimizer-style in-place update.
  nn::Conv2D conv(64, 3, 1, 1, 1, 1, "", false);
  conv.initialize();
  conv.hybridize();
  for (int step = 0; step < 3; ++step) {
    CAPTURE(step);
    const Tensor y = conv(x);  // the first call completes the deferred weight shape
    CHECK(max_error(y.to_vector<double>(), conv2d_reference(x, conv.weight().data(), {}, 1, 1, 1, 1)) <= bound);
    Tensor weight = conv.weight().data();
    weight.assign(weight - 0.25f * weight);
  }
}

TEST_CASE("Conv2D: parameters, deferred in_channels, groups and bias, eager and hybridized") {
  nn::Conv2D conv(6, {3, 5}, {1, 2}, {1, 2}, 1, 2, "", false);
  CHECK(conv.prefix().starts_with("conv"));
  const std::string p = conv.prefix();
  CHECK(conv.collect_params().keys() == std::vector<std::string>{p + "weight"});
  CHECK(conv.weight().shape() == Shape{6, 0, 3, 5});
  conv.initialize();
  Tensor x = random_normal({2, 4, 9, 11});
  Tensor eager = conv(x);
  CHECK(conv.weight().shape() == Shape{6, 2, 3, 5});
  CHECK(max_error(eager.to_vector<double>(), conv2d_reference(x, conv.weight().data(), {}, {1, 2}, {1, 2}, 1, 2)) <=
        2e-5);
  conv.hybridize();
  CHECK(max_rel_diff(conv(x), eager) <= 1e-6);
  CHECK_THROWS_WITH_AS(conv(random_normal({2, 3, 9, 11})),
                       doctest::Contains("has 3 channels, which 2 groups do not divide"), ShapeError);
  CHECK_THROWS_WITH_AS(conv(random_normal({2, 6, 9, 11})),
                       doctest::Contains("does not match its declared shape (6, 2, 3, 5)"), ShapeError);

  nn::Conv2D known(3, 3, 1, 0, 1, 1, "sigmoid", true, 2);
  CHECK(known.collect_params().keys() == std::vector<std::string>{known.prefix() + "weight", known.prefix() + "bias"});
  known.initialize();
  CHECK(known.weight().data().shape() == Shape{3, 2, 3, 3});
  CHECK(known.bias()->data().to_vector<float>() == std::vector<float>{0, 0, 0});
  CHECK(known(random_normal({1, 2, 5, 5})).shape() == Shape{1, 3, 3, 3});
  CHECK_THROWS_WITH_AS(known(random_normal({1, 2, 5})), doctest::Contains("is not 4-d"), ShapeError);
  CHECK_THROWS_AS(nn::Conv2D(4, 3, 1, 0, 1, 3), ValueError);
  CHECK_THROWS_AS(nn::Conv2D(4, 0), ValueError);
  CHECK_THROWS_AS(nn::Conv2D(4, 3, 0), ValueError);
  CHECK_THROWS_AS(nn::Conv2D(4, 3, 1, 0, 1, 1, "swish"), ValueError);
}

TEST_CASE("pooling layers: Gluon's prefix and default strides, eager and hybridized") {
  nn::HybridSequential net;
  net.add(nn::MaxPool2D(), nn::AvgPool2D({3, 2}, 1, {1, 0}, false), nn::MaxPool2D(2, 1, 1), nn::GlobalAvgPool2D());
  const std::string p = net.prefix();
  std::vector<std::string> prefixes;
  for (const auto& c : net.children()) prefixes.push_back(c->prefix());
  CHECK(prefixes == std::vector<std::string>{p + "pool0_", p + "pool1_", p + "pool2_", p + "pool3_"});
  Tensor x = random_normal({2, 3, 10, 12});
  Tensor eager = net(x);
  Tensor expected = global_avg_pool2d(max_pool2d(avg_pool2d(max_pool2d(x, 2, 2), {3, 2}, 1, {1, 0}, false), 2, 1, 1));
  CHECK(max_rel_diff(eager, expected) == 0);
  net.hybridize();
  CHECK(max_rel_diff(net(x), eager) <= 1e-6);
  nn::GlobalMaxPool2D gmax;
  CHECK(gmax.prefix().starts_with("pool"));
  CHECK(max_rel_diff(gmax(x), global_max_pool2d(x)) == 0);
  CHECK_THROWS_AS(nn::MaxPool2D(2, 2, 2), ValueError);
  CHECK_THROWS_AS(nn::AvgPool2D(0), ValueError);
}

TEST_CASE("BatchNorm: Gluon's parameters and initial values, deferred in_channels, eager and hybridized") {
  nn::BatchNorm bn;
  const std::string p = bn.prefix();
  CHECK(p.starts_with("batchnorm"));
  CHECK(bn.collect_params().keys() ==
        std::vector<std::string>{p + "gamma", p + "beta", p + "running_mean", p + "running_var"});
  CHECK(bn.gamma().grad_req() == "write");
  CHECK(bn.beta().grad_req() == "write");
  CHECK(bn.running_mean().grad_req() == "null");
  CHECK(bn.running_var().grad_req() == "null");
  bn.initialize(nn::init::Uniform());  // the parameters' own initialisers win
  Tensor x = random_normal({2, 3, 4, 4});
  Tensor y = bn(x);
  CHECK(bn.running_var().data().to_vector<float>() == std::vector<float>{1, 1, 1});
  CHECK(bn.running_mean().data().to_vector<float>() == std::vector<float>{0, 0, 0});
  CHECK(bn.gamma().data().to_vector<float>() == std::vector<float>{1, 1, 1});
  CHECK(max_rel_diff(y, eval(x / std::sqrt(1 + 1e-5))) <= 1e-6);
  bn.running_mean().set_data(array<float>({1, 2, 3}));
  bn.gamma().set_data(array<float>({2, 2, 2}));
  Tensor eager = bn(x);
  bn.hybridize();
  CHECK(max_rel_diff(bn(x), eager) <= 1e-6);
  {
    autograd::train_mode train;  // the batch's statistics: each channel comes out with mean beta, deviation gamma
    Tensor y_train = bn(x);
    for (float m : mean(y_train, {0, 2, 3}).to_vector<float>()) CHECK(std::abs(m) < 1e-5);
    CHECK(max_rel_diff(mean(y_train * y_train, {0, 2, 3}), full({3}, 4.0)) < 1e-3);
  }
  nn::BatchNorm fixed(-1, 0.9, 1e-5, false, false, 5);
  CHECK(fixed.gamma().grad_req() == "null");
  CHECK(fixed.beta().grad_req() == "null");
  fixed.initialize();
  CHECK(fixed.gamma().data().shape() == Shape{5});
  CHECK_THROWS_WITH_AS(fixed(zeros({2, 4})), doctest::Contains("does not match its declared shape (5,)"), ShapeError);
  CHECK_THROWS_AS(bn.gamma().set_grad_req("sometimes"), ValueError);
}

TEST_CASE("LeNet-5 gives the same numbers eagerly and hybridized") {
  nn::HybridSequential net;
  net.add(nn::Conv2D(6, 5, 1, 2, 1, 1, "relu"), nn::MaxPool2D(2), nn::Conv2D(16, 5, 1, 0, 1, 1, "relu"),
          nn::MaxPool2D(2), nn::Flatten(), nn::Dense(120, "relu"), nn::Dense(84, "relu"), nn::Dense(10));
  net.initialize(nn::init::Xavier());
  const std::string p = net.prefix();
  CHECK(net.collect_params().keys() ==
        std::vector<std::string>{p + "conv0_weight", p + "conv0_bias", p + "conv1_weight", p + "conv1_bias",
                                 p + "dense0_weight", p + "dense0_bias", p + "dense1_weight", p + "dense1_bias",
                                 p + "dense2_weight", p + "dense2_bias"});
  Tensor x = random_uniform({4, 1, 28, 28});
  Tensor eager = net(x);
  CHECK(eager.shape() == Shape{4, 10});
  net.hybridize();
  Tensor hybrid = net(x);
  CHECK(hybrid.shape() == Shape{4, 10});
  CHECK(max_rel_diff(eager, hybrid) <= 1e-6);
  CHECK(net.collect_params()[p + "dense0_weight"].shape() == Shape{120, 400});
  Tensor x2 = random_uniform({4, 1, 28, 28});
  Tensor hybrid2 = net(x2);
  net.hybridize(false);
  CHECK(max_rel_diff(hybrid2, net(x2)) <= 1e-6);
}

TEST_SUITE_END();
