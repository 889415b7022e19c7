# Shared by the build tree and the installed package, so a consumer's
# find_package(hybra) resolves exactly what the build tree uses.
include(CMakeFindDependencyMacro)
# Boost.JSON (model files, include/hybra/io/) is Boost's one compiled library hybra uses.
find_dependency(Boost 1.81 CONFIG COMPONENTS json)
# HYBRA_OPENMP is hybra's own option (CMakeLists.txt); a consumer of the
# installed package does not set it, and then finds OpenMP in case the
# exported target links it.
if(NOT DEFINED HYBRA_OPENMP OR HYBRA_OPENMP)
  find_dependency(OpenMP)
endif()
# OpenBLAS (backend/cpu/blas.hpp calls its own API too: blasint,
# openblas_set_num_threads). A package's config runs in its consumer's
# scope, so the consumer's own BLA_VENDOR, set or not, is put back after.
set(hybra_consumer_bla_vendor_defined FALSE)
if(DEFINED BLA_VENDOR)
  set(hybra_consumer_bla_vendor_defined TRUE)
  set(hybra_consumer_bla_vendor "${BLA_VENDOR}")
endif()
set(BLA_VENDOR OpenBLAS)
find_dependency(BLAS)
if(hybra_consumer_bla_vendor_defined)
  set(BLA_VENDOR "${hybra_consumer_bla_vendor}")
else()
  unset(BLA_VENDOR)
endif()
# zlib reads the gzip-compressed IDX files of datasets (include/hybra/data/).
find_dependency(ZLIB)

function(hybra_link_dependencies target)
  # CMAKE_DL_LIBS: dlopen, through which hybra reaches CUDA (backend/cuda/library.hpp).
  target_link_libraries(${target} INTERFACE Boost::headers Boost::json BLAS::BLAS ZLIB::ZLIB m ${CMAKE_DL_LIBS})
  if(HYBRA_OPENMP)
    target_link_libraries(${target} INTERFACE OpenMP::OpenMP_CXX)
  else()
    # -fopenmp-simd keeps the `#pragma omp simd` loops vectorised without
    # the OpenMP runtime (and does not define _OPENMP).
    target_compile_options(${target} INTERFACE
      $<$<COMPILE_LANG_AND_ID:CXX,GNU,Clang>:-fopenmp-simd>)
    if(HYBRA_THREAD_LOOPS)
      target_compile_definitions(${target} INTERFACE HYBRA_THREAD_LOOPS)
    endif()
  endif()
  # oneDNN by name (-ldnnl), so that the installed target needs no path of this machine.
  if(HYBRA_WITH_ONEDNN)
    target_link_libraries(${target} INTERFACE dnnl)
    target_compile_definitions(${target} INTERFACE HYBRA_WITH_ONEDNN=1)
  endif()
  # -fno-math-errno lets GCC call glibc's vector math (libmvec) for exp/tanh
  # inside fused loops; without it every transcendental stays scalar (~10x).
  target_compile_options(${target} INTERFACE
    $<$<COMPILE_LANG_AND_ID:CXX,GNU,Clang>:-fno-math-errno>)
  # clang says of each `omp simd` loop it keeps scalar (-Wpass-failed) in
  # every program; built without debug information the note has no source
  # location, so the pragma around hybra.hpp cannot silence it.
  target_compile_options(${target} INTERFACE
    $<$<COMPILE_LANG_AND_ID:CXX,Clang>:-Wno-pass-failed>)
endfunction()
