// Data parallelism on the local device pool: how split_and_load sizes and
// places the parts of a batch, and allreduce/broadcast over 1 to 5 devices
// against sums computed on plain vectors; the errors; and that both only
// queue work.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <hybra/eager.hpp>
#include <hybra/parallel/allreduce.hpp>
#include <hybra/parallel/split.hpp>
#include <memory>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "reference.hpp"

using namespace hybra;

namespace {

using Sizes = std::vector<std::int64_t>;

std::vector<Device> first_devices(int n) {
  std::vector<Device> out;
  for (int i = 0; i < n; ++i) out.push_back(cpu(i));
  return out;
}

// A (rows, 3) batch holding 0, 1, 2, ... in row-major order.
Tensor numbered_batch(std::int64_t rows, DType dtype = DType::float32) {
  return reshape(arange(0, static_cast<double>(rows * 3), 1, dtype), {rows, 3});
}

std::vector<double> row_values(std::int64_t first_row, std::int64_t rows) {
  std::vector<double> v(static_cast<std::size_t>(rows * 3));
  std::iota(v.begin(), v.end(), static_cast<double>(first_row * 3));
  return v;
}

// Checks that parts[k] holds rows [sum of earlier sizes, + sizes[k]) of a
// numbered batch and lives on devices[k].
void check_parts(const std::vector<Tensor>& parts, const Sizes& sizes, const std::vector<Device>& devices) {
  REQUIRE(parts.size() == sizes.size());
  std::int64_t first = 0;
  for (std::size_t k = 0; k < parts.size(); ++k) {
    CAPTURE(k);
    CHECK(parts[k].shape() == Shape{sizes[k], 3});
    CHECK(parts[k].device() == devices[k]);
    CHECK(parts[k].to_vector<double>() == row_values(first, sizes[k]));
    first += sizes[k];
  }
}

// One tensor per device of the given dtype, with values from `seed`, and
// their elementwise sum computed on plain vectors.
struct Contributions {
  std::vector<Tensor> tensors;
  std::vector<double> sum;
};
Contributions contributions(int devices, const Shape& shape, DType dtype, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> draw(-50, 50);  // small integers: every dtype sums them exactly
  Contributions c;
  const auto n = static_cast<std::size_t>(checked_numel(shape));
  c.sum.assign(n, 0.0);
  for (int d = 0; d < devices; ++d) {
    std::vector<double> v(n);
    for (std::size_t i = 0; i < n; ++i) {
      v[i] = dtype == DType::uint8 ? draw(gen) + 50 : draw(gen);
      c.sum[i] += v[i];
    }
    c.tensors.push_back(array(v, shape, cpu(d)).astype(dtype));
  }
  if (dtype == DType::uint8)
    for (double& s : c.sum) s = std::fmod(s, 256.0);  // uint8 arithmetic wraps
  return c;
}

}  // namespace

TEST_CASE("parallel: split_sizes, even and uneven, larger parts first") {
  CHECK(split_sizes(8, 4) == Sizes{2, 2, 2, 2});
  CHECK(split_sizes(10, 4) == Sizes{3, 3, 2, 2});
  CHECK(split_sizes(7, 3) == Sizes{3, 2, 2});
  CHECK(split_sizes(5, 1) == Sizes{5});
}

TEST_CASE("parallel: split_sizes with shares is proportional, by largest remainder") {
  const std::vector<double> three_to_one{3, 1};
  CHECK(split_sizes(8, 2, three_to_one) == Sizes{6, 2});
  CHECK(split_sizes(10, 2, three_to_one) == Sizes{8, 2});  // 7.5 and 2.5: the tie goes to the first
  const std::vector<double> equal{1, 1, 1};
  CHECK(split_sizes(4, 3, equal) == split_sizes(4, 3));     // equal shares split as no shares
  CHECK(split_sizes(100, 3, equal) == Sizes{34, 33, 33});
  const std::vector<double> rising{1, 2, 3};
  CHECK(split_sizes(10, 3, rising) == Sizes{2, 3, 5});      // 1.67, 3.33, 5: the leftover row to the 0.67
  const std::vector<double> fractional{0.5, 0.25, 0.25};
  CHECK(split_sizes(9, 3, fractional) == Sizes{5, 2, 2});   // 4.5, 2.25, 2.25
}

