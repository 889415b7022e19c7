// matmul and dot against a plain index loop: every BLAS path (gemm, gemv with
// M == 1 or N == 1, dot), strided operands, batching, integer dtypes, errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <hybra/eager.hpp>

#include "reference.hpp"
#include <vector>

using namespace hybra;

namespace {

Tensor ints(const Shape& shape, DType dtype, int seed = 0) { return test::small_ints(shape, dtype, seed, 11); }

using test::unravel;

// Row-major position of idx in `shape`, broadcasting extents of 1.
std::int64_t ravel(const std::vector<std::int64_t>& idx, const Shape& shape) {
  std::int64_t flat = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + (shape[d] == 1 ? 0 : idx[d]);
  return flat;
}

struct MatmulRef {
  Shape shape;
  std::vector<double> values;
};

// NumPy's matmul, written out: promote 1-d operands, broadcast the batch.
MatmulRef ref_matmul(const Tensor& a, const Tensor& b) {
  Shape sa = a.shape(), sb = b.shape();
  const bool a_vec = sa.size() == 1, b_vec = sb.size() == 1;
  if (a_vec) sa.insert(sa.begin(), 1);
  if (b_vec) sb.push_back(1);
  const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  const std::int64_t M = sa[sa.size() - 2], K = sa.back(), N = sb.back();
  Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  Shape batch = broadcast_shapes(ba, bb, "ref");
  while (ba.size() < batch.size()) ba.insert(ba.begin(), 1);
  while (bb.size() < batch.size()) bb.insert(bb.begin(), 1);
  MatmulRef r;
  r.shape = batch;
  if (!a_vec) r.shape.push_back(M);
  if (!b_vec) r.shape.push_back(N);
  const std::int64_t B = checked_numel(batch);
  for (std::int64_t bi = 0; bi < B; ++bi) {
    auto idx = unravel(bi, batch);
    const std::int64_t oa = ravel(idx, ba) * M * K, ob = ravel(idx, bb) * K * N;
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (std::int64_t k = 0; k < K; ++k) s += va[oa + i * K + k] * vb[ob + k * N + j];
        r.values.push_back(s);
      }
  }
  return r;
}

void check_matmul(const Tensor& a, const Tensor& b) {
  CAPTURE(to_string(a.shape()));
  CAPTURE(to_string(b.shape()));
  const Tensor c = matmul(a, b);
  const MatmulRef r = ref_matmul(a, b);
  CHECK(to_string(c.shape()) == to_string(r.shape));
  CHECK(c.dtype() == promote_types(a.dtype(), b.dtype()));
  CHECK(c.to_vector<double>() == r.values);
}

const DType float_types[] = {DType::float32, DType::float64};

}  // namespace

TEST_CASE("matmul: gemm, gemv (M == 1, N == 1), dot and vector operands match the reference") {
  for (DType d : float_types) {
    CAPTURE(name(d));
    check_matmul(ints({3, 4}, d), ints({4, 5}, d, 1));  // gemm
    check_matmul(ints({1, 4}, d), ints({4, 5}, d, 1));  // gemv, M == 1
    check_matmul(ints({3, 4}, d), ints({4, 1}, d, 1));  // gemv, N == 1
    check_matmul(ints({1, 4}, d), ints({4, 1}, d, 1));  // dot
    check_matmul(ints({4}, d), ints({4, 5}, d, 1));     // vector @ matrix -> (5,)
    check_matmul(ints({3, 4}, d), ints({4}, d, 1));     // matrix @ vector -> (3,)
    check_matmul(ints({4}, d), ints({4}, d, 1));        // vector @ vector -> ()
    check_matmul(ints({1, 1}, d), ints({1, 1}, d, 1));
    check_matmul(ints({37, 29}, d), ints({29, 41}, d, 2));
  }
  CHECK(matmul(ints({4}, DType::float32), ints({4}, DType::float32, 1)).ndim() == 0);
  CHECK(matmul(array<float>({1, 2}, {1, 2}), array<float>({3, 4}, {2, 1})).item<float>() == 11.f);
}

