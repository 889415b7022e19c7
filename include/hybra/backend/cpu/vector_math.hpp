#pragma once
// How the transcendental functions of the elementwise ops vectorise inside
// hybra's fused CPU loops.
//
// float32 exp, tanh and sigmoid are hybra's own (namespace float32 below):
// straight-line arithmetic and bit operations, with no branch and no call, so
// GCC inlines them into a fused loop and vectorises them with it. Every
// choice between values is a bit select: GCC keeps a loop with `c ? a * b : b`
// scalar unless it can mask the multiply (AVX-512), and specialises the code
// after `x < lo ? lo : x` for the constant. Every function keeps NaN, gives
// the limits at infinity, and is accurate to a few units in the last place
// (the bounds are tested, tests/unit/test_expr.cpp); nothing needs them to
// match glibc's bit for bit. The ops use them where they measured faster than
// glibc's vector math (libmvec): for targets with AVX2 and FMA
// (docs/benchmarks.md, "vector math"); a baseline x86-64 build, float64 and
// the other functions keep the C library's.
//
// glibc declares the SIMD variants of its math functions (libmvec) only under
// -ffast-math. hybra needs them with IEEE semantics intact, so it declares the
// variants itself: with -fno-math-errno (set by the hybra::hybra target) GCC
// then calls e.g. _ZGVdN8v_log from fused loops instead of scalar log.
#include <bit>
#include <cmath>
#include <cstdint>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__FAST_MATH__)
#define HYBRA_DECLARE_SIMD_1(fn)                                                             \
  extern "C" __attribute__((__simd__("notinbranch"))) float fn##f(float) noexcept;        \
  extern "C" __attribute__((__simd__("notinbranch"))) double fn(double) noexcept;
#define HYBRA_DECLARE_SIMD_2(fn)                                                             \
  extern "C" __attribute__((__simd__("notinbranch"))) float fn##f(float, float) noexcept; \
  extern "C" __attribute__((__simd__("notinbranch"))) double fn(double, double) noexcept;
HYBRA_DECLARE_SIMD_1(exp)
HYBRA_DECLARE_SIMD_1(log)
HYBRA_DECLARE_SIMD_1(log1p)
HYBRA_DECLARE_SIMD_1(tanh)
HYBRA_DECLARE_SIMD_2(pow)
#if defined(__GLIBC_PREREQ) && __GLIBC_PREREQ(2, 35)  // libmvec's erf came with glibc 2.35
HYBRA_DECLARE_SIMD_1(erf)
#endif
#undef HYBRA_DECLARE_SIMD_1
#undef HYBRA_DECLARE_SIMD_2
#endif

namespace hybra::backend::cpu::float32 {

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
inline constexpr bool used_by_ops = true;
#else
inline constexpr bool used_by_ops = false;
#endif

namespace detail {

inline std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }
inline float from_bits(std::uint32_t b) { return std::bit_cast<float>(b); }

// a * b + c, fused where the target has FMA (the same in every loop of a
// translation unit, so an op's value does not depend on where it is fused)
inline float multiply_add(float a, float b, float c) {
#ifdef __FMA__
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}

inline float select(bool take_a, float a, float b) {
  const std::uint32_t mask = 0u - static_cast<std::uint32_t>(take_a);
  return from_bits((bits(a) & mask) | (bits(b) & ~mask));
}
// max(x, lo) and min(x, hi) that keep NaN
inline float at_least(float x, float lo) { return select(x < lo, lo, x); }
inline float at_most(float x, float hi) { return select(x > hi, hi, x); }

// Adding 1.5 * 2^23 rounds a float of magnitude below 2^22 to an integer,
// which then sits in the sum's low mantissa bits.
inline constexpr float round_shift = 12582912.0f;

// x = n ln2 + r with |r| <= ln2 / 2, for |x| < 2^21; `shifted` is
// x / ln2 + round_shift, whose bits hold n. ln2 is split in two so that
// n * ln2_high is exact.
struct Reduced {
  float r;
  std::uint32_t shifted_bits;
};
inline Reduced reduce(float x) {
  constexpr float log2e = 1.44269504088896341f, ln2_high = 0.693145751953125f, ln2_low = 1.4286068203094172e-06f;
  const float shifted = multiply_add(x, log2e, round_shift);
  const float n = shifted - round_shift;
  const float r = multiply_add(n, -ln2_low, multiply_add(n, -ln2_high, x));
  return {r, bits(shifted)};
}

// 2^n as a float, for n in [-126, 127], from reduce's shifted bits
inline float power_of_two(std::uint32_t shifted_bits) { return from_bits((shifted_bits + (127u - bits(round_shift))) << 23); }

// e^r - 1 for |r| <= ln2 / 2: r + r^2 p(r), p a degree-4 fit of
// (e^r - 1 - r) / r^2 whose relative error in e^r is 3e-9
inline float expm1_reduced(float r) {
  float p = 1.381461043e-03f;
  p = multiply_add(p, r, 8.368710056e-03f);
  p = multiply_add(p, r, 4.166838899e-02f);
  p = multiply_add(p, r, 1.666652113e-01f);
  p = multiply_add(p, r, 4.999999404e-01f);
  return multiply_add(p * r, r, r);
}

// e^x for x <= 0; below x = -87.68 (n = -127), where e^x is subnormal, 0
inline float exp_nonpositive(float x) {
  const auto [r, shifted_bits] = reduce(at_least(x, -88.0f));
  const float scale = power_of_two(shifted_bits);
  return multiply_add(expm1_reduced(r), scale, scale);
}

}  // namespace detail

// e^x, subnormal results included: 2^n is applied as two factors, each a
// normal float, so only a subnormal result is rounded twice
inline float exp(float x) {
  using namespace detail;
  const auto [r, shifted_bits] = reduce(at_most(at_least(x, -105.0f), 89.0f));
  const std::uint32_t biased_sum = shifted_bits + (254u - bits(round_shift));  // (n + 127) + 127
  const std::uint32_t biased_low = biased_sum >> 1, biased_high = biased_sum - biased_low;
  const float low = from_bits(biased_low << 23);
  return multiply_add(expm1_reduced(r), low, low) * from_bits(biased_high << 23);
}

// tanh|x| = u / (u + 2) with u = e^(2|x|) - 1, which keeps its relative
// accuracy near 0; above |x| = 10 it rounds to 1
inline float tanh(float x) {
  using namespace detail;
  const float a = at_most(from_bits(bits(x) & 0x7fffffffu), 10.0f);
  const auto [r, shifted_bits] = reduce(a + a);
  const float scale = power_of_two(shifted_bits);
  const float u = multiply_add(scale, expm1_reduced(r), scale - 1.0f);
  return from_bits(bits(u / (u + 2.0f)) | (bits(x) & 0x80000000u));
}

// 1 / (1 + e^-x) from e^-|x|, which cannot overflow; below x = -87.68, where
// the result is subnormal, 0
inline float sigmoid(float x) {
  using namespace detail;
  const float e = exp_nonpositive(from_bits(bits(x) | 0x80000000u));
  return select(x < 0.0f, e, 1.0f) / (1.0f + e);
}

}  // namespace hybra::backend::cpu::float32
