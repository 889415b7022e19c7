#pragma once
// The two 16-bit floating types, float16_t (IEEE 754 binary16) and bfloat16_t
// (float32's exponent, 8 significant bits), as storage: a tensor of them holds
// 2-byte values, and every op computes on them in float32 (ops/half.hpp), as
// NumPy and PyTorch do on a CPU. So these types carry conversions and nothing
// else: arithmetic on them would round after every step, and a kernel that
// tries it does not compile.
//
// Conversions round to nearest, ties to even, from the exact value (a double
// converts in one rounding, not through float32); too large a value becomes
// infinity, NaN stays NaN. Integers convert through double (exact below 2^53).
// The same code runs on the CPU and in NVRTC's kernels (the GPU converts to
// the CPU's bits), so it uses no standard library there.
#include "macros.hpp"
#ifndef __CUDACC_RTC__
#include <bit>
#include <cstdint>
#endif

namespace hybra {

namespace detail::half {

// constexpr on the host (std::bit_cast); the device's bit casts are intrinsics.
#ifdef __CUDA_ARCH__
#define HYBRA_HALF_CONSTEXPR
#else
#define HYBRA_HALF_CONSTEXPR constexpr
#endif

#ifdef __CUDACC_RTC__
using u16 = unsigned short;
using u32 = unsigned int;
using u64 = unsigned long long;
#else
using u16 = std::uint16_t;
using u32 = std::uint32_t;
using u64 = std::uint64_t;
#endif

HYBRA_HD HYBRA_HALF_CONSTEXPR u64 bits_of(double x) {
#ifdef __CUDA_ARCH__
  return static_cast<u64>(__double_as_longlong(x));
#else
  return std::bit_cast<u64>(x);
#endif
}
HYBRA_HD HYBRA_HALF_CONSTEXPR float float_of(u32 bits) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  return std::bit_cast<float>(bits);
#endif
}

// x >> shift, rounded to nearest, ties to even.
HYBRA_HD constexpr u64 shift_rounded(u64 x, int shift) {
  if (shift == 0) return x;
  if (shift > 63) return 0;
  const u64 kept = x >> shift, rest = x & ((u64{1} << shift) - 1), half = u64{1} << (shift - 1);
  return kept + ((rest > half || (rest == half && (kept & 1))) ? 1 : 0);
}

// The bits of x in a binary format of `Exponent` exponent bits and `Mantissa`
// stored significand bits.
template <int Exponent, int Mantissa>
HYBRA_HD HYBRA_HALF_CONSTEXPR u32 encode(double x) {
  constexpr int bias = (1 << (Exponent - 1)) - 1;
  constexpr u32 infinity = ((u32{1} << Exponent) - 1) << Mantissa;
  const u64 b = bits_of(x);
  const u32 sign = static_cast<u32>(b >> 63) << (Exponent + Mantissa);
  const int exponent = static_cast<int>((b >> 52) & 0x7ff);
  const u64 fraction = b & ((u64{1} << 52) - 1);
  if (exponent == 0x7ff) return sign | infinity | (fraction ? u32{1} << (Mantissa - 1) : 0);
  if (exponent == 0) return sign;  // zero, or a double subnormal: far below either format's least value
  const u64 significand = fraction | (u64{1} << 52);
  const int biased = exponent - 1023 + bias;
  // A subnormal result keeps fewer bits; a carry out of the significand moves
  // the exponent up by itself, infinity included.
  const int shift = 52 - Mantissa + (biased > 0 ? 0 : 1 - biased);
  const u64 rounded = shift_rounded(significand, shift);
  const u64 encoded = biased > 0 ? (static_cast<u64>(biased - 1) << Mantissa) + rounded : rounded;
  return sign | (encoded >= infinity ? infinity : static_cast<u32>(encoded));
}

// The float32 that holds a value of that format exactly.
template <int Exponent, int Mantissa>
HYBRA_HD HYBRA_HALF_CONSTEXPR float decode(u32 bits) {
  // float32's own exponent (bfloat16): the upper half of a float32, subnormals too.
  if constexpr (Exponent == 8) return float_of(bits << (23 - Mantissa));
  constexpr int bias = (1 << (Exponent - 1)) - 1;
  constexpr u32 exponent_mask = (u32{1} << Exponent) - 1;
  const u32 sign = (bits >> (Exponent + Mantissa)) << 31;
  const u32 exponent = (bits >> Mantissa) & exponent_mask;
  u32 fraction = bits & ((u32{1} << Mantissa) - 1);
  if (exponent == exponent_mask) return float_of(sign | 0x7f800000u | (fraction << (23 - Mantissa)));
  if (exponent == 0) {
    if (fraction == 0) return float_of(sign);
    int e = 1 - bias;
    while (!(fraction & (u32{1} << Mantissa))) {
      fraction <<= 1;
      --e;
    }
    fraction &= (u32{1} << Mantissa) - 1;
    return float_of(sign | static_cast<u32>(e + 127) << 23 | fraction << (23 - Mantissa));
  }
  return float_of(sign | (exponent - bias + 127) << 23 | fraction << (23 - Mantissa));
}

// A 16-bit floating type: its bits, converted from and to every arithmetic type.
template <int Exponent, int Mantissa>
struct binary16 {
  u16 bits = 0;

  binary16() = default;
  template <class T>
  HYBRA_HD HYBRA_HALF_CONSTEXPR explicit binary16(T value)
      : bits(static_cast<u16>(encode<Exponent, Mantissa>(static_cast<double>(value)))) {}
  // To every arithmetic type, through the float32 that holds the value.
  template <class T>
  HYBRA_HD HYBRA_HALF_CONSTEXPR explicit operator T() const {
    return static_cast<T>(decode<Exponent, Mantissa>(bits));
  }

  HYBRA_HD static constexpr binary16 from_bits(u16 b) {
    binary16 h;
    h.bits = b;
    return h;
  }
  // Equal bits; NaN's payload and the sign of zero count.
  HYBRA_HD friend constexpr bool same_bits(binary16 a, binary16 b) { return a.bits == b.bits; }
};

}  // namespace detail::half

using float16_t = detail::half::binary16<5, 10>;
using bfloat16_t = detail::half::binary16<8, 7>;

}  // namespace hybra
