// reshape, transpose, slice and concat: values against plain index loops,
// which results are views (shared storage), and the errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <hybra/eager.hpp>

#include "reference.hpp"
#include <optional>
#include <vector>

using namespace hybra;

namespace {

Tensor iota(const Shape& shape, DType dtype = DType::float32) {
  return arange(0, static_cast<double>(checked_numel(shape)), 1, dtype).view(shape, contiguous_strides(shape), 0);
}

using test::unravel;
using test::ravel;

// Python's x[begin:end:step] on a list, by enumerating the indices it keeps.
std::vector<std::int64_t> py_slice(std::int64_t n, std::optional<std::int64_t> begin, std::optional<std::int64_t> end,
                                   std::int64_t step) {
  std::vector<std::int64_t> kept;
  auto fix = [&](std::optional<std::int64_t> v, std::int64_t dflt) {
    if (!v) return dflt;
    std::int64_t i = *v < 0 ? *v + n : *v;
    if (step > 0) return std::clamp<std::int64_t>(i, 0, n);
    return std::clamp<std::int64_t>(i, -1, n - 1);
  };
  const std::int64_t b = fix(begin, step > 0 ? 0 : n - 1), e = fix(end, step > 0 ? n : -1);
  for (std::int64_t i = b; step > 0 ? i < e : i > e; i += step) kept.push_back(i);
  return kept;
}

}  // namespace

