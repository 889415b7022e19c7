// Elementwise expressions: every op of the table against a one-line reference
// in every dtype, broadcasting, promotion, fused == unfused, views, aliasing,
// threads, printing the typed graph, and errors.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <hybra/eager.hpp>
#include <limits>

#include "reference.hpp"

using namespace hybra;

namespace {

// A tensor of dtype d with values spread over [lo, hi] (deterministic).
Tensor sample(Shape shape, DType d, double lo, double hi, std::uint64_t seed) {
  Generator g(seed);
  Tensor u = random_uniform(shape, lo, hi, DType::float64, cpu(), g);
  return is_floating(d) ? u.astype(d) : Tensor(u + 0.5).astype(d);  // integers: rounded
}

// Checks every element of `got` against ref(inputs...) computed in double.
template <class Ref>
void check_against(const Tensor& got, std::vector<Tensor> inputs, Ref ref, double tol) {
  auto g = got.to_vector<double>();
  std::vector<std::vector<double>> in;
  for (auto& t : inputs) in.push_back(t.to_vector<double>());
  REQUIRE(g.size() == in[0].size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    double want = in.size() == 1 ? ref(in[0][i], 0.0) : ref(in[0][i], in[1][i]);
    if (std::isnan(want)) {
      CHECK(std::isnan(g[i]));
    } else {
      INFO("element ", i, " inputs ", in[0][i], (in.size() > 1 ? in[1][i] : 0.0));
      if (tol == 0) CHECK(g[i] == (got.dtype() == DType::float32 ? double(float(want)) : want));
      else CHECK(g[i] == doctest::Approx(want).epsilon(tol).scale(1));
    }
  }
}

using test::all_dtypes;

double tol_for(DType d) { return d == DType::float32 ? 2e-6 : d == DType::float64 ? 1e-13 : 0; }

}  // namespace

TEST_CASE("every unary op matches its reference in every dtype") {
  for (DType d : all_dtypes) {
    CAPTURE(name(d));
    double lo = d == DType::uint8 ? 0 : -4;
    Tensor x = sample({4, 33}, d, lo, 4, 11);
    Tensor pos = sample({4, 33}, d, 1, 9, 12);
    double ft = tol_for(is_floating(d) ? d : DType::float32);
    auto same = [&](Tensor t) { CHECK(t.dtype() == d); return t; };
    auto flt = [&](Tensor t) { CHECK(t.dtype() == (is_floating(d) ? d : DType::float32)); return t; };
    check_against(same(-x), {x}, [&](double a, double) { return d == DType::uint8 ? std::fmod(256 - a, 256) : -a; }, 0);
    check_against(same(abs(x)), {x}, [](double a, double) { return std::abs(a); }, 0);
    check_against(same(relu(x)), {x}, [](double a, double) { return a < 0 ? 0 : a; }, 0);
    check_against(flt(exp(x)), {x}, [](double a, double) { return std::exp(a); }, ft);
    check_against(flt(log(pos)), {pos}, [](double a, double) { return std::log(a); }, ft);
    check_against(flt(sqrt(pos)), {pos}, [](double a, double) { return std::sqrt(a); }, ft);
    check_against(flt(tanh(x)), {x}, [](double a, double) { return std::tanh(a); }, ft);
    check_against(flt(sigmoid(x)), {x}, [](double a, double) { return 1 / (1 + std::exp(-a)); }, ft);
    check_against(flt(softplus(x)), {x}, [](double a, double) { return std::log1p(std::exp(a)); }, ft);
    check_against(flt(erf(x)), {x}, [](double a, double) { return std::erf(a); }, ft);
  }
}

