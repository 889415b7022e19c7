# Runs one compile-fail test (see tests/CMakeLists.txt):
#   cmake -DCXX=<compiler> -DSOURCE=<file.cpp> -DINCLUDES=<dirs> -DDEFINES=<defs>
#         -DIMPLICIT=<compiler's own include dirs> -P check.cmake
# SOURCE's first line is `// expect: <regex>` (a CMake regular expression).
# Passes only if compiling SOURCE with -fsyntax-only FAILS and the compiler's
# output matches the regex, so the test checks that hybra's own static_assert
# fires, not just that something somewhere does not compile.
cmake_minimum_required(VERSION 3.25)
foreach(var CXX SOURCE)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check.cmake: -D${var}=... is required")
  endif()
endforeach()

file(STRINGS "${SOURCE}" first_line LIMIT_COUNT 1)
if(NOT first_line MATCHES "^// expect: (.+)$")
  message(FATAL_ERROR "FAIL: ${SOURCE} must start with a line `// expect: <regex>`")
endif()
set(expect "${CMAKE_MATCH_1}")

set(args -std=c++20 -fsyntax-only)
foreach(dir IN LISTS INCLUDES)
  if(dir AND NOT dir IN_LIST IMPLICIT)  # -I/usr/include would be ignored (GCC) or harmful
    list(APPEND args "-I${dir}")
  endif()
endforeach()
# As hybra's own programs are compiled (HYBRA_SEPARATE_COMPILATION), which
# halves the time a translation unit takes; a test of separate compilation
# itself (one that includes <hybra/src.hpp>) sets that macro as it needs.
file(READ "${SOURCE}" source_text)
if(NOT source_text MATCHES "#include <hybra/src.hpp>")
  list(APPEND args -DHYBRA_SEPARATE_COMPILATION)
endif()
foreach(def IN LISTS DEFINES)
  if(def)
    list(APPEND args "-D${def}")
  endif()
endforeach()

execute_process(COMMAND ${CXX} ${args} ${SOURCE}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
get_filename_component(name "${SOURCE}" NAME)
if(rc EQUAL 0)
  message(FATAL_ERROR "FAIL: ${name} compiled, but it must fail with: ${expect}")
endif()
if(NOT out MATCHES "${expect}")
  string(SUBSTRING "${out}" 0 6000 head)
  message(FATAL_ERROR "FAIL: ${name} failed to compile, but not with the expected message\n"
                      "  expected (regex): ${expect}\n  compiler said:\n${head}")
endif()
message(STATUS "PASS: ${name} fails to compile with: ${CMAKE_MATCH_0}")