TEST_CASE("parallel: split_sizes gives every part a row while there are enough rows") {
  const std::vector<double> skewed{100, 1};
  CHECK(split_sizes(2, 2, skewed) == Sizes{1, 1});
  const std::vector<double> skewed3{100, 1, 1};
  CHECK(split_sizes(5, 3, skewed3) == Sizes{3, 1, 1});      // 5, 0, 0 by remainder; two rows moved
  CHECK(split_sizes(2, 4) == Sizes{1, 1, 0, 0});            // fewer rows than parts
  CHECK(split_sizes(0, 3) == Sizes{0, 0, 0});
  const std::vector<double> one_to_three{1, 3};
  CHECK(split_sizes(1, 2, one_to_three) == Sizes{0, 1});    // the faster device gets the one row
}

TEST_CASE("parallel: split_sizes sums to the batch and stays within a row of the quota") {
  std::mt19937 gen(7);
  std::uniform_real_distribution<double> share(0.05, 10);
  for (int trial = 0; trial < 2000; ++trial) {
    const std::int64_t parts = 1 + static_cast<std::int64_t>(gen() % 8);
    const std::int64_t rows = static_cast<std::int64_t>(gen() % 300);
    std::vector<double> shares(static_cast<std::size_t>(parts));
    for (double& s : shares) s = share(gen);
    const double total = std::accumulate(shares.begin(), shares.end(), 0.0);
    const Sizes sizes = split_sizes(rows, parts, shares);
    CAPTURE(rows);
    CAPTURE(parts);
    REQUIRE(std::accumulate(sizes.begin(), sizes.end(), std::int64_t{0}) == rows);
    auto quota = [&](std::size_t k) { return static_cast<double>(rows) * shares[k] / total; };
    bool every_quota_reaches_one = true;
    for (std::size_t k = 0; k < shares.size(); ++k) every_quota_reaches_one = every_quota_reaches_one && quota(k) >= 1;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      CHECK(sizes[k] >= (rows >= parts ? 1 : 0));
      if (every_quota_reaches_one) CHECK(std::abs(static_cast<double>(sizes[k]) - quota(k)) < 1);
    }
  }
}

TEST_CASE("parallel: split_data cuts views of the batch") {
  Tensor batch = numbered_batch(5);
  std::vector<Tensor> parts = split_data(batch, 2);
  check_parts(parts, {3, 2}, {cpu(0), cpu(0)});
  for (const Tensor& p : parts) CHECK(p.storage() == batch.storage());
  check_parts(split_data(batch, 2, {1, 4}), {1, 4}, {cpu(0), cpu(0)});
}

TEST_CASE("parallel: split_and_load puts one part on each device") {
  const auto devices = first_devices(3);
  SUBCASE("even") { check_parts(split_and_load(numbered_batch(9), devices), {3, 3, 3}, devices); }
  SUBCASE("uneven") { check_parts(split_and_load(numbered_batch(10), devices), {4, 3, 3}, devices); }
  SUBCASE("shares") {
    const std::vector<double> shares{2, 1, 1};
    check_parts(split_and_load(numbered_batch(12), devices, shares), {6, 3, 3}, devices);
  }
  SUBCASE("a braced list of devices and shares") {
    check_parts(split_and_load(numbered_batch(8), {cpu(2), cpu(1)}, {3, 1}), {6, 2}, {cpu(2), cpu(1)});
  }
  SUBCASE("fewer rows than devices: the last parts have no rows") {
    check_parts(split_and_load(numbered_batch(2), devices), {1, 1, 0}, devices);
  }
  SUBCASE("labels: a 1-d batch") {
    std::vector<Tensor> parts = split_and_load(arange(0, 5, 1, DType::int32), {cpu(0), cpu(1)});
    CHECK(parts[0].to_vector<int>() == std::vector<int>{0, 1, 2});
    CHECK(parts[1].to_vector<int>() == std::vector<int>{3, 4});
    CHECK(parts[1].device() == cpu(1));
  }
  SUBCASE("integers") {
    std::vector<Tensor> parts = split_and_load(numbered_batch(4, DType::int64), {cpu(0), cpu(1)});
    CHECK(parts[1].dtype() == DType::int64);
    CHECK(parts[1].to_vector<std::int64_t>() == std::vector<std::int64_t>{6, 7, 8, 9, 10, 11});
  }
}