TEST_CASE("the activations of current models match their formulas, fused with their operand's expression") {
  const double sqrt_half = std::sqrt(0.5), tanh_scale = std::sqrt(2 / M_PI);
  for (DType d : {DType::float32, DType::float64}) {
    CAPTURE(name(d));
    const Tensor x = sample({4, 33}, d, -3, 3, 13);
    const double tol = d == DType::float32 ? 1e-6 : 1e-13;
    // Each takes 2x - 1, an expression: the composition is one fused loop over x.
    auto check = [&](const Tensor& got, auto formula) {
      CHECK(got.dtype() == d);
      check_against(got, {x}, [&](double a, double) { return formula(2 * a - 1); }, tol);
    };
    const auto y = x * 2 - 1;
    check(gelu(y), [&](double a) { return a * 0.5 * (1 + std::erf(a * sqrt_half)); });
    check(gelu_tanh(y),
          [&](double a) { return 0.5 * a * (1 + std::tanh(tanh_scale * (a + 0.044715 * a * a * a))); });
    check(elu(y, 0.5), [](double a) { return a > 0 ? a : 0.5 * std::expm1(a); });
    check(selu(y), [](double a) { return 1.0507009873554805 * (a > 0 ? a : 1.6732632423543772 * std::expm1(a)); });
    check(swish(y, 2), [](double a) { return a / (1 + std::exp(-2 * a)); });
    check(silu(y), [](double a) { return a / (1 + std::exp(-a)); });
    check(leaky_relu(y, 0.1), [](double a) { return a > 0 ? a : 0.1 * a; });
    check(activation(y, "gelu"), [&](double a) { return a * 0.5 * (1 + std::erf(a * sqrt_half)); });
  }
  // Large and NaN inputs: elu's unused branch does not overflow, NaN stays NaN.
  const Tensor edges = array<float>({-1000, 1000, std::numeric_limits<float>::quiet_NaN()});
  for (const Tensor& got : {Tensor(elu(edges)), Tensor(selu(edges)), Tensor(gelu(edges)), Tensor(silu(edges)),
                            Tensor(leaky_relu(edges, 0.5))}) {
    const auto v = got.to_vector<float>();
    CHECK(std::isfinite(v[0]));
    CHECK(v[1] >= 1000);
    CHECK(std::isnan(v[2]));
  }
  // A composition holds copies of its operands, scalars included: evaluated
  // after the function that built it has returned and its tensor is gone,
  // it still computes its own values (it once held its slope by reference
  // and computed with whatever the stack held later).
  auto built_elsewhere = [] {
    const Tensor y = array<float>({-2, 0, 1});
    const double slope = 0.1, alpha = 0.5;
    return std::pair{leaky_relu(y * 2 + 1, slope), elu(y, alpha)};
  };
  auto [leaky, exponential] = built_elsewhere();
  [] {  // writes over the stack the lambda ran on
    volatile double stack[64];
    for (auto& d : stack) d = 7.0;
  }();
  CHECK(Tensor(leaky).to_vector<float>() == std::vector<float>{-0.3f, 1, 3});
  CHECK(Tensor(exponential).to_vector<float>()[0] == doctest::Approx(0.5 * std::expm1(-2.0)));
}

