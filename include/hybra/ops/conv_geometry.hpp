#pragma once
// The sizes of a convolution and of a pooling, which the CPU ops (conv.hpp,
// conv_backward.hpp) and the GPU's launches (jit/cuda_conv.hpp) share. The
// GPU's kernels take them as parameters, as kernels/conv.cuh's
// conv_geometry and kernels/pool.cuh's pool_geometry: the fields and their
// order are the same there.
#include <cstdint>

namespace hybra::detail::nn {

// A convolution's sizes: input (N, C, H, W), weight (F, C / groups, KH, KW),
// output (N, F, OH, OW), and the window's stride, padding and dilation.
struct Conv2dGeometry {
  std::int64_t N, C, H, W, F, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, groups;
};

// A pooling's sizes: input (N, C, H, W), window KH x KW, output (N, C, OH, OW).
struct Pool2dGeometry {
  std::int64_t N, C, H, W, KH, KW, OH, OW, sh, sw, ph, pw;
};

}  // namespace hybra::detail::nn