TEST_CASE("matmul: transposed, sliced and reversed views give the same numbers as contiguous copies") {
  for (DType d : float_types) {
    CAPTURE(name(d));
    const Tensor a = ints({4, 3}, d), b = ints({5, 4}, d, 1);
    const Tensor at = transpose(a), bt = transpose(b);  // (3, 4) and (4, 5), transposed views
    CHECK_FALSE(at.is_contiguous());
    check_matmul(at, ints({4, 5}, d, 1));
    check_matmul(ints({3, 4}, d), bt);
    check_matmul(at, bt);
    // gemv paths with a transposed matrix
    check_matmul(slice(at, 0, 0, 1), ints({4, 5}, d, 1));  // (1, 4) row of a transposed view
    check_matmul(ints({1, 4}, d), bt);                     // M == 1, B transposed
    check_matmul(at, slice(bt, 1, 0, 1));                  // N == 1, both transposed
    check_matmul(at, ints({4}, d, 1));                     // matrix^T @ vector
    // row-sliced (a row stride BLAS reads as lda), column-sliced and reversed
    const Tensor big = ints({8, 9}, d, 3);
    check_matmul(slice(big, 0, 1, 7, 2), ints({9, 2}, d));                       // (3, 9), rows 1, 3, 5
    check_matmul(slice(big, 1, 0, std::nullopt, 2), ints({5, 4}, d));            // (8, 5), stride 2 columns
    check_matmul(slice(big, 0, std::nullopt, std::nullopt, -1), ints({9, 3}, d));  // reversed rows
    check_matmul(slice(slice(big, 0, 2, 3), 1, std::nullopt, std::nullopt, -1), ints({9, 3}, d));  // reversed row
    check_matmul(slice(ints({9}, d), 0, std::nullopt, std::nullopt, -2), ints({5, 3}, d));  // strided vector
    check_matmul(ints({3, 5}, d), slice(ints({10}, d), 0, 0, std::nullopt, 2));
    check_matmul(slice(ints({10}, d), 0, 1, std::nullopt, 2), slice(ints({10}, d, 1), 0, 0, std::nullopt, 2));
  }
}

TEST_CASE("matmul: batched, with broadcast batch dims, per-batch transposes and vectors") {
  for (DType d : float_types) {
    CAPTURE(name(d));
    check_matmul(ints({2, 3, 4}, d), ints({4, 5}, d, 1));           // one W for the batch (folds)
    check_matmul(ints({2, 3, 4}, d), ints({2, 4, 5}, d, 1));
    check_matmul(ints({2, 1, 3, 4}, d), ints({3, 4, 2}, d, 1));     // -> (2, 3, 3, 2)
    check_matmul(ints({3, 4}, d), ints({2, 4, 5}, d, 1));           // a broadcast over b's batch
    check_matmul(ints({2, 1, 4}, d), ints({2, 4, 5}, d, 1));        // gemv per batch, M == 1
    check_matmul(ints({2, 3, 4}, d), ints({2, 4, 1}, d, 1));        // gemv per batch, N == 1
    check_matmul(ints({2, 3, 4}, d), ints({4}, d, 1));              // -> (2, 3)
    check_matmul(ints({4}, d), ints({2, 4, 5}, d, 1));              // -> (2, 5)
    check_matmul(transpose(ints({2, 4, 3}, d), {0, 2, 1}), ints({2, 4, 5}, d, 1));
    check_matmul(transpose(ints({4, 3, 2}, d)), ints({2, 4, 5}, d, 1));  // batch stride 1, matrices strided
    check_matmul(slice(ints({4, 3, 4}, d), 0, 0, std::nullopt, 2), ints({4, 2}, d, 1));  // strided batch
    check_matmul(ints({40, 2, 3}, d), ints({40, 3, 2}, d, 1));       // many small products
    check_matmul(ints({600, 6, 7}, d), ints({600, 7, 5}, d, 1));     // ... spread over threads
  }
  const Tensor c = matmul(ints({2, 1, 3, 4}, DType::float32), ints({3, 4, 2}, DType::float32));
  CHECK(to_string(c.shape()) == "(2, 3, 3, 2)");
}

TEST_CASE("matmul: integer dtypes are a plain loop that wraps like NumPy") {
  for (DType d : {DType::int32, DType::int64, DType::uint8}) {
    CAPTURE(name(d));
    check_matmul(ints({3, 4}, d), ints({4, 5}, d, 1));
    check_matmul(ints({4}, d), ints({4, 2}, d, 1));
    check_matmul(ints({2, 3, 4}, d), ints({4}, d, 1));
    check_matmul(transpose(ints({4, 3}, d)), slice(ints({4, 10}, d, 1), 1, 0, std::nullopt, 3));
    check_matmul(ints({2, 1, 2, 3}, d), ints({3, 3, 2}, d, 1));
  }
  // uint8 wraps modulo 256: 16 * 16 + 16 * 16 = 512 -> 0
  auto u = full({1, 2}, 16, DType::uint8), v = full({2, 1}, 16, DType::uint8);
  CHECK(matmul(u, v).item<int>() == 0);
  auto big = array<std::int32_t>({1 << 30, 1 << 30}, {1, 2});
  CHECK(matmul(big, array<std::int32_t>({2, 2}, {2, 1})).item<std::int64_t>() == 0);  // 2^32 wraps in int32
}

