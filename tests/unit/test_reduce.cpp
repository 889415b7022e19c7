// sum, mean, max, min, argmax and cumsum against a plain reference loop:
// every axis set, keepdims, every dtype, strided inputs, the split
// (multi-task) paths, NaN, empty tensors, the errors, and float32 accuracy
// on a long sum.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <hybra/eager.hpp>

#include "reference.hpp"
#include <limits>
#include <optional>
#include <vector>

using namespace hybra;

namespace {

enum class Op { sum, mean, max, min };
const char* op_name(Op op) {
  switch (op) {
    case Op::sum: return "sum";
    case Op::mean: return "mean";
    case Op::max: return "max";
    case Op::min: return "min";
  }
  return "?";
}

Tensor make(const Shape& shape, DType dtype, int seed = 0) { return test::small_ints(shape, dtype, seed, 13); }

using test::unravel;

double as_dtype(DType d, double v) {
  return dispatch(d, [&](auto tag) { return static_cast<double>(static_cast<typename decltype(tag)::type>(v)); });
}

struct Ref {
  Shape shape;
  std::vector<std::vector<double>> groups;  // the inputs of each output element, in order
};

// Groups x's elements by output position.
Ref group(const Tensor& x, const std::optional<std::vector<std::int64_t>>& axes, bool keepdims) {
  const Shape& s = x.shape();
  std::vector<bool> mask(s.size(), !axes);
  if (axes)
    for (auto a : *axes) mask[static_cast<std::size_t>(a < 0 ? a + static_cast<std::int64_t>(s.size()) : a)] = true;
  Ref r;
  Shape kept;
  for (std::size_t d = 0; d < s.size(); ++d) {
    if (!mask[d]) kept.push_back(s[d]);
    if (!mask[d]) r.shape.push_back(s[d]);
    else if (keepdims) r.shape.push_back(1);
  }
  r.groups.resize(static_cast<std::size_t>(checked_numel(kept)));
  const auto v = x.to_vector<double>();
  for (std::size_t i = 0; i < v.size(); ++i) {
    auto idx = unravel(static_cast<std::int64_t>(i), s);
    std::int64_t o = 0;
    for (std::size_t d = 0; d < s.size(); ++d)
      if (!mask[d]) o = o * s[d] + idx[d];
    r.groups[static_cast<std::size_t>(o)].push_back(v[i]);
  }
  return r;
}

Tensor run(Op op, const Tensor& x, const std::optional<std::vector<std::int64_t>>& axes, bool keepdims) {
  const Axes ax = axes ? Axes(*axes) : Axes();
  switch (op) {
    case Op::sum: return sum(x, ax, keepdims);
    case Op::mean: return mean(x, ax, keepdims);
    case Op::max: return max(x, ax, keepdims);
    case Op::min: return min(x, ax, keepdims);
  }
  return {};
}

DType expected_dtype(Op op, DType in) {
  if (op == Op::sum) return is_floating(in) ? in : DType::int64;
  if (op == Op::mean) return is_floating(in) ? in : DType::float32;
  return in;
}

bool same(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

void check_reduce(Op op, const Tensor& x, const std::optional<std::vector<std::int64_t>>& axes, bool keepdims) {
  CAPTURE(op_name(op));
  CAPTURE(to_string(x.shape()));
  CAPTURE(axes ? to_string(Shape(axes->begin(), axes->end())) : std::string("all"));
  CAPTURE(keepdims);
  const Tensor r = run(op, x, axes, keepdims);
  const Ref ref = group(x, axes, keepdims);
  const DType out = expected_dtype(op, x.dtype());
  REQUIRE(to_string(r.shape()) == to_string(ref.shape));
  CHECK(r.dtype() == out);
  const auto got = r.to_vector<double>();
  for (std::size_t i = 0; i < got.size(); ++i) {
    const auto& g = ref.groups[i];
    double expect = 0;
    if (op == Op::sum || op == Op::mean) {
      for (double v : g) expect += v;
      if (op == Op::mean) expect /= static_cast<double>(g.size());
    } else {
      expect = g[0];
      for (double v : g)
        if (std::isnan(v) || std::isnan(expect)) expect = std::numeric_limits<double>::quiet_NaN();
        else expect = op == Op::max ? std::max(expect, v) : std::min(expect, v);
    }
    CAPTURE(i);
    CHECK(same(got[i], as_dtype(out, expect)));
  }
}

// argmax's reference: the first maximum, a NaN beating any number.
void check_argmax(const Tensor& x, std::optional<std::int64_t> axis, bool keepdims) {
  CAPTURE(to_string(x.shape()));
  CAPTURE(axis ? *axis : 99);
  CAPTURE(keepdims);
  const Tensor r = argmax(x, axis, keepdims);
  CHECK(r.dtype() == DType::int64);
  const Shape& s = x.shape();
  Shape expect_shape;
  std::size_t ax = 0;
  if (axis) {
    ax = static_cast<std::size_t>(*axis < 0 ? *axis + static_cast<std::int64_t>(s.size()) : *axis);
    for (std::size_t d = 0; d < s.size(); ++d)
      if (d != ax) expect_shape.push_back(s[d]);
      else if (keepdims) expect_shape.push_back(1);
  } else if (keepdims) {
    expect_shape.assign(s.size(), 1);
  }
  REQUIRE(to_string(r.shape()) == to_string(expect_shape));
  const auto v = x.to_vector<double>();
  const auto got = r.to_vector<std::int64_t>();
  std::vector<double> best(got.size());
  std::vector<std::int64_t> where(got.size(), -1);
  for (std::size_t i = 0; i < v.size(); ++i) {
    auto idx = unravel(static_cast<std::int64_t>(i), s);
    std::int64_t o = 0, pos = static_cast<std::int64_t>(i);
    if (axis) {
      for (std::size_t d = 0; d < s.size(); ++d)
        if (d != ax) o = o * s[d] + idx[d];
      pos = idx[ax];
    }
    auto k = static_cast<std::size_t>(o);
    if (where[k] < 0 || v[i] > best[k] || (std::isnan(v[i]) && !std::isnan(best[k]))) {
      best[k] = v[i];
      where[k] = pos;
    }
  }
  CHECK(got == where);
}

std::vector<std::vector<std::int64_t>> subsets(std::size_t nd) {
  std::vector<std::vector<std::int64_t>> all;
  for (std::size_t bits = 0; bits < (1u << nd); ++bits) {
    std::vector<std::int64_t> s;
    for (std::size_t d = 0; d < nd; ++d)
      if (bits >> d & 1) s.push_back(bits % 2 ? static_cast<std::int64_t>(d) - static_cast<std::int64_t>(nd)
                                              : static_cast<std::int64_t>(d));  // some negative
    all.push_back(s);
  }
  return all;
}

const Op all_ops[] = {Op::sum, Op::mean, Op::max, Op::min};
using test::all_dtypes;

}  // namespace

TEST_CASE("reductions over every axis set, with and without keepdims, in every dtype") {
  const Shape shapes[] = {{}, {5}, {2, 3}, {3, 1, 4}, {2, 3, 4}, {2, 3, 4, 5}};
  for (DType d : all_dtypes)
    for (const auto& shape : shapes) {
      const Tensor x = make(shape, d);
      for (Op op : all_ops)
        for (bool keep : {false, true}) {
          check_reduce(op, x, std::nullopt, keep);
          for (const auto& axes : subsets(shape.size())) check_reduce(op, x, axes, keep);
        }
    }
}

TEST_CASE("argmax over each axis or the flattened tensor, with keepdims, in every dtype") {
  for (DType d : all_dtypes) {
    for (const Shape& shape : {Shape{}, Shape{7}, Shape{3, 4}, Shape{2, 3, 4}}) {
      const Tensor x = make(shape, d, 1);  // values repeat, so ties must pick the first
      for (bool keep : {false, true}) {
        check_argmax(x, std::nullopt, keep);
        for (std::int64_t a = -static_cast<std::int64_t>(shape.size()); a < static_cast<std::int64_t>(shape.size()); ++a)
          check_argmax(x, a, keep);
      }
    }
  }
  CHECK(argmax(array<float>({1, 3, 3, 2})).item<std::int64_t>() == 1);
  CHECK(argmax(array<std::int32_t>({5, 1, 5}, {3})).item<std::int64_t>() == 0);
}

TEST_CASE("reductions of transposed, sliced and reversed views") {
  for (DType d : {DType::float32, DType::int32}) {
    const Tensor base = make({3, 4, 5}, d, 2);
    const Tensor views[] = {transpose(base, {2, 0, 1}), slice(base, 2, 0, std::nullopt, 2),
                            slice(base, 1, std::nullopt, std::nullopt, -1), transpose(slice(base, 0, 1, 3))};
    for (const Tensor& v : views) {
      CHECK_FALSE(v.is_contiguous());
      for (Op op : all_ops)
        for (bool keep : {false, true}) {
          check_reduce(op, v, std::nullopt, keep);
          for (const auto& axes : subsets(3)) check_reduce(op, v, axes, keep);
        }
      for (std::int64_t a = -3; a < 3; ++a) check_argmax(v, a, false);
      check_argmax(v, std::nullopt, true);
    }
  }
}

TEST_CASE("long reductions that are cut into pieces give the reference result") {
  // Few rows or few columns make the reduced axis split across tasks.
  for (DType d : {DType::float32, DType::int64}) {
    const Tensor rows = make({3, 70001}, d), cols = make({70001, 3}, d), mid = make({2, 40000, 3}, d);
    for (Op op : all_ops) {
      check_reduce(op, rows, std::vector<std::int64_t>{1}, false);
      check_reduce(op, cols, std::vector<std::int64_t>{0}, true);
      check_reduce(op, mid, std::vector<std::int64_t>{1}, false);
      check_reduce(op, mid, std::vector<std::int64_t>{0, 2}, false);
      check_reduce(op, rows, std::nullopt, false);
    }
    check_argmax(rows, 1, false);
    check_argmax(cols, 0, false);
    check_argmax(mid, 1, false);
    check_argmax(rows, std::nullopt, false);
  }
  // The maximum in a late piece, and ties across pieces: the first one wins.
  std::vector<float> v(200000, 1.f);
  v[150000] = 5.f;
  v[190000] = 5.f;
  CHECK(argmax(array(v)).item<std::int64_t>() == 150000);
  CHECK(max(array(v)).item<float>() == 5.f);
  v[170000] = std::nanf("");
  CHECK(argmax(array(v)).item<std::int64_t>() == 170000);
  CHECK(std::isnan(max(array(v)).item<float>()));
}

TEST_CASE("NaN propagates through max, min and sum; argmax picks the first NaN") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor x = array<float>({1, nan, 3, 4, 2, nan}, {2, 3});
  CHECK(std::isnan(max(x).item<float>()));
  CHECK(std::isnan(min(x).item<float>()));
  CHECK(std::isnan(sum(x).item<float>()));
  auto m = max(x, 0).to_vector<float>();
  CHECK(m[0] == 4.f);
  CHECK(std::isnan(m[1]));
  CHECK(std::isnan(m[2]));
  CHECK(argmax(x).item<std::int64_t>() == 1);
  CHECK(argmax(x, 1).to_vector<std::int64_t>() == std::vector<std::int64_t>{1, 2});
  CHECK(argmax(x, 0).to_vector<std::int64_t>() == std::vector<std::int64_t>{1, 0, 1});
  check_reduce(Op::max, x, std::vector<std::int64_t>{1}, false);
  check_reduce(Op::min, x, std::vector<std::int64_t>{0}, true);
}

