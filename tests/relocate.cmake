# A copy of hybra's headers and kernels/ somewhere else, with a marker file in
# each that the source tree does not have (tests/CMakeLists.txt,
# unit_cuda_relocated): cmake -DSOURCE=<tree> -DTARGET=<dir> -P relocate.cmake
file(REMOVE_RECURSE ${TARGET})
file(COPY ${SOURCE}/include/hybra DESTINATION ${TARGET}/include)
file(COPY ${SOURCE}/kernels DESTINATION ${TARGET}/device)
file(WRITE ${TARGET}/include/hybra/relocated_marker.hpp "#pragma once\n")
file(WRITE ${TARGET}/device/kernels/relocated_marker.cuh "#pragma once\n")
