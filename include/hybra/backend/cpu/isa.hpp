#pragma once
// The one instruction-set dispatch of the CPU kernels: a kernel comes in
// three builds of one template, AVX-512 and AVX2 (GCC's target attribute, on
// x86-64 only; `flatten` inlines its tiles, so each is compiled for its
// target) and generic. runnable_variants lists the builds this CPU can run,
// fastest first; the kernel calls the first, and the tests run every one.
#include <vector>

namespace hybra::backend::cpu {

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define HYBRA_ISA_VARIANTS 1
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