// float32 exp, tanh and sigmoid are hybra's polynomials (backend/cpu/vector_math.hpp)
// in builds for AVX2 and FMA, glibc's otherwise: both are bounded here over the
// whole float range, and hybra's functions are checked on their own too.
TEST_CASE("float32 exp, tanh and sigmoid: a few units in the last place everywhere, limits, NaN, subnormals") {
  namespace f32 = backend::cpu::float32;
  // Every 4093rd bit pattern (NaNs, infinities and subnormals included), then
  // a dense run over [-20, 20], where the functions are not yet constant.
  std::vector<float> xs;
  for (std::uint64_t b = 0; b < (std::uint64_t{1} << 32); b += 4093) xs.push_back(std::bit_cast<float>(std::uint32_t(b)));
  for (int i = -(1 << 18); i <= (1 << 18); ++i) xs.push_back(20.0f * static_cast<float>(i) / (1 << 18));
  const Tensor x = array<float>(xs);
  // |got - want| in units of the last place of float32 at want (subnormals: 2^-149)
  auto ulps = [](float got, double want) {
    if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got) ? 0.0 : 1e9;
    if (std::abs(want) > std::numeric_limits<float>::max()) return std::isinf(got) && (got > 0) == (want > 0) ? 0.0 : 1e9;
    const double unit = std::abs(want) < std::numeric_limits<float>::min()
                            ? std::ldexp(1.0, -149)
                            : std::ldexp(1.0, std::ilogb(want) - 23);
    return std::abs(got - want) / unit;
  };
  // Where the op is glibc's, it is held to libmvec's stated accuracy, 4 ulps:
  // on a Zen 5 EPYC its SSE expf is 2.73 ulps off at x = 14.903.
  auto op_bound = [](double hybras) { return f32::used_by_ops ? hybras : 4.0; };
  struct Case {
    const char* name;
    Tensor op;
    float (*hybras)(float);
    double (*reference)(double);
    double bound;  // ulps; hybra's measured over every float: 1.00, 2.66, 2.83
    bool subnormal_may_be_zero;
  };
  const Case cases[] = {
      {"exp", exp(x), f32::exp, [](double a) { return std::exp(a); }, 1.5, false},
      {"tanh", tanh(x), f32::tanh, [](double a) { return std::tanh(a); }, 3.0, false},
      {"sigmoid", sigmoid(x), f32::sigmoid, [](double a) { return 1 / (1 + std::exp(-a)); }, 3.0, true},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const auto op = c.op.to_vector<float>();
    std::vector<float> own(xs.size());
    for (std::size_t i = 0; i < xs.size(); ++i) own[i] = c.hybras(xs[i]);
    for (const std::vector<float>* got : {&op, static_cast<const std::vector<float>*>(&own)}) {
      double worst = 0;
      float worst_at = 0;
      for (std::size_t i = 0; i < xs.size(); ++i) {
        const double want = c.reference(xs[i]);
        const bool zero_allowed = c.subnormal_may_be_zero && std::abs(want) < std::numeric_limits<float>::min();
        const double error = zero_allowed && (*got)[i] == 0 ? 0 : ulps((*got)[i], want);
        if (error > worst) worst = error, worst_at = xs[i];
      }
      INFO((got == &op ? "the op" : "hybra's function"), ", worst at x = ", worst_at);
      CHECK(worst <= (got == &op ? op_bound(c.bound) : c.bound));
    }
    if (f32::used_by_ops) {  // the vectorised loop computes what the scalar function does
      bool same = true;
      for (std::size_t i = 0; i < xs.size(); ++i)
        same &= std::bit_cast<std::uint32_t>(op[i]) == std::bit_cast<std::uint32_t>(own[i]) ||
                (std::isnan(op[i]) && std::isnan(own[i]));
      CHECK(same);
    }
  }
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> edges{-inf, inf, 88.72f, 88.73f, -103.0f, -104.0f, -0.0f};
  std::vector<float> e, t, s;
  for (float v : edges) e.push_back(f32::exp(v)), t.push_back(f32::tanh(v)), s.push_back(f32::sigmoid(v));
  CHECK((e[0] == 0 && e[1] == inf && e[3] == inf && e[5] == 0 && e[6] == 1));
  CHECK(ulps(e[2], std::exp(double(88.72f))) <= 1.5);  // just below overflow
  CHECK(e[4] > 0);  // a subnormal result, not flushed
  CHECK(ulps(e[4], std::exp(-103.0)) <= 1);
  CHECK(t == std::vector<float>{-1, 1, 1, 1, -1, -1, 0});
  CHECK(std::signbit(t[6]));  // tanh(-0) = -0
  CHECK(s == std::vector<float>{0, 1, 1, 1, 0, 0, 0.5f});
}

TEST_CASE("softplus is exact where exp overflows or 1 + e^x rounds to 1, and MXNet's softrelu is softplus") {
  const Tensor x = array<float>({-200, -30, 0, 30, 88.8f, 200});
  const auto y = Tensor(softplus(x)).to_vector<float>();
  CHECK(y[0] == doctest::Approx(std::exp(-200.0)).epsilon(1e-5));
  CHECK(y[1] == doctest::Approx(std::exp(-30.0)).epsilon(1e-5));
  CHECK(y[2] == doctest::Approx(std::log(2.0)).epsilon(1e-6));
  CHECK(y[3] == doctest::Approx(30).epsilon(1e-6));
  CHECK(y[4] == doctest::Approx(88.8).epsilon(1e-6));
  CHECK(y[5] == 200);
  CHECK(Tensor(activation(x, "softrelu")).to_vector<float>() == y);
}

