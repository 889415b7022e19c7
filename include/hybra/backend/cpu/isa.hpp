#pragma once
// The one instruction-set dispatch of the CPU kernels: a kernel comes in
// three builds of one template, AVX-512 and AVX2 (GCC's target attribute, on
// x86-64 only; `flatten` inlines its tiles, so each is compiled for its
// target) and generic. runnable_variants lists the builds this CPU can run,
// fastest first; the kernel calls the first, and the tests run every one.
//
// A compute-bound loop left to the compiler's vectoriser asks for the widest
// vector of the build's own target (simd_lanes): GCC's tuning for
// Skylake-class CPUs prefers 256-bit vectors where AVX-512 is enabled, which
// halves the width of an elementwise loop of vector math (docs/benchmarks.md,
// "vector math").
#include <algorithm>
#include <vector>

namespace hybra::backend::cpu {

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define HYBRA_ISA_VARIANTS 1
#endif

#if defined(__AVX512F__)
inline constexpr int simd_bytes = 64;
#elif defined(__AVX__)
inline constexpr int simd_bytes = 32;
#else
inline constexpr int simd_bytes = 16;
#endif

// Elements of the widest of the types T per vector of simd_bytes: the
// `simdlen` of a loop over them.
template <class... T>
inline constexpr int simd_lanes = std::max(1, simd_bytes / static_cast<int>(std::max({sizeof(T)...})));

// An elementwise loop rounds every op's result, as the op alone would: GCC
// (-ffp-contract=fast, its default for GNU C++) would otherwise join a
// multiply and the add after it into one FMA across the inlined ops of a
// fused expression, where a captured graph's fused loop, which runs op by op,
// rounds the product, and eager and hybridized results would differ in FMA
// builds. GCC does not inline a function with this attribute into one
// without it, so the setting holds for the loop and what it inlines. Vector
// math asks for its FMAs explicitly (vector_math.hpp).
#if defined(__GNUC__) && !defined(__clang__)
#define HYBRA_ROUND_EVERY_OP __attribute__((optimize("fp-contract=off")))
#else
#define HYBRA_ROUND_EVERY_OP
#endif

template <class Fn>
std::vector<Fn> runnable_variants([[maybe_unused]] Fn avx512, [[maybe_unused]] Fn avx2, Fn generic) {
  std::vector<Fn> variants;
#ifdef HYBRA_ISA_VARIANTS
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq"))
    variants.push_back(avx512);
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) variants.push_back(avx2);
#endif
  variants.push_back(generic);
  return variants;
}

}  // namespace hybra::backend::cpu
