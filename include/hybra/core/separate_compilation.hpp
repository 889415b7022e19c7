#pragma once
// hybra is header-only, and a translation unit that uses it compiles the
// tables that name every op (the graph registry, the gradient rules, the
// MXNet spellings) and with them every op's kernels for every dtype: about
// 11 s of compiler time per translation unit at -O1. A program of many
// translation units can compile them once instead (docs/architecture.md,
// "Separate compilation"): define HYBRA_SEPARATE_COMPILATION in every one of
// them, and include <hybra/src.hpp> in exactly one. The other translation
// units see only the declarations of the functions marked HYBRA_SEPARABLE.
//
// The same holds for the eager forwards of hybra's own layers and the updates
// of its optimizers, each of which instantiates its fused expressions: a class
// template's members named by HYBRA_SEPARABLE_CLASS right after the class
// they are for are instantiated in <hybra/src.hpp>'s translation unit alone.
//
// HYBRA_DEFINE_SEPARABLE is decided at the first hybra header a translation
// unit includes, which for the defining one must be <hybra/src.hpp>.
#if defined(HYBRA_SEPARATE_COMPILATION)
#define HYBRA_SEPARABLE
#if defined(HYBRA_SEPARATE_COMPILATION_SOURCE)
#define HYBRA_DEFINE_SEPARABLE 1
#define HYBRA_SEPARABLE_CLASS(...) template class __VA_ARGS__
#else
#define HYBRA_DEFINE_SEPARABLE 0
#define HYBRA_SEPARABLE_CLASS(...) extern template class __VA_ARGS__
#endif
#else
#define HYBRA_SEPARABLE inline
#define HYBRA_DEFINE_SEPARABLE 1
#define HYBRA_SEPARABLE_CLASS(...) static_assert(true)
#endif