TEST_CASE("every binary op matches its reference in every dtype") {
  for (DType d : all_dtypes) {
    CAPTURE(name(d));
    double lo = d == DType::uint8 ? 0 : -5;
    Tensor a = sample({3, 41}, d, lo, 5, 21);
    Tensor b = sample({3, 41}, d, lo, 5, 22);
    Tensor nz = sample({3, 41}, d, 1, 5, 23);
    auto wrap = [&](double v) { return d == DType::uint8 ? std::fmod(std::fmod(v, 256) + 256, 256) : v; };
    check_against(a + b, {a, b}, [&](double x, double y) { return wrap(x + y); }, 0);
    check_against(a - b, {a, b}, [&](double x, double y) { return wrap(x - y); }, 0);
    check_against(a * b, {a, b}, [&](double x, double y) { return wrap(x * y); }, 0);
    check_against(a / nz, {a, nz}, [](double x, double y) { return x / y; }, tol_for(is_floating(d) ? d : DType::float32));
    check_against(a < b, {a, b}, [](double x, double y) { return double(x < y); }, 0);
    check_against(a <= b, {a, b}, [](double x, double y) { return double(x <= y); }, 0);
    check_against(a > b, {a, b}, [](double x, double y) { return double(x > y); }, 0);
    check_against(a >= b, {a, b}, [](double x, double y) { return double(x >= y); }, 0);
    check_against(a == b, {a, b}, [](double x, double y) { return double(x == y); }, 0);
    check_against(a != b, {a, b}, [](double x, double y) { return double(x != y); }, 0);
    check_against(maximum(a, b), {a, b}, [](double x, double y) { return std::max(x, y); }, 0);
    check_against(minimum(a, b), {a, b}, [](double x, double y) { return std::min(x, y); }, 0);
    Tensor small = sample({3, 41}, d, is_floating(d) ? 0.5 : 0, 3, 24);
    Tensor ex = sample({3, 41}, d, 0, 3, 25);
    check_against(pow(small, ex), {small, ex}, [](double x, double y) { return std::pow(x, y); }, tol_for(d));
    Tensor chosen = where(a > b, a, b);
    check_against(chosen, {a, b}, [](double x, double y) { return x > y ? x : y; }, 0);
    CHECK(Tensor(a + b).dtype() == d);
  }
}

TEST_CASE("integer edge cases: wrap-around, true division, powers") {
  auto big = full({2}, std::numeric_limits<std::int32_t>::max(), DType::int32);
  CHECK(Tensor(big + 1).to_vector<std::int64_t>() == std::vector<std::int64_t>{INT32_MIN, INT32_MIN});
  auto minimum_int = full({1}, std::numeric_limits<std::int32_t>::min(), DType::int32);
  CHECK(Tensor(abs(minimum_int)).item<std::int64_t>() == INT32_MIN);
  CHECK(Tensor(-minimum_int).item<std::int64_t>() == INT32_MIN);
  auto q = Tensor(array({7, -7, 1}) / array({2, 2, 0}));
  CHECK(q.dtype() == DType::float32);
  CHECK(q.to_vector<float>() == std::vector<float>{3.5f, -3.5f, INFINITY});
  CHECK(Tensor(pow(array({2, -1, 3, 5}), array({10, 3, 0, -1}))).to_vector<int>() == std::vector<int>{1024, -1, 1, 0});
  CHECK(Tensor(array({std::uint8_t{250}}) + std::uint8_t{10}).item<int>() == 4);
}

TEST_CASE("NaN propagates through relu, maximum and minimum") {
  auto n = array({std::nanf(""), 1.f});
  auto one = array({1.f, std::nanf("")});
  auto r = Tensor(relu(n)).to_vector<float>();
  CHECK(std::isnan(r[0]));
  auto mx = Tensor(maximum(n, one)).to_vector<float>(), mn = Tensor(minimum(one, n)).to_vector<float>();
  CHECK((std::isnan(mx[0]) && std::isnan(mx[1])));
  CHECK((std::isnan(mn[0]) && std::isnan(mn[1])));
}