TEST_CASE("matmul: mixed dtypes promote, expressions are evaluated first") {
  const Tensor i = ints({3, 4}, DType::int32), f = ints({4, 2}, DType::float32, 1);
  CHECK(matmul(i, f).dtype() == DType::float32);
  check_matmul(i, f);
  check_matmul(ints({3, 4}, DType::float32), ints({4, 2}, DType::float64, 1));
  check_matmul(ints({3, 4}, DType::int32), ints({4, 2}, DType::int64, 1));
  check_matmul(ints({3, 4}, DType::uint8), ints({4}, DType::int32, 1));
  const Tensor a = ints({2, 3}, DType::float64), b = ints({3, 2}, DType::float64, 1);
  CHECK(matmul(a * 2 + 1, b).to_vector<double>() == matmul(Tensor(a * 2 + 1), b).to_vector<double>());
}

TEST_CASE("matmul: empty operands") {
  for (DType d : {DType::float32, DType::int32}) {
    check_matmul(ints({0, 3}, d), ints({3, 4}, d));
    check_matmul(ints({2, 0}, d), ints({0, 3}, d));  // K == 0: zeros
    check_matmul(ints({0, 2, 3}, d), ints({3, 4}, d));
    check_matmul(ints({0}, d), ints({0}, d));
  }
  CHECK(matmul(ints({2, 0}, DType::float64), ints({0, 3}, DType::float64)).to_vector<double>() ==
        std::vector<double>(6, 0.0));
}

TEST_CASE("matmul: errors name the op and the shapes") {
  const Tensor a = zeros({2, 3}), b = zeros({4, 5});
  CHECK_THROWS_WITH_AS(matmul(a, b), "matmul: shapes (2, 3) and (4, 5) are not aligned (3 != 4)", ShapeError);
  CHECK_THROWS_WITH_AS(matmul(zeros({3}), zeros({4})), doctest::Contains("matmul: shapes (3,) and (4,)"), ShapeError);
  CHECK_THROWS_WITH_AS(matmul(zeros({2, 3, 4}), zeros({3, 4, 5})),
                       doctest::Contains("matmul: the batch dimensions of shapes (2, 3, 4) and (3, 4, 5)"), ShapeError);
  CHECK_THROWS_WITH_AS(matmul(zeros({}), zeros({3})), doctest::Contains("matmul: shapes () and (3,)"), ShapeError);
  CHECK_THROWS_WITH_AS(matmul(Tensor(), zeros({3})), doctest::Contains("matmul"), ValueError);
}

