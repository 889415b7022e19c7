# Builds and runs tests/consumer the way a user would (see tests/CMakeLists.txt):
#   MODE=find_package      install hybra from BUILD_DIR into a fresh prefix, then
#                          find_package(hybra 0.1 CONFIG REQUIRED) with CMAKE_PREFIX_PATH=<prefix>;
#                          and the same program built by the compiler alone with
#                          `pkg-config --cflags --libs hybra` from that prefix
#   MODE=add_subdirectory  add_subdirectory(<hybra source tree>)
# Prints PASS/FAIL; fails on any error.
cmake_minimum_required(VERSION 3.25)
foreach(var MODE SOURCE_DIR BUILD_DIR WORK_DIR GENERATOR CXX)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run.cmake: -D${var}=... is required")
  endif()
endforeach()

function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "FAIL: consumer (${MODE}): ${what} failed (${rc})\n$ ${ARGN}\n${out}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

set(work ${WORK_DIR}/${MODE})
set(prefix ${work}/prefix)
set(bin ${work}/build)
file(REMOVE_RECURSE ${work})

set(configure ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumer -B ${bin} -G ${GENERATOR}
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX})
if(MAKE_PROGRAM)
  list(APPEND configure -DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM})
endif()
if(LAUNCHER)
  list(APPEND configure -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER})
endif()

if(MODE STREQUAL "find_package")
  step("cmake --install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
  step("configure against the installed package" ${configure} -DCMAKE_PREFIX_PATH=${prefix})
  # The package must come from this prefix, not from anywhere else on the machine.
  file(STRINGS ${bin}/CMakeCache.txt hybra_dir REGEX "^hybra_DIR:")
  string(REGEX REPLACE "^hybra_DIR:[A-Z]+=" "" hybra_dir "${hybra_dir}")
  file(REAL_PATH "${prefix}" real_prefix)
  file(REAL_PATH "${hybra_dir}" real_hybra_dir)
  string(FIND "${real_hybra_dir}" "${real_prefix}/" at)
  if(NOT at EQUAL 0)
    message(FATAL_ERROR "FAIL: consumer (find_package): hybra was found in '${hybra_dir}', not under ${prefix}")
  endif()
elseif(MODE STREQUAL "add_subdirectory")
  # Built with clang++ where there is one (tests/CMakeLists.txt), whose
  # warnings come from its front end: -O0 checks them in a fraction of -O3's
  # compile time. GCC's, some of which need the optimiser, are checked by the
  # find_package build at -O3.
  step("configure with add_subdirectory" ${configure} -DCMAKE_CXX_FLAGS_RELEASE=-O0
       -DHYBRA_CONSUMER_ADD_SUBDIRECTORY=ON -DHYBRA_SOURCE_DIR=${SOURCE_DIR})
else()
  message(FATAL_ERROR "run.cmake: unknown MODE '${MODE}'")
endif()

step("build" ${CMAKE_COMMAND} --build ${bin})
step("run" ${bin}/consumer)
string(STRIP "${step_output}" result)

# Without CMake: the same program built with the flags pkg-config gives for
# the installed hybra.pc, and the version pkg-config reads checked against
# the headers'.
if(MODE STREQUAL "find_package")
  find_program(PKG_CONFIG pkg-config REQUIRED)
  file(GLOB_RECURSE pc_file ${prefix}/hybra.pc)
  get_filename_component(pc_dir "${pc_file}" DIRECTORY)
  set(ENV{PKG_CONFIG_PATH} "${pc_dir}")
  step("pkg-config --modversion hybra" ${PKG_CONFIG} --modversion hybra)
  string(STRIP "${step_output}" pc_version)
  step("pkg-config --cflags --libs hybra" ${PKG_CONFIG} --cflags --libs hybra)
  separate_arguments(pc_flags UNIX_COMMAND "${step_output}")
  # At -O0: the CMake build above checked the warnings of optimised code.
  step("build with pkg-config's flags" ${CXX} -O0 -Wall -Wextra -Werror ${SOURCE_DIR}/tests/consumer/main.cpp
       "-DHYBRA_CONSUMER_EXPECTS_VERSION=\"${pc_version}\"" -o ${work}/consumer_pkg_config ${pc_flags})
  step("run the pkg-config build" ${work}/consumer_pkg_config)
  string(STRIP "${step_output}" pc_result)
  string(APPEND result "\n  through pkg-config: ${pc_result}")
endif()
message(STATUS "PASS: consumer (${MODE}): ${result}")