TEST_CASE("integer sums are int64 and wrap; means of integers are float32") {
  const Tensor big = array<std::int64_t>({std::numeric_limits<std::int64_t>::max(), 1});
  CHECK(sum(big).item<std::int64_t>() == std::numeric_limits<std::int64_t>::min());
  const Tensor u = full({300}, 255, DType::uint8);
  CHECK(sum(u).dtype() == DType::int64);
  CHECK(sum(u).item<std::int64_t>() == 300 * 255);
  const Tensor i = array<std::int32_t>({1, 2, 3, 4}, {2, 2});
  CHECK(mean(i).dtype() == DType::float32);
  CHECK(mean(i).item<float>() == 2.5f);
  CHECK(mean(i, 1).to_vector<float>() == std::vector<float>{1.5f, 3.5f});
  CHECK(max(i, 0).dtype() == DType::int32);
}

TEST_CASE("0-d and empty tensors") {
  const Tensor s = full({}, 4, DType::float64);
  CHECK(sum(s).item<double>() == 4.0);
  CHECK(sum(s).ndim() == 0);
  CHECK(max(s, std::nullopt, true).ndim() == 0);
  CHECK(argmax(s).item<std::int64_t>() == 0);
  CHECK(sum(make({2, 3}, DType::float32), std::vector<std::int64_t>{}).to_vector<float>() ==
        make({2, 3}, DType::float32).to_vector<float>());

  const Tensor e = zeros({0, 3});
  CHECK(sum(e).item<float>() == 0.f);
  CHECK(sum(e, 0).to_vector<float>() == std::vector<float>{0, 0, 0});
  CHECK(to_string(sum(e, 0, true).shape()) == "(1, 3)");
  CHECK(sum(e, 1).size() == 0);
  CHECK(std::isnan(mean(e).item<float>()));
  CHECK(std::isnan(mean(e, 0).to_vector<float>()[2]));
  CHECK(sum(zeros({0}, DType::int32)).dtype() == DType::int64);
  // Reducing an empty axis into an empty result needs no identity.
  CHECK(to_string(max(e, 1).shape()) == "(0,)");
  CHECK(to_string(argmax(e, 1).shape()) == "(0,)");
  CHECK_THROWS_WITH_AS(max(e, 0), doctest::Contains("max: cannot reduce a zero-size axis of shape (0, 3)"), ValueError);
  CHECK_THROWS_WITH_AS(min(e), doctest::Contains("min: cannot reduce a zero-size axis of shape (0, 3)"), ValueError);
  CHECK_THROWS_WITH_AS(argmax(e), doctest::Contains("argmax: cannot reduce a zero-size axis of shape (0, 3)"),
                       ValueError);
  CHECK_THROWS_WITH_AS(argmax(e, 0), doctest::Contains("(0, 3)"), ValueError);
}

