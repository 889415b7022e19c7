// The Thrust fusion path (include/hybra/expr/thrust.hpp) on Thrust's host
// backend (OpenMP; the serial C++ backend in the ThreadSanitizer build):
// values against hybra's own evaluation and reductions in every dtype,
// broadcast and view operands, NaN and empty reductions, ordering with
// hybra's ops, and the errors. Its CUDA backend runs in examples/cuda_fusion,
// which nvcc builds and a GPU runs.
#include <doctest/doctest.h>

#include <cmath>
#include <hybra/eager.hpp>
#include <hybra/expr/thrust.hpp>
#include <limits>

using namespace hybra;

namespace {

// Values of dtype d in [-3, 3] (integers rounded), the same for a seed.
Tensor thrust_operand(const Shape& shape, DType d, std::uint64_t seed) {
  Generator g(seed);
  Tensor u = random_uniform(shape, -3, 3, DType::float64, cpu(), g);
  return is_floating(d) ? u.astype(d) : Tensor(u + 3.5).astype(d) - 3;
}

// Floats to within a few roundings (the two loops may contract a * b + c
// differently), integers exactly.
void check_same_values(const Tensor& got, const Tensor& want) {
  REQUIRE(got.dtype() == want.dtype());
  REQUIRE(got.shape() == want.shape());
  const auto g = got.to_vector<double>(), w = want.to_vector<double>();
  const double tolerance = got.dtype() == DType::float32 ? 1e-6 : got.dtype() == DType::float64 ? 1e-14 : 0;
  for (std::size_t i = 0; i < g.size(); ++i) CHECK(std::abs(g[i] - w[i]) <= tolerance * std::max(1.0, std::abs(w[i])));
}

}  // namespace

TEST_CASE("Thrust path: an expression and its fused reductions equal hybra's in every dtype") {
  for (DType d : {DType::float32, DType::float64, DType::int32, DType::int64, DType::uint8}) {
    CAPTURE(d);
    Tensor a = thrust_operand({37, 29}, d, 1), b = thrust_operand({37, 29}, d, 2), c = thrust_operand({37, 29}, d, 3);
    check_same_values(with_thrust::evaluate(relu(a * b + 2) - c), Tensor(relu(a * b + 2) - c));
    check_same_values(with_thrust::sum(relu(a * b + c)), sum(relu(a * b + c)));
    check_same_values(with_thrust::max(a * b - c), max(a * b - c));
    check_same_values(with_thrust::min(a * b - c), min(a * b - c));
  }
  // An integer sum is an int64, modulo 2^64 as hybra's.
  Tensor big = full({5}, std::numeric_limits<std::int64_t>::max(), DType::int64);
  CHECK(with_thrust::sum(big + 0).item<std::int64_t>() == sum(big).item<std::int64_t>());
  CHECK(with_thrust::sum(thrust_operand({8}, DType::int32, 4) + 1).dtype() == DType::int64);
}

TEST_CASE("Thrust path: broadcast and view operands are read as the expression reads them") {
  Tensor a = thrust_operand({6, 5}, DType::float32, 5), row = thrust_operand({5}, DType::float32, 6);
  Tensor c = thrust_operand({5, 6}, DType::float32, 7);
  Tensor ct = transpose(c);  // a view: strides (1, 6)
  check_same_values(with_thrust::evaluate(a * row + ct), Tensor(a * row + ct));
  check_same_values(with_thrust::sum(a * row + ct), sum(a * row + ct));
  Tensor column = thrust_operand({6, 1}, DType::float32, 8);
  check_same_values(with_thrust::evaluate(column + row * 2.5f), Tensor(column + row * 2.5f));
}

