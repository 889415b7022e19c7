// expect: define HYBRA_SEPARATE_COMPILATION in all of them
// <hybra/src.hpp> only makes sense in a separately compiled program.
#include <hybra/src.hpp>
