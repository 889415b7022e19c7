#pragma once
// Helpers the op tests share to build inputs and walk reference loops.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <hybra/eager.hpp>
#include <string>
#include <thread>
#include <vector>

namespace hybra::test {

// The global engine of the given type within a scope, whatever
// HYBRA_ENGINE_TYPE says (the unit tests also run under the naive engine,
// which runs ops at once).
class EngineTypeScope {
 public:
  explicit EngineTypeScope(engine::EngineType t) : saved_(engine::get().type()) { engine::get().set_type(t); }
  EngineTypeScope(const EngineTypeScope&) = delete;
  EngineTypeScope& operator=(const EngineTypeScope&) = delete;
  ~EngineTypeScope() { engine::get().set_type(saved_); }

 private:
  engine::EngineType saved_;
};

inline constexpr DType all_dtypes[] = {DType::float32, DType::float64, DType::int32, DType::int64, DType::uint8};

// Small integers (centred on 0, except uint8) in a scrambled order, so sums
// and products are exact in every dtype whatever the summation order.
inline Tensor small_ints(const Shape& shape, DType dtype, int seed = 0, int modulus = 11) {
  std::vector<double> v(static_cast<std::size_t>(checked_numel(shape)));
  for (std::size_t i = 0; i < v.size(); ++i) {
    auto r = static_cast<double>((i * 7 + static_cast<std::size_t>(seed) * 5 + 3) % static_cast<std::size_t>(modulus));
    v[i] = dtype == DType::uint8 ? r : r - modulus / 2;
  }
  return array(v, shape).astype(dtype);
}

inline std::vector<std::int64_t> unravel(std::int64_t flat, const Shape& shape) {
  std::vector<std::int64_t> idx(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
  return idx;
}

inline std::int64_t ravel(const std::vector<std::int64_t>& idx, const Shape& shape) {
  std::int64_t flat = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + idx[d];
  return flat;
}

// max_i |a_i - b_i| / max(|a_i|, |b_i|): 0 when every element is equal (NaN equals NaN).
inline double max_rel_diff(const std::vector<double>& x, const std::vector<double>& y) {
  REQUIRE(x.size() == y.size());
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i]))) continue;
    worst = std::max(worst, std::abs(x[i] - y[i]) / std::max({std::abs(x[i]), std::abs(y[i]), 1e-30}));
  }
  return worst;
}
inline double max_rel_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  return max_rel_diff(a.to_vector<double>(), b.to_vector<double>());
}

// Blocks until ready() holds or `limit` passes; lets a test wait for what
// another thread does without depending on how fast it is.
template <class Ready>
bool await(Ready&& ready, std::chrono::milliseconds limit = std::chrono::seconds(5)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!ready()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::yield();
  }
  return true;
}
// Blocks until `flag` is set or `limit` passes; lets two ops prove they run at
// the same time.
inline bool await_flag(const std::atomic<bool>& flag, std::chrono::milliseconds limit = std::chrono::seconds(5)) {
  return await([&] { return flag.load(); }, limit);
}

// A fresh directory, removed with everything in it at the end of the test.
struct ScratchDir {
  std::filesystem::path path;
  ScratchDir() {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           ("hybra-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() { std::filesystem::remove_all(path); }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string operator/(const std::string& name) const { return (path / name).string(); }
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(path)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
};

}  // namespace hybra::test
