#pragma once
// hybra's version: the one place it is written. CMakeLists.txt reads it into
// project(), and from there the CMake package (hybraConfigVersion.cmake) and
// pkg-config's hybra.pc take it. HYBRA_VERSION orders versions as integers
// for the preprocessor (0.1.0 is 100, 1.2.3 is 10203).
#include <string_view>

#define HYBRA_VERSION_MAJOR 0
#define HYBRA_VERSION_MINOR 1
#define HYBRA_VERSION_PATCH 0
#define HYBRA_VERSION (HYBRA_VERSION_MAJOR * 10000 + HYBRA_VERSION_MINOR * 100 + HYBRA_VERSION_PATCH)
#define HYBRA_VERSION_TEXT(major, minor, patch) #major "." #minor "." #patch
#define HYBRA_VERSION_TEXT_OF(major, minor, patch) HYBRA_VERSION_TEXT(major, minor, patch)

namespace hybra {

// "major.minor.patch".
inline constexpr std::string_view version =
    HYBRA_VERSION_TEXT_OF(HYBRA_VERSION_MAJOR, HYBRA_VERSION_MINOR, HYBRA_VERSION_PATCH);

}  // namespace hybra