TEST_CASE("parallel: split_and_load copies to other devices and views on the batch's own") {
  Tensor batch = numbered_batch(4, DType::float64).to(cpu(1));
  std::vector<Tensor> parts = split_and_load(batch, {cpu(0), cpu(1)});
  CHECK(parts[0].storage() != batch.storage());
  CHECK(parts[1].storage() == batch.storage());
  batch.assign(full({4, 3}, -1.0, DType::float64, cpu(1)));  // queued after the copy has read the batch
  CHECK(parts[0].to_vector<double>() == row_values(0, 2));
}

TEST_CASE("parallel: split errors name the op and the shapes") {
  Tensor batch = numbered_batch(4);
  CHECK_THROWS_WITH_AS(split_and_load(batch, std::vector<Device>{}),
                       doctest::Contains("split_and_load: no devices to split a batch of shape (4, 3) over"), ValueError);
  CHECK_THROWS_WITH_AS(split_and_load(zeros({}), {cpu(0)}),
                       doctest::Contains("split_and_load: a 0-d tensor (shape ()) has no batch axis"), ShapeError);
  CHECK_THROWS_WITH_AS(split_and_load(batch, {cpu(0), cpu(1)}, {1, 0}),
                       doctest::Contains("split_and_load: share 1 is 0 (splitting a batch of shape (4, 3) into 2 parts)"),
                       ValueError);
  CHECK_THROWS_WITH_AS(split_and_load(batch, {cpu(0), cpu(1)}, {-1, 1}), doctest::Contains("share 0 is -1"), ValueError);
  CHECK_THROWS_WITH_AS(split_and_load(batch, {cpu(0), cpu(1)}, {NAN, 1}), doctest::Contains("share 0 is nan"),
                       ValueError);
  CHECK_THROWS_WITH_AS(split_and_load(batch, {cpu(0), cpu(1)}, {1, 1, 1}),
                       doctest::Contains("split_and_load: 3 shares for 2 parts of a batch of shape (4, 3)"), ValueError);
  CHECK_THROWS_WITH_AS(split_data(batch, 0), doctest::Contains("split_data: cannot split a batch of shape (4, 3) into 0 parts"),
                       ValueError);
  CHECK_THROWS_WITH_AS(split_and_load(Tensor(), {cpu(0)}), doctest::Contains("split_and_load: the tensor is empty"),
                       ValueError);
  CHECK_THROWS_WITH_AS(split_sizes(-1, 2), doctest::Contains("split_sizes: cannot split -1 rows"), ValueError);
}

TEST_CASE("parallel: allreduce sums over 1 to 5 devices in every dtype") {
  for (DType dtype : {DType::float32, DType::float64, DType::int32, DType::int64, DType::uint8})
    for (int n = 1; n <= 5; ++n) {
      CAPTURE(name(dtype));
      CAPTURE(n);
      Contributions c = contributions(n, {7, 5}, dtype, static_cast<unsigned>(n));
      allreduce(c.tensors);
      for (int d = 0; d < n; ++d) {
        CHECK(c.tensors[d].device() == cpu(d));
        CHECK(c.tensors[d].dtype() == dtype);
        CHECK(c.tensors[d].to_vector<double>() == c.sum);
      }
    }
}