TEST_CASE("dot: numpy.dot's rules for 0-d, 1-d, 2-d and N-d operands") {
  for (DType d : {DType::float32, DType::float64, DType::int32}) {
    CAPTURE(name(d));
    const Tensor v = ints({4}, d), w = ints({4}, d, 1);
    const Tensor s = dot(v, w);
    CHECK(s.ndim() == 0);
    CHECK(s.item<double>() == ref_matmul(v, w).values[0]);
    const Tensor m = ints({3, 4}, d), n = ints({4, 5}, d, 1);
    CHECK(dot(m, n).to_vector<double>() == ref_matmul(m, n).values);
    CHECK(dot(transpose(ints({4, 3}, d)), n).to_vector<double>() == ref_matmul(transpose(ints({4, 3}, d)), n).values);
    CHECK(dot(m, w).to_vector<double>() == ref_matmul(m, w).values);
    CHECK(dot(v, n).to_vector<double>() == ref_matmul(v, n).values);
    // scalar operand: elementwise product
    CHECK(dot(full({}, 2, d), m).to_vector<double>() == Tensor(m * 2).to_vector<double>());

    // N-d: dot(a, b)[i, j, p, q] = sum_k a[i, j, k] * b[p, k, q]
    const Tensor a = ints({2, 3, 4}, d), b = ints({5, 4, 6}, d, 2);
    const Tensor c = dot(a, b);
    REQUIRE(to_string(c.shape()) == "(2, 3, 5, 6)");
    const auto va = a.to_vector<double>(), vb = b.to_vector<double>(), vc = c.to_vector<double>();
    std::vector<double> expect;
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j)
        for (int p = 0; p < 5; ++p)
          for (int q = 0; q < 6; ++q) {
            double acc = 0;
            for (int k = 0; k < 4; ++k) acc += va[(i * 3 + j) * 4 + k] * vb[(p * 4 + k) * 6 + q];
            expect.push_back(acc);
          }
    CHECK(vc == expect);
    // N-d with a 1-d b: sum over the last axis of a
    const Tensor e = dot(a, w);
    REQUIRE(to_string(e.shape()) == "(2, 3)");
    const auto vw = w.to_vector<double>(), ve = e.to_vector<double>();
    for (int r = 0; r < 6; ++r) {
      double acc = 0;
      for (int k = 0; k < 4; ++k) acc += va[r * 4 + k] * vw[k];
      CHECK(ve[r] == acc);
    }
    // 1-d a with an N-d b: (4,) . (5, 4, 6) -> (5, 6)
    CHECK(to_string(dot(v, b).shape()) == "(5, 6)");
    CHECK(dot(v, b).to_vector<double>() == Tensor(dot(reshape(v, {1, 4}), b)).to_vector<double>());
  }
  CHECK(dot(ints({3}, DType::int32), ints({3}, DType::float64)).dtype() == DType::float64);
  CHECK(dot(zeros({0}), zeros({0})).item<float>() == 0.f);
}