TEST_CASE("Thrust path: assign writes into the caller's tensor, a view or another dtype through a copy") {
  Tensor a = thrust_operand({4, 6}, DType::float32, 9), b = thrust_operand({4, 6}, DType::float32, 10);
  Tensor out = zeros({4, 6});
  const void* storage = out.raw_data();
  with_thrust::assign(out, relu(a * b + 2));
  CHECK(out.raw_data() == storage);
  check_same_values(out, Tensor(relu(a * b + 2)));
  Tensor wide = zeros({4, 6}, DType::float64);
  with_thrust::assign(wide, a * b);
  check_same_values(wide, Tensor(a * b).astype(DType::float64));
  Tensor whole = zeros({6, 4});
  Tensor view = transpose(whole);  // shape (4, 6), strides (1, 4)
  with_thrust::assign(view, a - b);
  check_same_values(transpose(whole).contiguous(), Tensor(a - b));
  // Reading out's memory shifted by one: the values before the call, as hybra's assign.
  Tensor x = arange(0, 10, 1, DType::float32), y = x.copy();
  Tensor x_tail = slice(x, 0, 1, std::nullopt), y_tail = slice(y, 0, 1, std::nullopt);
  with_thrust::assign(x_tail, slice(x, 0, 0, 9) * 2);
  y_tail.assign(slice(y, 0, 0, 9) * 2);
  check_same_values(x, y);
  Tensor wrong = zeros({6, 4});
  CHECK_THROWS_WITH_AS(with_thrust::assign(wrong, a * b),
                       doctest::Contains("with_thrust::assign: the expression has shape (4, 6) but the output (6, 4)"),
                       ShapeError);
}

TEST_CASE("Thrust path: NaN wins max and min, an empty sum is 0, an empty max is refused") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = array<float>({1, nan, -7, 4}, {4});
  CHECK(std::isnan(with_thrust::max(x * 1).item<float>()));
  CHECK(std::isnan(with_thrust::min(x + 0).item<float>()));
  Tensor y = array<float>({1, -7, 4}, {3});
  CHECK(with_thrust::max(y * 2).item<float>() == 8);
  CHECK(with_thrust::min(y * 2).item<float>() == -14);
  Tensor infinite = array<float>({-std::numeric_limits<float>::infinity()}, {1});
  CHECK(with_thrust::max(infinite * 1).item<float>() == -std::numeric_limits<float>::infinity());

  Tensor empty({0, 3}, DType::float32);
  CHECK(with_thrust::evaluate(empty * 2).shape() == Shape{0, 3});
  CHECK(with_thrust::sum(empty * 2).item<float>() == 0);
  CHECK_THROWS_WITH_AS(with_thrust::max(empty * 2),
                       doctest::Contains("with_thrust::max: the expression has shape (0, 3)"), ValueError);
}

TEST_CASE("Thrust path: ordered with hybra's ops on the tensors it reads and writes") {
  Tensor x = zeros({1000});
  for (int step = 0; step < 5; ++step) {
    x.assign(x + 1);                          // a hybra op, queued
    Tensor y = with_thrust::evaluate(x * 2);  // reads x after it
    x.assign(with_thrust::evaluate(y - x));   // and hybra writes x from it
  }
  CHECK(with_thrust::sum(x + 0).item<float>() == 5000);
}

TEST_CASE("Thrust path: errors name the call and the reason") {
  Tensor f = ones({3}), i = ones({3}, DType::int32);
  CHECK_THROWS_WITH_AS(
      with_thrust::evaluate(f + i),
      doctest::Contains("with_thrust::evaluate: the expression's tensors have dtypes float32 and int32"), DTypeError);
  CHECK_THROWS_WITH_AS(with_thrust::sum(f + ones({4})), doctest::Contains("(3,)"), ShapeError);
  Tensor w = ones({3});
  w.attach_grad();
  autograd::record rec;
  CHECK_THROWS_WITH_AS(with_thrust::evaluate(w * 2), doctest::Contains("records no gradients"), ValueError);
}

TEST_SUITE("cuda fake" * doctest::skip()) {
  TEST_CASE("cuda fake: the Thrust path refuses GPU tensors in code that nvcc did not compile") {
    // hybra::cuda: Thrust's headers bring a namespace ::cuda (libcu++) that `using namespace hybra` cannot hide.
    Tensor g = ones({4}, DType::float32, hybra::cuda(0));
    CHECK_THROWS_WITH_AS(with_thrust::evaluate(g * 2), doctest::Contains("only in code that nvcc compiles"),
                         DeviceError);
    CHECK_THROWS_WITH_AS(with_thrust::sum(g * 2),
                         doctest::Contains("with_thrust::sum: the expression's tensors live on cuda(0)"), DeviceError);
    Tensor on_host = ones({4});
    CHECK_THROWS_WITH_AS(with_thrust::assign(g, on_host * 2),
                         doctest::Contains("the expression's tensors live on cpu(0) but the output on cuda(0)"),
                         DeviceError);
  }
}