TEST_CASE("scalars of any arithmetic type follow the weak-scalar rule") {
  auto f = ones({2});
  auto i = ones({2}, DType::int32);
  auto u8 = ones({2}, DType::uint8);
  CHECK(Tensor(f * 2.0).dtype() == DType::float32);
  CHECK(Tensor(f * 2).dtype() == DType::float32);
  CHECK(Tensor(i * 2.5).dtype() == DType::float32);
  CHECK(Tensor(i * 2.5).to_vector<float>() == std::vector<float>{2.5f, 2.5f});
  CHECK(Tensor(i * 3L).dtype() == DType::int32);
  CHECK(Tensor(u8 + 1).dtype() == DType::uint8);
  CHECK(Tensor(u8 + 'a').to_vector<int>() == std::vector<int>{98, 98});
  CHECK(Tensor(2 - f).to_vector<float>() == std::vector<float>{1, 1});
  CHECK(Tensor(1.0 / (f + 1)).to_vector<float>() == std::vector<float>{0.5f, 0.5f});
  CHECK(Tensor(f + true).to_vector<float>() == std::vector<float>{2, 2});
  CHECK(Tensor(where(f > 0, 1, 2)).dtype() == DType::int32);
  CHECK(Tensor(where(f > 0, 1.5, 2)).to_vector<double>() == std::vector<double>{1.5, 1.5});
  // Node by node (mixed dtypes, autograd) the same rule gives the same dtype and values.
  auto same = [](const auto& e) {
    INFO(to_string(e));
    Tensor fused = e, unfused = eval_unfused(e);
    CHECK(fused.dtype() == unfused.dtype());
    CHECK(fused.to_vector<double>() == unfused.to_vector<double>());
  };
  same(i * 2.5);
  same(i * 3L);
  same(u8 + 300);  // the int scalar wraps as a uint8
  same(2 - f);
  same(1.0 / (i + 1));
  same(where(f > 0, 1.5, 2));
  same(where(i, u8, 7));
}

TEST_CASE("tensors of different dtypes promote per node") {
  auto i = array({1, 2, 3});
  auto f = array({0.5f, 0.5f, 0.5f});
  auto d = array({1.0, 1.0, 1.0});
  auto u8 = array({std::uint8_t{1}, std::uint8_t{2}, std::uint8_t{3}});
  Tensor r = (i + f) * d;
  CHECK(r.dtype() == DType::float64);
  CHECK(r.to_vector<double>() == std::vector<double>{1.5, 2.5, 3.5});
  // Per-node: the integer sum happens in int32 before meeting the float.
  Tensor s = (u8 + i) / 2 + f;
  CHECK(s.dtype() == DType::float32);
  CHECK(s.to_vector<float>() == std::vector<float>{1.5f, 2.5f, 3.5f});
  // A float condition keeps its truth when the values are integers.
  Tensor w = where(array({0.25f, 0.f, -2.f}), i, u8 * 10);
  CHECK(w.dtype() == DType::int32);
  CHECK(w.to_vector<int>() == std::vector<int>{1, 20, 3});
  // A scalar in a mixed-dtype tree adapts to its own node: 300 wraps as a uint8.
  Tensor m = (u8 + 300) * f;
  CHECK(m.dtype() == DType::float32);
  CHECK(m.to_vector<float>() == std::vector<float>{22.5f, 23, 23.5f});
}