TEST_CASE("bad axes are AxisErrors naming the op and the shape") {
  const Tensor x = zeros({2, 3});
  CHECK_THROWS_WITH_AS(sum(x, 2), "sum: axis 2 is out of range for a tensor of shape (2, 3)", AxisError);
  CHECK_THROWS_WITH_AS(mean(x, -3), doctest::Contains("mean: axis -3 is out of range for a tensor of shape (2, 3)"),
                       AxisError);
  CHECK_THROWS_WITH_AS(max(x, {0, 5}), doctest::Contains("max: axis 5"), AxisError);
  CHECK_THROWS_WITH_AS(sum(x, {1, -1}), "sum: axis -1 is repeated in axes (1, -1) for shape (2, 3)", AxisError);
  CHECK_THROWS_WITH_AS(min(x, {0, 0}), doctest::Contains("min: axis 0 is repeated"), AxisError);
  CHECK_THROWS_WITH_AS(argmax(x, 2), doctest::Contains("argmax: axis 2 is out of range for a tensor of shape (2, 3)"),
                       AxisError);
  CHECK_THROWS_WITH_AS(sum(full({}, 1), 0), doctest::Contains("shape ()"), AxisError);
}

TEST_CASE("expressions are evaluated before reducing") {
  const Tensor a = make({3, 4}, DType::float32), b = make({3, 4}, DType::float32, 1);
  CHECK(sum(a * 2 + b, 1).to_vector<float>() == sum(Tensor(a * 2 + b), 1).to_vector<float>());
  CHECK(argmax(a - b).to_vector<std::int64_t>() == argmax(Tensor(a - b)).to_vector<std::int64_t>());
}