TEST_CASE("parallel: allreduce of tensors on one device, and of strided views") {
  Contributions c = contributions(3, {4, 6}, DType::float32, 11);
  c.tensors[1] = c.tensors[1].to(cpu(0));  // two of the three on cpu(0)
  allreduce(c.tensors);
  for (const Tensor& t : c.tensors) CHECK(t.to_vector<double>() == c.sum);

  Tensor a = ones({3, 2}), b = full({2, 3}, 2.0, DType::float32, cpu(1));
  std::vector<Tensor> views{transpose(b), a};  // a transposed view
  allreduce(views);
  CHECK(a.to_vector<float>() == std::vector<float>(6, 3));
  CHECK(b.to_vector<float>() == std::vector<float>(6, 3));
}

TEST_CASE("parallel: allreduce only queues: it returns before its inputs are written") {
  // The naive engine would run the gate at once, and wait forever.
  test::EngineTypeScope threaded(engine::EngineType::threaded);
  Tensor late = zeros({1000}, DType::float32, cpu(1));
  auto open = std::make_shared<std::atomic<bool>>(false);
  push_op("gate", {}, {late}, [late, open] {
    while (!open->load()) std::this_thread::yield();
    float* p = static_cast<float*>(late.raw_data());
    std::fill(p, p + late.size(), 5.f);
  });
  std::vector<Tensor> grads{ones({1000}), late, full({1000}, 2.0, DType::float32, cpu(2))};
  allreduce(grads);  // returns with `late` still unwritten
  open->store(true);
  for (const Tensor& g : grads) CHECK(g.to_vector<float>() == std::vector<float>(1000, 8));
}

TEST_CASE("parallel: allreduce errors name the op, the shapes and the dtypes") {
  std::vector<Tensor> shapes{zeros({2, 3}), zeros({3, 2}, DType::float32, cpu(1))};
  CHECK_THROWS_WITH_AS(allreduce(shapes),
                       doctest::Contains("allreduce: tensor 1 has shape (3, 2) but tensor 0 has shape (2, 3)"),
                       ShapeError);
  std::vector<Tensor> dtypes{zeros({2}), zeros({2}, DType::float64, cpu(1))};
  CHECK_THROWS_WITH_AS(allreduce(dtypes),
                       doctest::Contains("allreduce: tensor 1 has dtype float64 but tensor 0 has dtype float32"),
                       DTypeError);
  Tensor shared = zeros({2});
  std::vector<Tensor> twice{shared, zeros({2}, DType::float32, cpu(1)), shared};
  CHECK_THROWS_WITH_AS(allreduce(twice), doctest::Contains("allreduce: tensors 0 and 2 (shape (2,), on cpu(0) and cpu(0)) share one storage"),
                       ValueError);
  std::vector<Tensor> undefined{zeros({2}), Tensor()};
  CHECK_THROWS_WITH_AS(allreduce(undefined), doctest::Contains("allreduce: the tensor is empty"), ValueError);
  std::vector<Tensor> none;
  allreduce(none);  // the sum over no tensors writes nothing
}

TEST_CASE("parallel: broadcast copies the root's values to every other device") {
  for (std::size_t root : {0u, 2u}) {
    CAPTURE(root);
    Contributions c = contributions(4, {3, 3}, DType::float64, 5);
    const std::vector<double> expected = c.tensors[root].to_vector<double>();
    broadcast(c.tensors, root);
    for (int d = 0; d < 4; ++d) {
      CHECK(c.tensors[d].device() == cpu(d));
      CHECK(c.tensors[d].to_vector<double>() == expected);
    }
  }
  std::vector<Tensor> two{zeros({2}), zeros({2}, DType::float32, cpu(1))};
  CHECK_THROWS_WITH_AS(broadcast(two, 2), doctest::Contains("broadcast: root 2 is out of range for 2 tensors"),
                       ValueError);
  std::vector<Tensor> dtypes{zeros({2}), zeros({2}, DType::int32, cpu(1))};
  CHECK_THROWS_WITH_AS(broadcast(dtypes), doctest::Contains("broadcast: tensor 1 has dtype int32"), DTypeError);
}