TEST_CASE("dot: misaligned shapes are a ShapeError naming dot and the shapes") {
  CHECK_THROWS_WITH_AS(dot(zeros({2, 3}), zeros({4, 5})), "dot: shapes (2, 3) and (4, 5) are not aligned (3 != 4)",
                       ShapeError);
  CHECK_THROWS_WITH_AS(dot(zeros({2, 3, 4}), zeros({5, 3, 6})), doctest::Contains("dot: shapes (2, 3, 4) and (5, 3, 6)"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(dot(zeros({3}), zeros({4})), doctest::Contains("dot: shapes (3,) and (4,)"), ShapeError);
}

// Whether hybra's GEMV computes a product of `rows` rows: it does, unless
// oneDNN serves the shape (ops/dense_onednn.hpp).
bool on_gemv([[maybe_unused]] DType dtype, [[maybe_unused]] std::int64_t rows, [[maybe_unused]] std::int64_t in_units,
             [[maybe_unused]] std::int64_t units) {
#ifdef HYBRA_ONEDNN_CALLS
  if (dtype == DType::float32 && detail::nn::onednn_serves_dense(rows, in_units, units)) return false;
#endif
  return true;
}

TEST_CASE("fully_connected of up to four rows (one pass over the weight): the reference, and each row's bits alone") {
  // (units, in_units): 4-unit blocks and a remainder; in_units with and without a partial vector; the last
  // weight is beyond 4 MiB, where the units are split over the threads.
  const std::int64_t shapes[][2] = {{13, 37}, {8, 64}, {5, 1}, {1030, 1100}};
  for (const DType dtype : {DType::float32, DType::float64})
    for (const auto& [units, in_units] : shapes) {
      CAPTURE(name(dtype));
      CAPTURE(units);
      CAPTURE(in_units);
      const Tensor w = random_normal({units, in_units}, 0, 1, dtype), b = random_normal({units}, 0, 1, dtype);
      const Tensor x = random_normal({6, in_units}, 0, 1, dtype);
      const auto xv = x.to_vector<double>(), wv = w.to_vector<double>(), bv = b.to_vector<double>();
      std::vector<std::vector<double>> alone;
      for (std::int64_t row = 0; row < 6; ++row)
        alone.push_back(fully_connected(slice(x, 0, row, row + 1), w, b).to_vector<double>());
      for (std::int64_t rows = 1; rows <= 6; ++rows) {
        CAPTURE(rows);
        const auto y = fully_connected(slice(x, 0, 0, rows), w, b).to_vector<double>();
        REQUIRE(y.size() == static_cast<std::size_t>(rows * units));
        double worst = 0;
        for (std::int64_t m = 0; m < rows; ++m)
          for (std::int64_t n = 0; n < units; ++n) {
            double want = bv[static_cast<std::size_t>(n)], scale = std::abs(want);
            for (std::int64_t k = 0; k < in_units; ++k) {
              const double term = xv[static_cast<std::size_t>(m * in_units + k)] * wv[static_cast<std::size_t>(n * in_units + k)];
              want += term;
              scale += std::abs(term);
            }
            worst = std::max(worst, std::abs(y[static_cast<std::size_t>(m * units + n)] - want) / scale);
          }
        CHECK(worst <= (dtype == DType::float32 ? 1e-6 : 1e-15));
        if (rows <= 4 && on_gemv(dtype, rows, in_units, units))  // one pass over w: each row's outputs are those it has alone, bit for bit
          for (std::int64_t m = 0; m < rows; ++m)
            CHECK(std::vector<double>(y.begin() + m * units, y.begin() + (m + 1) * units) == alone[static_cast<std::size_t>(m)]);
      }
    }
}

// Where oneDNN is built in, these products run on it (ops/dense_onednn.hpp): the first and the third cut into
// several parts of units, the second into one; a 2048 x 2048 weight (2^22 elements) takes it from 3 rows.
TEST_CASE("fully_connected on oneDNN: the reference, the same bits at every thread count, weights kept while unchanged") {
  const int saved = num_threads();
  struct Case {
    std::int64_t rows, in_units, units;
  };
  const Case cases[] = {{9, 300, 1000}, {37, 100, 64}, {3, 2048, 2048}};
  for (const auto& c : cases) {
    CAPTURE(c.rows);
    CAPTURE(c.in_units);
    CAPTURE(c.units);
    const Tensor x = random_normal({c.rows, c.in_units}), b = random_normal({c.units});
    const auto xv = x.to_vector<double>(), bv = b.to_vector<double>();
    // The largest error against the sums in double, over each sum's scale.
    auto error = [&](const Tensor& w, const std::vector<float>& y) {
      const auto wv = w.to_vector<double>();
      double worst = 0;
      for (std::int64_t m = 0; m < c.rows; ++m)
        for (std::int64_t n = 0; n < c.units; ++n) {
          double want = bv[static_cast<std::size_t>(n)], scale = std::abs(want);
          for (std::int64_t k = 0; k < c.in_units; ++k) {
            const double term = xv[static_cast<std::size_t>(m * c.in_units + k)] * wv[static_cast<std::size_t>(n * c.in_units + k)];
            want += term;
            scale += std::abs(term);
          }
          worst = std::max(worst, std::abs(y[static_cast<std::size_t>(m * c.units + n)] - want) / scale);
        }
      return worst;
    };
    Tensor w = random_normal({c.units, c.in_units});
    std::vector<float> first;
    for (int threads : {1, 2, 3}) {
      CAPTURE(threads);
      set_num_threads(threads);
      const auto y = fully_connected(x, w, b).to_vector<float>();
      if (threads == 1) first = y;
      CHECK(y == first);
    }
    set_num_threads(saved);
    CHECK(error(w, first) <= 1e-6);
    // A kept blocked copy that outlived its weights would give the first call's values again, off by O(1).
    w.assign(w * 2.0f + 1.0f);
    CHECK(error(w, fully_connected(x, w, b).to_vector<float>()) <= 1e-6);
    random_normal({c.units, c.in_units}).copy_to(w);
    CHECK(error(w, fully_connected(x, w, b).to_vector<float>()) <= 1e-6);
    // Weights whose storage keeps no copy (a pointer handed out, a user's buffer): each call's own copy lives
    // until the product has read it.
    float* raw = w.data<float>();
    raw[0] += 1.0f;
    CHECK(error(w, fully_connected(x, w, b).to_vector<float>()) <= 1e-6);
    std::vector<float> user = w.to_vector<float>();
    const Tensor blob = from_blob(user.data(), {c.units, c.in_units});
    CHECK(error(blob, fully_connected(x, blob, b).to_vector<float>()) <= 1e-6);
    // Two weights in one storage: each view's copy is its own.
    const Tensor both = random_normal({2 * c.units, c.in_units});
    for (const std::int64_t first_unit : {std::int64_t{0}, c.units, std::int64_t{0}}) {
      CAPTURE(first_unit);
      const Tensor half = slice(both, 0, first_unit, first_unit + c.units);
      CHECK(error(half, fully_connected(x, half, b).to_vector<float>()) <= 1e-6);
    }
  }
}
