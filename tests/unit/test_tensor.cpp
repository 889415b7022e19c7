// Tensors: dtypes and promotion, shapes, creation, random numbers, printing,
// reading back, and the errors bad input must produce.
#include <doctest/doctest.h>

#include <cmath>
#include <hybra/eager.hpp>
#include <sstream>
#include <type_traits>

using namespace hybra;

namespace {
std::string printed(const Tensor& t) {
  std::ostringstream os;
  os << t;
  return os.str();
}
}  // namespace

// A Shape never becomes a Tensor by itself: `std::cout << t.shape()` once
// printed an uninitialised tensor of that shape instead of failing to compile.
static_assert(!std::is_convertible_v<Shape, Tensor>);
static_assert(std::is_constructible_v<Tensor, Shape, DType>);

TEST_CASE("run-time promotion agrees with the compile-time rule and is symmetric") {
  const DType all[] = {DType::float32, DType::float64, DType::int32, DType::int64, DType::uint8};
  for (auto a : all)
    for (auto b : all) {
      CHECK(promote_types(a, b) == promote_types(b, a));
      CHECK(promote_types(a, a) == a);
    }
  CHECK(promote_types(DType::uint8, DType::int32) == DType::int32);
  CHECK(promote_types(DType::int32, DType::int64) == DType::int64);
  CHECK(promote_types(DType::int64, DType::float32) == DType::float32);
  CHECK(promote_types(DType::float32, DType::float64) == DType::float64);
  static_assert(std::is_same_v<promote_t<std::int32_t, false, double, true>, float>);
  static_assert(std::is_same_v<promote_t<float, false, double, true>, float>);
  static_assert(std::is_same_v<promote_t<std::uint8_t, false, int, true>, std::uint8_t>);
}

TEST_CASE("shapes: element counts, overflow and negative extents") {
  CHECK(checked_numel({}) == 1);
  CHECK(checked_numel({2, 0, 5}) == 0);
  CHECK(checked_numel({2, 3, 4}) == 24);
  CHECK_THROWS_WITH_AS(checked_numel({3, -1}), doctest::Contains("negative extent in shape (3, -1)"), ShapeError);
  CHECK_THROWS_WITH_AS(Tensor(Shape{1LL << 32, 1LL << 32}), doctest::Contains("more elements than fit in int64"),
                       ShapeError);
  CHECK_THROWS_AS(zeros({-2}), ShapeError);
}

TEST_CASE("out of memory is an exception naming the shape, not a crash") {
  CHECK_THROWS_WITH_AS(Tensor(Shape{1LL << 40, 1LL << 10}, DType::float32),
                       doctest::Contains("shape (1099511627776, 1024)"), OutOfMemory);
  CHECK_THROWS_AS(Tensor(Shape{1LL << 62}, DType::float64), OutOfMemory);
  CHECK(ones({2}).to_vector<float>() == std::vector<float>{1, 1});
}

TEST_CASE("the host keeps large freed blocks for the next tensor they fit; small ones go back to malloc") {
  waitall();  // no op of an earlier test frees a block while this one counts them
  auto& memory = backend::cpu::HostMemory::instance();
  memory.empty();
  const std::size_t mib = std::size_t{1} << 20;
  const void* kept = nullptr;
  {
    Tensor big(Shape{1 << 20}, DType::float32);  // 4 MiB
    kept = big.storage()->data();
  }
#if defined(__SANITIZE_ADDRESS__)
  CHECK(memory.kept_bytes() == 0);  // nothing kept: a use after free stays visible
#else
  CHECK(memory.kept_bytes() == 4 * mib);
  { Tensor small(Shape{1000}, DType::float32); }
  CHECK(memory.kept_bytes() == 4 * mib);
  {
    Tensor half(Shape{1 << 19}, DType::float32);  // 2 MiB: the kept block would waste half of it
    CHECK(half.storage()->data() != kept);
    Tensor larger(Shape{(1 << 20) + 16}, DType::float32);  // does not fit
    CHECK(larger.storage()->data() != kept);
    CHECK(memory.kept_bytes() == 4 * mib);
    Tensor close(Shape{(1 << 20) - (1 << 16)}, DType::float32);  // 3.75 MiB: fits, wasting under an eighth
    CHECK(close.storage()->data() == kept);
    CHECK(memory.kept_bytes() == 0);
  }
  CHECK(memory.kept_bytes() == 10 * mib + 64);  // the 4 MiB block kept whole again
#endif
  memory.empty();
  CHECK(memory.kept_bytes() == 0);
  BlockCache<int> cache;  // the rule the GPU's allocator shares
  cache.keep(1, 1000);
  cache.keep(2, 1100);
  cache.keep(3, 5000);
  CHECK(cache.take(990)->pointer == 1);
  CHECK(cache.take(990)->pointer == 2);  // 110 bytes over: under an eighth of 990
  CHECK(!cache.take(2000));
  CHECK(cache.take_largest()->bytes == 5000);
  CHECK(cache.empty());
}

