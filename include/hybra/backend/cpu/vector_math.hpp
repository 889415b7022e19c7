#pragma once
// glibc declares the SIMD variants of its math functions (libmvec) only under
// -ffast-math. hybra needs them with IEEE semantics intact, so it declares the
// variants itself: with -fno-math-errno (set by the hybra::hybra target) GCC
// then calls e.g. _ZGVdN8v_expf from fused loops instead of scalar expf.
#include <cmath>

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
