#pragma once
// How the transcendental functions of the elementwise ops vectorise inside
// hybra's fused CPU loops.
//
// float32 exp, tanh and sigmoid are hybra's own (namespace float32 below):
// straight-line arithmetic and bit operations, with no branch and no call, so
// GCC inlines them into a fused loop and vectorises them with it. A choice
// between two computed values is a bit select: GCC keeps a loop with
// `c ? a * b : b` scalar unless it can mask the multiply (AVX-512). A clamp is
// a min or max against a bound GCC cannot fold (`opaque`), and the polynomial
// is evaluated in two halves: the fused loops of a chain of these functions
// are bound by the latency of each element's chain, not by the number of
// instructions (docs/benchmarks.md). Every function keeps NaN, gives
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
// Always 0. GCC 12 vectorises `x < c ? c : x` with a constant c as a
// compare into a mask and a blend, two instructions on the element's critical
// path; with a loop-invariant c it emits one min or max instruction (whose
// operand order keeps NaN, as the select does). A bound passed through
// `opaque` is such a value: this variable is not const, so GCC cannot fold
// it, and loads it once, before the loop.
inline std::uint32_t opaque_zero = 0;
inline float opaque(float c) { return from_bits(bits(c) | opaque_zero); }

// max(x, lo) and min(x, hi) that keep NaN
inline float at_least(float x, float lo) {
  lo = opaque(lo);
  return x < lo ? lo : x;
}
inline float at_most(float x, float hi) {
  hi = opaque(hi);
  return x > hi ? hi : x;
}

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
inline constexpr float log2e = 1.44269504088896341f;
inline Reduced reduce_with(float x, float shifted) {
  constexpr float ln2_high = 0.693145751953125f, ln2_low = 1.4286068203094172e-06f;
  const float n = shifted - round_shift;
  return {multiply_add(n, -ln2_low, multiply_add(n, -ln2_high, x)), bits(shifted)};
}
inline Reduced reduce(float x) { return reduce_with(x, multiply_add(x, log2e, round_shift)); }
// reduce(a + a) for 0 <= a <= 10 (n <= 29), with its first step not waiting
// for the sum (a + a and 2 log2e are exact) and one constant for ln2: r is off
// by n (ln2 - float(ln2)), up to 6e-8, which tanh divides by e^(2a) - 1
// (tanh's bound, 3 ulps, holds: tests/unit/test_expr.cpp)
inline Reduced reduce_doubled(float a) {
  const float shifted = multiply_add(a, 2 * log2e, round_shift);
  return {multiply_add(shifted - round_shift, -0.693147182f, a + a), bits(shifted)};
}

// 2^n as a float, for n in [-126, 127], from reduce's shifted bits
inline float power_of_two(std::uint32_t shifted_bits) { return from_bits((shifted_bits + (127u - bits(round_shift))) << 23); }

// e^r - 1 for |r| <= ln2 / 2: r + r^2 p(r), p a degree-4 fit of
// (e^r - 1 - r) / r^2 whose relative error in e^r is 3e-9, evaluated as
// (c0 + c1 r) + r^2 ((c2 + c3 r) + c4 r^2)
inline float expm1_reduced(float r) {
  const float r2 = r * r;
  const float low = multiply_add(1.666652113e-01f, r, 4.999999404e-01f);
  const float high = multiply_add(1.381461043e-03f, r2, multiply_add(8.368710056e-03f, r, 4.166838899e-02f));
  return multiply_add(multiply_add(high, r2, low), r2, r);
}

// e^-a for 0 <= a <= 88 (NaN kept); above a = 87.68 (n = -127), where e^-a is
// subnormal, 0
inline float exp_of_negative(float a) {
  const auto [r, shifted_bits] = reduce(-a);
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
  const float a = at_most(std::fabs(x), 10.0f);  // fabs, not a bit and: a clamp of integer bits is no min
  const auto [r, shifted_bits] = reduce_doubled(a);
  const float scale = power_of_two(shifted_bits);
  const float u = multiply_add(scale, expm1_reduced(r), scale - 1.0f);
  return from_bits(bits(u / (u + 2.0f)) | (bits(x) & 0x80000000u));
}

// 1 / (1 + e^-x) from e^-|x|, which cannot overflow; below x = -87.68, where
// the result is subnormal, 0
inline float sigmoid(float x) {
  using namespace detail;
  const float e = exp_of_negative(at_most(std::fabs(x), 88.0f));
  return select(x < 0.0f, e, 1.0f) / (1.0f + e);
}

}  // namespace hybra::backend::cpu::float32
