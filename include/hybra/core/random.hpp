#pragma once
// Seedable random numbers that are the same on every machine and for any
// thread count: Philox4x32-10 (Salmon et al., "Parallel random numbers: as
// easy as 1, 2, 3") is counter-based, so element i depends only on the seed
// and i, and the conversions to float/normal are written out here rather than
// left to std:: distributions, whose results differ between standard libraries.
#include <array>
#include <cmath>
#include <cstdint>
#include <numbers>

namespace hybra {

class Generator {
 public:
  explicit Generator(std::uint64_t seed = 0) : key_{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)} {}

  // Reserves n counter blocks (4 x 32 bits each) and returns the first.
  std::uint64_t advance(std::uint64_t n) {
    auto first = counter_;
    counter_ += n;
    return first;
  }

  // Reserves n counter blocks for draws made later, maybe on another thread:
  // the returned generator draws exactly what this one would have drawn next.
  Generator reserve(std::uint64_t n) {
    Generator stream = *this;
    stream.counter_ = advance(n);
    return stream;
  }

  // The counter blocks a draw of n values takes (two per block).
  static std::uint64_t blocks_for(std::int64_t n) { return static_cast<std::uint64_t>((n + 1) / 2); }

  // The 4 random words of counter block `block`.
  std::array<std::uint32_t, 4> block(std::uint64_t block) const {
    std::array<std::uint32_t, 4> c{static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32), 0, 0};
    std::array<std::uint32_t, 2> k = key_;
    for (int round = 0; round < 10; ++round) {
      std::uint64_t p0 = std::uint64_t{0xD2511F53} * c[0], p1 = std::uint64_t{0xCD9E8D57} * c[2];
      c = {static_cast<std::uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<std::uint32_t>(p1),
           static_cast<std::uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<std::uint32_t>(p0)};
      k[0] += 0x9E3779B9;
      k[1] += 0xBB67AE85;
    }
    return c;
  }

  // Uniform in [0, 1) from 24 (float) or 53 (double) random bits.
  static float to_float(std::uint32_t w) { return static_cast<float>(w >> 8) * 0x1.0p-24f; }
  static double to_double(std::uint32_t hi, std::uint32_t lo) {
    return static_cast<double>(((std::uint64_t{hi} << 32) | lo) >> 11) * 0x1.0p-53;
  }
  // A standard normal pair by Box-Muller from two uniforms in [0, 1).
  static std::array<double, 2> normal_pair(double u1, double u2) {
    double r = std::sqrt(-2.0 * std::log1p(-u1));
    double a = 2.0 * std::numbers::pi * u2;
    return {r * std::cos(a), r * std::sin(a)};
  }

 private:
  std::array<std::uint32_t, 2> key_;
  std::uint64_t counter_ = 0;
};

namespace detail {
inline Generator& global_generator() {
  static Generator g{0};
  return g;
}
inline thread_local Generator* scoped_generator = nullptr;
}  // namespace detail

// The generator used when none is passed explicitly: the global one, or the
// one a generator_scope set for this thread.
inline Generator& default_generator() {
  return detail::scoped_generator ? *detail::scoped_generator : detail::global_generator();
}
inline void seed(std::uint64_t s) { detail::global_generator() = Generator{s}; }

// Makes `g` this thread's default generator until the end of the scope. A
// compiled plan runs under one holding the blocks it reserved when it was
// called, so its draws neither race with nor depend on the calling thread's.
class generator_scope {
 public:
  explicit generator_scope(Generator& g) : saved_(detail::scoped_generator) { detail::scoped_generator = &g; }
  generator_scope(const generator_scope&) = delete;
  generator_scope& operator=(const generator_scope&) = delete;
  ~generator_scope() { detail::scoped_generator = saved_; }

 private:
  Generator* saved_;
};

}  // namespace hybra
