# Shared by the build tree and the installed package, so a consumer's
# find_package(hybra) resolves exactly what the build tree uses.
include(CMakeFindDependencyMacro)
find_dependency(Boost 1.81 CONFIG)
find_dependency(OpenMP)
set(BLA_VENDOR OpenBLAS)
find_dependency(BLAS)

function(hybra_link_dependencies target)
  target_link_libraries(${target} INTERFACE Boost::headers OpenMP::OpenMP_CXX BLAS::BLAS m)
  # -fno-math-errno lets GCC call glibc's vector math (libmvec) for exp/tanh
  # inside fused loops; without it every transcendental stays scalar (~10x).
  target_compile_options(${target} INTERFACE
    $<$<COMPILE_LANG_AND_ID:CXX,GNU,Clang>:-fno-math-errno>)
endfunction()
