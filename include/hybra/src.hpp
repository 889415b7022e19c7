#pragma once
// The one translation unit of a separately compiled program
// (core/separate_compilation.hpp) that defines hybra's HYBRA_SEPARABLE
// functions: a source file that includes this header and nothing else.
#if !defined(HYBRA_SEPARATE_COMPILATION)
#error "hybra/src.hpp defines what separate compilation leaves out of the other translation units: define HYBRA_SEPARATE_COMPILATION in all of them"
#elif defined(HYBRA_DEFINE_SEPARABLE)
// A hybra header included earlier has already left the definitions out.
#error "hybra/src.hpp must be included before any other hybra header of its translation unit"
#else
#define HYBRA_SEPARATE_COMPILATION_SOURCE
#include "hybra.hpp"
#endif