TEST_CASE("broadcasting edge cases") {
  auto col = arange(3).astype(DType::float64);
  Tensor outer = col.view({3, 1}, {1, 1}, 0) * arange(4).astype(DType::float64).view({1, 4}, {4, 1}, 0);
  CHECK(outer.shape() == Shape{3, 4});
  CHECK(outer.to_vector<double>() == std::vector<double>{0, 0, 0, 0, 0, 1, 2, 3, 0, 2, 4, 6});
  Tensor rows = ones({2, 3}) + arange(3);
  CHECK(rows.to_vector<float>() == std::vector<float>{1, 2, 3, 1, 2, 3});
  Tensor with_scalar_tensor = ones({2, 3}) * full({}, 4);
  CHECK(with_scalar_tensor.to_vector<float>() == std::vector<float>(6, 4));
  Tensor zero_d = full({}, 2) + full({}, 3);
  CHECK(zero_d.ndim() == 0);
  CHECK(zero_d.item<float>() == 5);
  Tensor empty = zeros({0, 3}) + ones({3});
  CHECK(empty.shape() == Shape{0, 3});
  CHECK(Tensor(zeros({0}) + ones({1})).shape() == Shape{0});
  Tensor high = ones({2, 1, 3, 1}) + ones({1, 4});
  CHECK(high.shape() == Shape{2, 1, 3, 4});
  CHECK_THROWS_WITH_AS(Tensor(ones({2, 3}) * ones({4})),
                       doctest::Contains("multiply: shapes (2, 3) and (4,) cannot be broadcast together"), ShapeError);
  CHECK_THROWS_WITH_AS(Tensor(relu(ones({3}) + ones({2, 2}))), doctest::Contains("add: shapes (3,) and (2, 2)"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(Tensor(zeros({0}) + ones({2})), doctest::Contains("add"), ShapeError);
}

TEST_CASE("fused equals unfused, on contiguous, broadcast and strided operands") {
  Generator g(3);
  auto a = random_normal({64, 50}, 0, 1, DType::float32, cpu(), g);
  auto b = random_normal({64, 50}, 0, 1, DType::float32, cpu(), g);
  auto c = random_normal({50}, 0, 1, DType::float32, cpu(), g);
  auto bt = b.view({50, 64}, {1, 50}, 0);  // b's storage seen as a transposed (50, 64)
  // Arithmetic is bit-identical. Unfused nodes run the run-time fused loop
  // (expr/elementwise_op.hpp), so exp/tanh/log/pow may run the vector (libmvec)
  // variant in one evaluation and the scalar one in the other (they differ by
  // up to 2 ulp): those compare within float accuracy.
  auto check = [](const auto& e, double abs_tol) {
    INFO(to_string(e));
    Tensor fused = e;
    Tensor unfused = eval_unfused(e);
    CHECK(fused.shape() == unfused.shape());
    CHECK(fused.dtype() == unfused.dtype());
    auto f = fused.to_vector<float>(), u = unfused.to_vector<float>();
    REQUIRE(f.size() == u.size());
    double worst = 0;
    for (std::size_t i = 0; i < f.size(); ++i) worst = std::max(worst, double(std::abs(f[i] - u[i])));
    if (abs_tol == 0) CHECK(f == u);
    else CHECK(worst <= abs_tol);
  };
  check(relu(a * b + 2) * c - 1, 0);
  check(sigmoid(tanh(a * b + c) * exp(-a)) + b, 1e-6);
  check(sigmoid(tanh(a * b + a) * exp(-a)) + b, 1e-6);  // all flat
  check(where(a > c, maximum(a, b), minimum(b, c) / 3), 0);
  check(pow(abs(a) + 1, 2) - sqrt(abs(b)) + log(abs(c) + 1), 1e-5);
  check(a.view({50, 64}, {1, 50}, 0) * bt + 1, 0);
  check(a.view({32, 50}, {100, 1}, 0) + c, 0);  // every second row
  // Scalars: weak in every operand position, a scalar condition true when non-zero.
  check(where(a > 0, a, 2.5) * 2, 0);
  check(where(0.5, a, c) - 1, 0);
  check(3 - relu(2.f * a), 0);
  // Rows longer than the strided walk's chunk (512 elements), over three
  // chunks: a column broadcast along them and a transposed view gathered,
  // the others read in place, and a transposed output scattered.
  auto p = random_normal({3, 1300}, 0, 1, DType::float32, cpu(), g);
  auto q = random_normal({1300, 3}, 0, 1, DType::float32, cpu(), g);
  auto row = random_normal({1300}, 0, 1, DType::float32, cpu(), g);
  auto col = random_normal({3, 1}, 0, 1, DType::float32, cpu(), g);
  check(p * row + col, 0);
  check(q.view({3, 1300}, {1, 3}, 0) * p - col, 0);
  Tensor out = zeros({1300, 3});
  Tensor out_t = out.view({3, 1300}, {1, 3}, 0);
  out_t.assign(p * row + col);
  CHECK(out_t.contiguous().to_vector<float>() == eval_unfused(p * row + col).to_vector<float>());
}

TEST_CASE("large expressions split across threads give the same result") {
  const int threads = num_threads();
  Generator g(9);
  auto a = random_normal({3, 70001}, 0, 1, DType::float32, cpu(), g);
  auto row = random_normal({70001}, 0, 1, DType::float32, cpu(), g);
  auto col = random_normal({3, 1}, 0, 1, DType::float32, cpu(), g);
  auto expr_flat = [&] { return Tensor(tanh(a * 3 + 1) * a); };
  auto expr_strided = [&] { return Tensor(exp(-abs(a.view({70001, 3}, {1, 70001}, 0))) + 1); };
  auto expr_broadcast = [&] { return Tensor(a * row + col); };
  set_num_threads(1);
  auto f1 = expr_flat().to_vector<float>(), s1 = expr_strided().to_vector<float>(), b1 = expr_broadcast().to_vector<float>();
  set_num_threads(2);
  auto f2 = expr_flat().to_vector<float>(), s2 = expr_strided().to_vector<float>(), b2 = expr_broadcast().to_vector<float>();
  set_num_threads(threads);
  CHECK(f1 == f2);
  CHECK(s1 == s2);
  CHECK(b1 == b2);
  auto av = a.to_vector<float>();
  CHECK(s1[1] == doctest::Approx(std::exp(-std::abs(av[70001])) + 1));
}

TEST_CASE("assign writes in place, broadcasts, converts, and survives aliasing") {
  auto t = zeros({2, 3});
  auto keep = t;
  t.assign(arange(3) + 1);
  CHECK(keep.to_vector<float>() == std::vector<float>{1, 2, 3, 1, 2, 3});
  auto i = zeros({3}, DType::int32);
  i.assign(array({1.9f, -1.9f, 2.f}) * 2);
  CHECK(i.to_vector<int>() == std::vector<int>{3, -3, 4});
  // Writing a matrix from its own transpose must read the original values.
  auto m = arange(4).astype(DType::float64).view({2, 2}, {2, 1}, 0);
  m.assign(m.view({2, 2}, {1, 2}, 0) + 0);
  CHECK(m.to_vector<double>() == std::vector<double>{0, 2, 1, 3});
  // Writing into a strided view touches only the view's elements.
  auto base = zeros({4});
  base.view({2}, {2}, 1).assign(ones({2}) * 7);
  CHECK(base.to_vector<float>() == std::vector<float>{0, 7, 0, 7});
  CHECK_THROWS_WITH_AS(t.assign(ones({4})), doctest::Contains("assign"), ShapeError);
  CHECK_THROWS_WITH_AS(t.assign(ones({2, 2, 3})), doctest::Contains("(2, 2, 3) cannot be written into shape (2, 3)"),
                       ShapeError);
  CHECK(keep.to_vector<float>() == std::vector<float>{1, 2, 3, 1, 2, 3});  // nothing corrupted
}

TEST_CASE("the typed graph prints from the expression and from its C++ type") {
  auto a = ones({1, 2});
  auto b = ones({1, 2});
  CHECK(to_string(relu(a * b + 2)) == "relu((a * b) + 2)");
  CHECK(type_string(relu(a * b + 2)) == "relu((Tensor * Tensor) + int)");
  CHECK(to_string(-(a + a) / 2.5) == "-(a + a) / 2.5");
  CHECK(to_string(where(a > b, a, maximum(b, 0.5f))) == "where(a > b, a, maximum(b, 0.5))");
  CHECK(type_string(sigmoid(a) * 2.0) == "sigmoid(Tensor) * double");
  std::ostringstream os;
  os << (a * b + 2);
  CHECK(os.str() == "[[3. 3.]]\n<Tensor 1x2 @cpu(0)>");
}

TEST_CASE("bad operands: empty handles and devices are reported, nothing is corrupted") {
  Tensor empty;
  CHECK_THROWS_WITH_AS(Tensor(empty + 1), doctest::Contains("empty"), ValueError);
  auto a = ones({2}, DType::float32, cpu(0));
  auto b = ones({2}, DType::float32, cpu(1));
  CHECK_THROWS_WITH_AS(Tensor(a + b), doctest::Contains("operands live on cpu(0) and cpu(1)"), DeviceError);
  CHECK(a.to_vector<float>() == std::vector<float>{1, 1});
}

TEST_CASE("clip and relu6: limits in every dtype, NaN kept, one fused pass") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto clipped = Tensor(clip(array<float>({-3, -1, 0.5f, 2, 7, nan}), -1, 2)).to_vector<float>();
  CHECK(std::vector<float>(clipped.begin(), clipped.end() - 1) == std::vector<float>{-1, -1, 0.5f, 2, 2});
  CHECK(std::isnan(clipped.back()));
  CHECK(Tensor(relu6(array<float>({-1, 3, 9}))).to_vector<float>() == std::vector<float>{0, 3, 6});
  // The bounds are weak scalars: an integer tensor stays integer, and a float bound does not widen float32.
  const Tensor ints = clip(array<int>({-5, 5, 50}), 0, 10);
  CHECK(ints.dtype() == DType::int32);
  CHECK(ints.to_vector<int>() == std::vector<int>{0, 5, 10});
  CHECK(Tensor(clip(array<float>({1}), 0.0, 0.5)).dtype() == DType::float32);
}
