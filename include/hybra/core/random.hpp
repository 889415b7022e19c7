#pragma once
// Seedable random numbers that are the same on every machine, for any
// thread count and on either device: Philox4x32-10 (core/philox.hpp) is
// counter-based, so element i depends only on the seed and i.
#include <array>
#include <cstdint>

#include "philox.hpp"

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
    const philox::Words w = philox::block(block, key_[0], key_[1]);
    return {w.w[0], w.w[1], w.w[2], w.w[3]};
  }

  // The key, with which a GPU draws from reserved counter blocks (kernels/random.cuh).
  std::array<std::uint32_t, 2> key() const { return key_; }

  // Uniform in [0, 1) from 53 random bits.
  static double to_double(std::uint32_t hi, std::uint32_t lo) { return philox::to_double(hi, lo); }

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