TEST_CASE("a float32 sum of 1e6 elements is accurate against a double reference") {
  const Tensor x = random_uniform({1000000}, -1, 3);
  const auto v = x.to_vector<double>();
  double ref = 0;
  for (double e : v) ref += e;
  // One float32 rounding of the exact sum, not ~1e6 of them.
  CHECK(std::abs(sum(x).item<double>() - ref) <= 1e-6 * std::abs(ref));
  CHECK(std::abs(mean(x).item<double>() - ref / 1e6) <= 1e-6 * std::abs(ref / 1e6));
  // Column sums of a (1000, 1000) view of the same data.
  const Tensor m = reshape(x, {1000, 1000});
  const auto cols = sum(m, 0).to_vector<double>();
  for (int j = 0; j < 1000; j += 97) {
    double c = 0;
    for (int i = 0; i < 1000; ++i) c += v[static_cast<std::size_t>(i * 1000 + j)];
    CHECK(std::abs(cols[static_cast<std::size_t>(j)] - c) <= 1e-6 * std::abs(c) + 1e-6);
  }
}

namespace {
// cumsum's reference: each running sum added in order in the result's type.
template <class Out>
std::vector<Out> running_sums(const Tensor& x, std::optional<std::int64_t> axis, bool reverse) {
  const auto v = x.to_vector<double>();
  const Shape& s = x.shape();
  std::int64_t outer = 1, R = static_cast<std::int64_t>(v.size()), inner = 1;
  if (axis) {
    const auto a = static_cast<std::size_t>(*axis < 0 ? *axis + static_cast<std::int64_t>(s.size()) : *axis);
    R = s[a];
    for (std::size_t d = 0; d < s.size(); ++d) {
      if (d < a) outer *= s[d];
      if (d > a) inner *= s[d];
    }
  }
  std::vector<Out> out(v.size());
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t i = 0; i < inner; ++i) {
      Out acc = 0;
      for (std::int64_t k = 0; k < R; ++k) {
        const std::int64_t at = (o * R + (reverse ? R - 1 - k : k)) * inner + i;
        acc += static_cast<Out>(v[static_cast<std::size_t>(at)]);
        out[static_cast<std::size_t>(at)] = acc;
      }
    }
  return out;
}
}  // namespace

