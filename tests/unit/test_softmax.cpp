// softmax and log_softmax against a long-double reference loop, over every
// axis, for large inputs (no overflow), strided and integer inputs, edge cases.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <hybra/eager.hpp>
#include <limits>
#include <vector>

using namespace hybra;

namespace {

// softmax / log_softmax of x along axis, written as the textbook formula in
// long double (which overflows for nothing we test).
std::vector<double> reference(const Tensor& x, std::int64_t axis, bool log) {
  const Shape s = x.shape().empty() ? Shape{1} : x.shape();
  const auto ax = static_cast<std::size_t>(axis < 0 ? axis + static_cast<std::int64_t>(s.size()) : axis);
  std::int64_t outer = 1, inner = 1;
  for (std::size_t d = 0; d < s.size(); ++d) {
    if (d < ax) outer *= s[d];
    if (d > ax) inner *= s[d];
  }
  const std::int64_t n = s[ax];
  const auto v = x.to_vector<double>();
  std::vector<double> out(v.size());
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t j = 0; j < inner; ++j) {
      auto at = [&](std::int64_t r) { return static_cast<std::size_t>((o * n + r) * inner + j); };
      long double total = 0;
      for (std::int64_t r = 0; r < n; ++r) total += std::exp(static_cast<long double>(v[at(r)]));
      for (std::int64_t r = 0; r < n; ++r) {
        long double e = std::exp(static_cast<long double>(v[at(r)]));
        out[at(r)] = static_cast<double>(log ? std::log(e / total) : e / total);
      }
    }
  return out;
}

void check_close(const Tensor& got, const std::vector<double>& expect, double tol) {
  const auto g = got.to_vector<double>();
  REQUIRE(g.size() == expect.size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    CAPTURE(i);
    CHECK(std::abs(g[i] - expect[i]) <= tol * (1 + std::abs(expect[i])));
  }
}

Tensor values(const Shape& shape, DType dtype, double scale) {
  std::vector<double> v(static_cast<std::size_t>(checked_numel(shape)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = scale * std::sin(static_cast<double>(i) * 1.7 + 0.3);
  return array(v, shape).astype(dtype);
}

}  // namespace

TEST_CASE("softmax and log_softmax over every axis match the reference") {
  for (DType d : {DType::float32, DType::float64}) {
    const double tol = d == DType::float32 ? 2e-6 : 1e-13;
    const Tensor x = values({2, 3, 4}, d, 3);
    for (std::int64_t axis = -3; axis < 3; ++axis) {
      CAPTURE(name(d));
      CAPTURE(axis);
      const Tensor s = softmax(x, axis), l = log_softmax(x, axis);
      CHECK(s.dtype() == d);
      CHECK(to_string(s.shape()) == "(2, 3, 4)");
      check_close(s, reference(x, axis, false), tol);
      check_close(l, reference(x, axis, true), tol);
    }
    CHECK(softmax(x).to_vector<double>() == softmax(x, 2).to_vector<double>());
    // Wide rows and columns (several column blocks per task).
    const Tensor wide = values({3, 2100}, d, 2);
    check_close(softmax(wide, 0), reference(wide, 0, false), tol);
    check_close(log_softmax(wide, 0), reference(wide, 0, true), tol);
    check_close(softmax(wide, 1), reference(wide, 1, false), tol);
    check_close(log_softmax(wide, 1), reference(wide, 1, true), tol);
  }
}

TEST_CASE("softmax does not overflow on large inputs; log_softmax stays finite") {
  const Tensor x = array<float>({1000, 1001, 1002, -1000}, {1, 4});
  const auto s = softmax(x).to_vector<double>();
  const auto shifted = reference(array<float>({0, 1, 2, -2000}, {1, 4}), -1, false);
  for (std::size_t i = 0; i < s.size(); ++i) CHECK(std::abs(s[i] - shifted[i]) <= 1e-6);
  const auto l = log_softmax(x).to_vector<double>();
  for (double v : l) CHECK(std::isfinite(v));
  CHECK(l[3] == doctest::Approx(-2000 - std::log(1 + std::exp(1.0) + std::exp(2.0))).epsilon(1e-6));
  // Along a non-last axis too.
  const auto c = softmax(transpose(x), 0).to_vector<double>();
  for (std::size_t i = 0; i < c.size(); ++i) CHECK(std::abs(c[i] - shifted[i]) <= 1e-6);
  // Probabilities that underflow to 0 have finite log-probabilities.
  const auto tiny = log_softmax(array<float>({0, -200})).to_vector<float>();
  CHECK(tiny[1] == doctest::Approx(-200.f));
  CHECK(softmax(array<float>({0, -200})).to_vector<float>()[1] == 0.f);
  // -inf entries get probability 0; NaN propagates.
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(softmax(array<float>({-inf, 0})).to_vector<float>() == std::vector<float>{0, 1});
  CHECK(std::isnan(softmax(array<float>({std::nanf(""), 0})).to_vector<float>()[1]));
}

TEST_CASE("softmax of strided views, integers, expressions, 0-d and empty tensors") {
  const Tensor base = values({4, 6}, DType::float64, 2);
  const Tensor views[] = {transpose(base), slice(base, 1, 0, std::nullopt, 2), slice(base, 0, std::nullopt, std::nullopt, -1)};
  for (const Tensor& v : views)
    for (std::int64_t axis : {0, -1}) {
      check_close(softmax(v, axis), reference(v, axis, false), 1e-13);
      check_close(log_softmax(v, axis), reference(v, axis, true), 1e-13);
    }
  const Tensor i = array<std::int32_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(softmax(i).dtype() == DType::float32);
  CHECK(log_softmax(i, 0).dtype() == DType::float32);
  check_close(softmax(i), reference(i, -1, false), 2e-6);
  check_close(log_softmax(i, 0), reference(i, 0, true), 2e-6);
  check_close(softmax(base * 2 - 1, 0), reference(Tensor(base * 2 - 1), 0, false), 1e-13);

  CHECK(softmax(full({}, 3)).item<float>() == 1.f);
  CHECK(log_softmax(full({}, 3), 0).item<float>() == 0.f);
  CHECK(softmax(zeros({0, 3})).size() == 0);
  CHECK(to_string(log_softmax(zeros({2, 0}), 0).shape()) == "(2, 0)");
  // Each row sums to one.
  const auto rows = sum(softmax(values({5, 7}, DType::float64, 4)), 1).to_vector<double>();
  for (double r : rows) CHECK(r == doctest::Approx(1.0).epsilon(1e-14));
}

TEST_CASE("softmax: a bad axis is an AxisError naming the op and the shape") {
  CHECK_THROWS_WITH_AS(softmax(zeros({2, 3}), 2), "softmax: axis 2 is out of range for a tensor of shape (2, 3)",
                       AxisError);
  CHECK_THROWS_WITH_AS(log_softmax(zeros({2, 3}), -3), doctest::Contains("log_softmax: axis -3"), AxisError);
  CHECK_THROWS_WITH_AS(softmax(full({}, 1), 1), "softmax: axis 1 is out of range for a tensor of shape ()", AxisError);
}