TEST_CASE("creation: zeros, ones, full, arange, array") {
  CHECK(zeros({2, 2}).to_vector<float>() == std::vector<float>(4, 0.f));
  CHECK(ones({3}, DType::int64).to_vector<std::int64_t>() == std::vector<std::int64_t>{1, 1, 1});
  CHECK(full({2}, 7.5, DType::float64).to_vector<double>() == std::vector<double>{7.5, 7.5});
  CHECK(full({}, 3).ndim() == 0);
  CHECK(full({}, 3).item<float>() == 3.f);
  CHECK(arange(5).to_vector<int>() == std::vector<int>{0, 1, 2, 3, 4});
  CHECK(arange(1, 2, 0.25).to_vector<double>() == std::vector<double>{1, 1.25, 1.5, 1.75});
  CHECK(arange(3, 0, -1, DType::int32).to_vector<int>() == std::vector<int>{3, 2, 1});
  CHECK(arange(3, 3).size() == 0);
  CHECK_THROWS_WITH_AS(arange(0, 1, 0), doctest::Contains("arange"), ValueError);
  auto m = array({{1, 2, 3}, {4, 5, 6}});
  CHECK(m.dtype() == DType::int32);
  CHECK(m.shape() == Shape{2, 3});
  CHECK(array(std::vector<double>{1, 2, 3, 4}, {2, 2}).shape() == Shape{2, 2});
  CHECK_THROWS_WITH_AS(array(std::vector<float>{1, 2, 3}, {2, 2}), doctest::Contains("3 values do not fill shape (2, 2)"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(array({{1.f, 2.f}, {3.f}}), doctest::Contains("ragged"), ShapeError);
  CHECK(array({std::uint8_t{200}, std::uint8_t{7}}).dtype() == DType::uint8);
}

TEST_CASE("random: a seed gives the same numbers everywhere, for any thread count") {
  Generator g1(42), g2(42), g3(43);
  auto a = random_uniform({1000}, 0, 1, DType::float32, cpu(), g1);
  auto b = random_uniform({1000}, 0, 1, DType::float32, cpu(), g2);
  auto c = random_uniform({1000}, 0, 1, DType::float32, cpu(), g3);
  CHECK(a.to_vector<float>() == b.to_vector<float>());
  CHECK(a.to_vector<float>() != c.to_vector<float>());
  // Golden values: Philox4x32-10 with integer-exact conversion to [0, 1).
  Generator golden(0);
  auto u = random_uniform({3}, 0, 1, DType::float64, cpu(), golden).to_vector<double>();
  auto w = Generator(0).block(0);
  CHECK(u[0] == Generator::to_double(w[0], w[1]));
  CHECK(u[1] == Generator::to_double(w[2], w[3]));
  CHECK(Generator(0).block(0) == std::array<std::uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});

  // The second draw continues the stream instead of repeating it.
  Generator g(7);
  auto first = random_normal({64}, 0, 1, DType::float32, cpu(), g).to_vector<float>();
  auto second = random_normal({64}, 0, 1, DType::float32, cpu(), g).to_vector<float>();
  CHECK(first != second);

  const int threads = num_threads();
  Generator gp(5), gs(5);
  set_num_threads(2);
  auto parallel = random_normal({1 << 18}, 0, 1, DType::float32, cpu(), gp).to_vector<float>();
  set_num_threads(1);
  auto serial = random_normal({1 << 18}, 0, 1, DType::float32, cpu(), gs).to_vector<float>();
  set_num_threads(threads);
  CHECK(parallel == serial);
}

TEST_CASE("random: distributions have the right range and moments") {
  Generator g(1);
  auto u = random_uniform({100000}, -2, 3, DType::float32, cpu(), g).to_vector<float>();
  double sum = 0;
  for (float x : u) {
    REQUIRE(x >= -2.f);
    REQUIRE(x < 3.f);
    sum += x;
  }
  CHECK(sum / u.size() == doctest::Approx(0.5).epsilon(0.02));
  auto n = random_normal({100001}, 1, 2, DType::float64, cpu(), g).to_vector<double>();
  double m = 0, v = 0;
  for (double x : n) m += x;
  m /= n.size();
  for (double x : n) v += (x - m) * (x - m);
  CHECK(m == doctest::Approx(1).epsilon(0.03));
  CHECK(std::sqrt(v / n.size()) == doctest::Approx(2).epsilon(0.02));
  CHECK_THROWS_WITH_AS(random_uniform({2}, 1, 1), doctest::Contains("random_uniform"), ValueError);
  CHECK_THROWS_WITH_AS(random_normal({2}, 0, 1, DType::int32), doctest::Contains("random_normal: dtype must be float"),
                       DTypeError);
}

TEST_CASE("printing follows NDArray's style with shape, dtype and device") {
  CHECK(printed(full({1, 2}, 3)) == "[[3. 3.]]\n<Tensor 1x2 @cpu(0)>");
  CHECK(printed(array({1, -2})) == "[1 -2]\n<Tensor 2 int32 @cpu(0)>");
  CHECK(printed(full({}, 0.5, DType::float64)) == "0.5\n<Tensor () float64 @cpu(0)>");
  CHECK(printed(zeros({0, 3})) == "[]\n<Tensor 0x3 @cpu(0)>");
  CHECK(printed(array({{1.5f, 2.f}, {std::nanf(""), -INFINITY}})) == "[[1.5 2.]\n [nan -inf]]\n<Tensor 2x2 @cpu(0)>");
  CHECK(printed(array({std::uint8_t{255}})) == "[255]\n<Tensor 1 uint8 @cpu(0)>");
  auto big = printed(arange(2000));
  CHECK(big.find("[0. 1. 2. ... 1997. 1998. 1999.]") == 0);
  CHECK(printed(Tensor{}) == "<Tensor empty handle>");
}

TEST_CASE("reading back: to_vector converts, item needs one element, data checks dtype and layout") {
  auto t = array({1.5f, 2.5f});
  CHECK(t.to_vector<int>() == std::vector<int>{1, 2});
  CHECK(t.to_vector<double>() == std::vector<double>{1.5, 2.5});
  CHECK(full({1, 1}, 4).item<int>() == 4);
  CHECK_THROWS_WITH_AS(t.item<float>(), doctest::Contains("item: tensor of shape (2,) has 2 elements"), ShapeError);
  CHECK(t.data<float>()[1] == 2.5f);
  CHECK_THROWS_WITH_AS(t.data<double>(), doctest::Contains("data<float64>: tensor has dtype float32"), DTypeError);
  auto m = arange(6).astype(DType::float64);
  auto transposed = Tensor(m).view({3, 2}, {1, 3}, 0);  // a (2, 3) matrix seen transposed
  CHECK_FALSE(transposed.is_contiguous());
  CHECK_THROWS_WITH_AS(transposed.data<double>(), doctest::Contains("non-contiguous view"), ValueError);
  CHECK(transposed.to_vector<double>() == std::vector<double>{0, 3, 1, 4, 2, 5});
  CHECK(transposed.contiguous().is_contiguous());
  CHECK_THROWS_WITH_AS(Tensor{}.to_vector<float>(), doctest::Contains("empty (default-constructed or moved-from)"),
                       ValueError);
}

TEST_CASE("copies are deep, handles share, astype converts") {
  auto a = ones({3});
  Tensor shared = a;
  Tensor deep = a.copy();
  a.assign(a * 5);
  CHECK(shared.to_vector<float>() == std::vector<float>{5, 5, 5});
  CHECK(deep.to_vector<float>() == std::vector<float>{1, 1, 1});
  auto f = array({-1.7f, 2.9f, 300.f});
  CHECK(f.astype(DType::int32).to_vector<int>() == std::vector<int>{-1, 2, 300});
  CHECK(f.astype(DType::float64).dtype() == DType::float64);
}

TEST_CASE("devices: tags print; cuda(i) needs a GPU") {
  std::ostringstream os;
  os << cpu(1) << ' ' << cuda(0);
  CHECK(os.str() == "cpu(1) cuda(0)");
  if (backend::cuda::driver_status().gpus.empty())
    CHECK_THROWS_WITH_AS(zeros({2}, DType::float32, cuda(0)), doctest::Contains("cuda(0) is not available"), DeviceError);
  CHECK(printed(ones({1}, DType::float32, cpu(1))) == "[1.]\n<Tensor 1 @cpu(1)>");
}