TEST_CASE("reshape: a view of contiguous data, -1 inferred, a copy of strided data") {
  for (DType d : {DType::float32, DType::int64}) {
    const Tensor x = iota({2, 3, 4}, d);
    const Tensor r = reshape(x, {4, -1});
    CHECK(to_string(r.shape()) == "(4, 6)");
    CHECK(r.storage() == x.storage());
    CHECK(r.to_vector<double>() == x.to_vector<double>());
    CHECK(to_string(reshape(x, {-1}).shape()) == "(24,)");
    CHECK(to_string(reshape(x, {2, -1, 3}).shape()) == "(2, 4, 3)");

    // A strided view is copied, in its logical (row-major) order.
    const Tensor t = transpose(x);  // (4, 3, 2)
    const Tensor rt = reshape(t, {4, 6});
    CHECK(rt.storage() != x.storage());
    CHECK(rt.is_contiguous());
    CHECK(rt.to_vector<double>() == t.to_vector<double>());
    // A contiguous slice (offset view) reshapes without a copy, keeping its offset.
    const Tensor s = slice(x, 0, 1, 2);
    const Tensor rs = reshape(s, {12});
    CHECK(rs.storage() == x.storage());
    CHECK(rs.to_vector<double>() == s.to_vector<double>());
  }
  CHECK(reshape(full({}, 7), {1, 1}).item<float>() == 7.f);
  CHECK(reshape(zeros({1, 1}), {}).ndim() == 0);
  CHECK(to_string(reshape(zeros({0, 3}), {3, 0}).shape()) == "(3, 0)");
  CHECK(to_string(reshape(zeros({0, 3}), {-1, 3}).shape()) == "(0, 3)");
  CHECK(reshape(iota({2, 3}) + 1, {3, 2}).to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
}

TEST_CASE("reshape: errors name the op and both shapes") {
  const Tensor x = zeros({2, 3});
  CHECK_THROWS_WITH_AS(reshape(x, {4, 2}), doctest::Contains("reshape: cannot reshape a tensor of shape (2, 3)"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(reshape(x, {4, 2}), doctest::Contains("into shape (4, 2)"), ShapeError);
  CHECK_THROWS_WITH_AS(reshape(x, {4, -1}), doctest::Contains("into shape (4, -1)"), ShapeError);
  CHECK_THROWS_WITH_AS(reshape(x, {-1, -1}), doctest::Contains("only one dimension may be -1"), ShapeError);
  CHECK_THROWS_WITH_AS(reshape(x, {-2, -3}), doctest::Contains("negative dimension"), ShapeError);
  CHECK_THROWS_WITH_AS(reshape(zeros({0, 3}), {-1, 0}), doctest::Contains("(0, 3)"), ShapeError);
}

TEST_CASE("transpose: views with permuted axes, checked against index arithmetic") {
  const Tensor x = iota({2, 3, 4}, DType::int32);
  const std::vector<std::vector<std::int64_t>> perms = {{0, 1, 2}, {2, 1, 0}, {1, 0, 2}, {1, 2, 0}, {-1, 0, -2}};
  for (const auto& p : perms) {
    const Tensor t = transpose(x, p);
    CHECK(t.storage() == x.storage());
    const auto v = t.to_vector<std::int64_t>();
    for (std::int64_t i = 0; i < t.size(); ++i) {
      auto idx = unravel(i, t.shape());
      std::vector<std::int64_t> src(3);
      for (std::size_t k = 0; k < 3; ++k) src[static_cast<std::size_t>(p[k] < 0 ? p[k] + 3 : p[k])] = idx[k];
      CHECK(v[static_cast<std::size_t>(i)] == ravel(src, x.shape()));
    }
  }
  CHECK(to_string(transpose(x).shape()) == "(4, 3, 2)");
  CHECK(transpose(x).to_vector<int>() == transpose(x, {2, 1, 0}).to_vector<int>());
  CHECK(transpose(iota({2, 3})).to_vector<float>() == std::vector<float>{0, 3, 1, 4, 2, 5});
  CHECK(transpose(full({}, 5)).item<float>() == 5.f);
  CHECK(transpose(transpose(x, {1, 2, 0}), {2, 0, 1}).to_vector<int>() == x.to_vector<int>());
}

TEST_CASE("transpose: a bad permutation is an AxisError naming the op and shape") {
  const Tensor x = zeros({2, 3});
  CHECK_THROWS_WITH_AS(transpose(x, {0}), "transpose: axes (0,) are not a permutation of the axes of shape (2, 3)",
                       AxisError);
  CHECK_THROWS_WITH_AS(transpose(x, {0, 0}), doctest::Contains("transpose: axes (0, 0)"), AxisError);
  CHECK_THROWS_WITH_AS(transpose(x, {0, 2}), doctest::Contains("shape (2, 3)"), AxisError);
  CHECK_THROWS_WITH_AS(transpose(x, {1, -3}), doctest::Contains("transpose"), AxisError);
}

TEST_CASE("slice: Python's rules for negative indices, clamping and steps, as views") {
  const std::int64_t n = 7;
  const Tensor x = iota({n}, DType::float64);
  const std::optional<std::int64_t> bounds[] = {std::nullopt, 0, 2, -3, 6, 7, 100, -100, -1};
  for (auto b : bounds)
    for (auto e : bounds)
      for (std::int64_t step : {1, 2, 3, -1, -2, 100, -100}) {
        CAPTURE(b.value_or(999));
        CAPTURE(e.value_or(999));
        CAPTURE(step);
        const Tensor s = slice(x, 0, b, e, step);
        const auto kept = py_slice(n, b, e, step);
        CHECK(s.size() == static_cast<std::int64_t>(kept.size()));
        CHECK(s.storage() == x.storage());
        std::vector<double> expect(kept.begin(), kept.end());
        CHECK(s.to_vector<double>() == expect);
      }
  // Along an inner axis, composed, and then written through.
  const Tensor m = iota({3, 4});
  CHECK(slice(m, 1, 1, 3).to_vector<float>() == std::vector<float>{1, 2, 5, 6, 9, 10});
  CHECK(slice(m, -1, std::nullopt, std::nullopt, -2).to_vector<float>() == std::vector<float>{3, 1, 7, 5, 11, 9});
  CHECK(slice(slice(m, 0, 1, std::nullopt), 1, -1, 0, -1).to_vector<float>() == std::vector<float>{7, 6, 5, 11, 10, 9});
  CHECK(to_string(slice(m, 0, 2, 1).shape()) == "(0, 4)");
  Tensor w = zeros({2, 4});
  slice(w, 1, 0, std::nullopt, 2).assign(full({2, 2}, 1));
  CHECK(w.to_vector<float>() == std::vector<float>{1, 0, 1, 0, 1, 0, 1, 0});
  CHECK(slice(m * 2, 0, 2, 3).to_vector<float>() == std::vector<float>{16, 18, 20, 22});
}

TEST_CASE("slice: step 0 is a ValueError, a bad axis an AxisError") {
  const Tensor x = zeros({2, 3});
  CHECK_THROWS_WITH_AS(slice(x, 1, 0, 2, 0), doctest::Contains("slice: step must not be zero"), ValueError);
  CHECK_THROWS_WITH_AS(slice(x, 1, 0, 2, 0), doctest::Contains("(2, 3)"), ValueError);
  CHECK_THROWS_WITH_AS(slice(x, 2, 0, 1), "slice: axis 2 is out of range for a tensor of shape (2, 3)", AxisError);
  CHECK_THROWS_WITH_AS(slice(full({}, 1), 0, 0, 1), doctest::Contains("slice: axis 0"), AxisError);
}

TEST_CASE("concat: values, promotion, negative axes, strided and empty pieces") {
  const Tensor a = iota({2, 3}), b = iota({2, 2}, DType::int32) + 100;
  for (std::int64_t axis : {1, -1}) {
    const Tensor c = concat({a, b}, axis);
    CHECK(to_string(c.shape()) == "(2, 5)");
    CHECK(c.dtype() == DType::float32);
    CHECK(c.to_vector<float>() == std::vector<float>{0, 1, 2, 100, 101, 3, 4, 5, 102, 103});
  }
  // Reference: along axis 0 of 3-d pieces, element by element.
  const Tensor p = iota({1, 2, 3}, DType::float64), q = transpose(iota({3, 2, 2}, DType::int64)), r = zeros({0, 2, 3});
  const Tensor c = concat({p, r, q}, 0);
  REQUIRE(to_string(c.shape()) == "(3, 2, 3)");
  CHECK(c.dtype() == DType::float64);
  const auto vc = c.to_vector<double>(), vp = p.to_vector<double>(), vq = q.to_vector<double>();
  for (std::size_t i = 0; i < vc.size(); ++i) CHECK(vc[i] == (i < 6 ? vp[i] : vq[i - 6]));
  CHECK(concat({iota({3})}, 0).to_vector<float>() == std::vector<float>{0, 1, 2});
  CHECK(concat({iota({2}), iota({2}) * 3}).to_vector<float>() == std::vector<float>{0, 1, 0, 3});
  CHECK(concat({zeros({0}), zeros({0})}).size() == 0);
  const Tensor u = concat({full({1}, 200, DType::uint8), full({1}, -1, DType::int32)});
  CHECK(u.dtype() == DType::int32);
  CHECK(u.to_vector<int>() == std::vector<int>{200, -1});
}

// Element by element: out's value at each index is the part's that the axis coordinate falls in.
static void check_concat(const std::vector<Tensor>& parts, const Tensor& out, int axis) {
  const auto got = out.to_vector<double>();
  std::vector<std::vector<double>> values;
  for (const Tensor& t : parts) values.push_back(t.to_vector<double>());
  for (std::int64_t i = 0; i < out.size(); ++i) {
    auto idx = unravel(i, out.shape());
    std::size_t k = 0;
    while (idx[static_cast<std::size_t>(axis)] >= parts[k].shape()[static_cast<std::size_t>(axis)])
      idx[static_cast<std::size_t>(axis)] -= parts[k++].shape()[static_cast<std::size_t>(axis)];
    if (got[static_cast<std::size_t>(i)] != values[k][static_cast<std::size_t>(ravel(idx, parts[k].shape()))]) {
      CAPTURE(i);
      FAIL_CHECK("concat wrote another value");
      return;
    }
  }
}

// A value of NCHW shape lying NHWC, as a CPU plan keeps it (jit/channels_last.hpp).
static Tensor lying_nhwc(const Tensor& t) {
  const Shape& d = t.shape();
  Tensor out = Tensor(Shape{d[0], d[2], d[3], d[1]}, t.dtype());
  out.assign(transpose(t, {0, 2, 3, 1}));
  return transpose(out, {0, 3, 1, 2});
}

TEST_CASE("concat of parts that lie densely in out's order: one pass, any axis, layout and dtype") {
  for (DType dtype : {DType::float32, DType::float64, DType::int32, DType::uint8}) {
    CAPTURE(name(dtype));
    const Tensor a = Tensor(iota({2, 3, 4, 5}) + 1).astype(dtype), b = Tensor(iota({2, 1, 4, 5}) + 200).astype(dtype),
                 e = zeros({2, 0, 4, 5}, dtype);
    // Contiguous parts along every axis: rows of whole images, of channels, of pixels.
    for (int axis = 0; axis < 4; ++axis) {
      CAPTURE(axis);
      Shape other = a.shape();
      other[static_cast<std::size_t>(axis)] = 2;
      const std::vector<Tensor> parts{a, Tensor(iota(other) * 3).astype(dtype)};
      check_concat(parts, concat(parts, axis), axis);
    }
    check_concat({a, e, b}, concat({a, e, b}, 1), 1);
    // NHWC parts into an NHWC buffer along channels (DenseNet's, in a plan), and an NHWC part among NCHW ones.
    const std::vector<Tensor> nhwc{lying_nhwc(a), lying_nhwc(e), lying_nhwc(b)};
    const Tensor out = lying_nhwc(zeros({2, 4, 4, 5}, dtype));
    hybra::detail::concat_into(nhwc, out, 1);
    check_concat(nhwc, out, 1);
    check_concat({a, nhwc[2]}, concat({a, nhwc[2]}, 1), 1);
  }
  // Rows enough for both threads, each starting and ending inside a part's run.
  const std::vector<Tensor> wide{random_normal({3, 37, 5, 7}), random_normal({3, 11, 5, 7})};
  const Tensor joined = lying_nhwc(zeros({3, 48, 5, 7}));
  const std::vector<Tensor> wide_nhwc{lying_nhwc(wide[0]), lying_nhwc(wide[1])};
  hybra::detail::concat_into(wide_nhwc, joined, 1);
  check_concat(wide, joined, 1);
}

TEST_CASE("concat: errors name the op and the shapes") {
  CHECK_THROWS_WITH_AS(concat({zeros({2, 3}), zeros({3, 3})}, 1),
                       "concat: shapes (2, 3) and (3, 3) do not match outside axis 1", ShapeError);
  CHECK_THROWS_WITH_AS(concat({zeros({2, 3}), zeros({3})}), doctest::Contains("concat: shapes (2, 3) and (3,)"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(concat({}), doctest::Contains("concat"), ValueError);
  CHECK_THROWS_WITH_AS(concat({full({}, 1), full({}, 2)}), doctest::Contains("concat: a 0-d tensor"), ShapeError);
  CHECK_THROWS_WITH_AS(concat({zeros({2, 3})}, 2), "concat: axis 2 is out of range for a tensor of shape (2, 3)",
                       AxisError);
}
