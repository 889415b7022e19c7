// expect: must be included before any other hybra header
// A header included first has already left the HYBRA_SEPARABLE definitions out.
#define HYBRA_SEPARATE_COMPILATION
#include <hybra/core/separate_compilation.hpp>
#include <hybra/src.hpp>