TEST_CASE("cumsum along each axis, reversed and flattened, in every dtype, is the in-order running sum") {
  for (DType d : test::all_dtypes) {
    CAPTURE(name(d));
    const Tensor x = make({3, 4, 5}, d, 2);
    for (std::optional<std::int64_t> axis : {std::optional<std::int64_t>{}, std::optional<std::int64_t>{0},
                                             std::optional<std::int64_t>{1}, std::optional<std::int64_t>{-1}})
      for (bool reverse : {false, true}) {
        CAPTURE(axis.value_or(99));
        CAPTURE(reverse);
        const Tensor y = cumsum(x, axis, reverse);
        CHECK(y.shape() == (axis ? x.shape() : Shape{60}));
        if (is_floating(d)) {
          CHECK(y.dtype() == d);
          if (d == DType::float32) CHECK(y.to_vector<float>() == running_sums<float>(x, axis, reverse));
          else CHECK(y.to_vector<double>() == running_sums<double>(x, axis, reverse));
        } else {
          CHECK(y.dtype() == DType::int64);
          CHECK(y.to_vector<std::int64_t>() == running_sums<std::int64_t>(x, axis, reverse));
        }
      }
  }
  // A view is read in its own order; an expression is evaluated first.
  const Tensor m = make({4, 6}, DType::float64, 3);
  CHECK(cumsum(transpose(m), 1).to_vector<double>() == running_sums<double>(transpose(m).contiguous(), 1, false));
  CHECK(cumsum(m * 2, 0).to_vector<double>() == cumsum(Tensor(m * 2), 0).to_vector<double>());
  // Large enough to split across threads.
  const Tensor big = make({64, 1024}, DType::float32, 4);
  CHECK(cumsum(big, 1).to_vector<float>() == running_sums<float>(big, 1, false));
}

TEST_CASE("cumsum of 0-d and empty tensors, and its errors") {
  CHECK(cumsum(full({}, 3)).to_vector<float>() == std::vector<float>{3});
  CHECK(cumsum(zeros({0, 3}), 0).shape() == Shape{0, 3});
  CHECK(cumsum(zeros({2, 0}), 0).shape() == Shape{2, 0});
  CHECK_THROWS_WITH_AS(cumsum(zeros({2, 3}), 2), "cumsum: axis 2 is out of range for a tensor of shape (2, 3)",
                       AxisError);
  CHECK_THROWS_WITH_AS(cumsum(full({}, 1), 0), doctest::Contains("shape ()"), AxisError);
  CHECK_THROWS_AS(cumsum(Tensor{}), Error);
}
