#pragma once
// The sizes of a convolution and of a pooling, which the CPU ops (conv.hpp,
// conv_backward.hpp) and the GPU's launches (ops/conv_cuda.hpp) share. The
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

// What a convolution kernel computes: the output, or one of the two gradients.
enum class ConvPass { forward, backward_data, backward_weight };

// Where a forward convolution's input and output keep their channels in
// memory: NCHW, as every tensor does, or NHWC, which a captured CPU plan
// keeps between the convolutions oneDNN computes (jit/channels_last.hpp),
// so that no reorder runs between them.
enum class Channels { first, last };
struct ConvLayouts {
  Channels input = Channels::first, output = Channels::first;
};

// A pooling's sizes: input (N, C, H, W), window KH x KW, output (N, C, OH, OW).
struct Pool2dGeometry {
  std::int64_t N, C, H, W, KH, KW, OH, OW, sh, sw, ph, pw;
};

// How many of a window's places along an axis an average divides by: with
// count_include_pad, the window up to the end of the padded input (the last
// window of a `full` pooling runs past it); without, the input it holds. The
// window starts at `start`, negative inside the padding. kernels/pool.cuh
// divides by the same.
inline std::int64_t pool_divisor_extent(std::int64_t start, std::int64_t size, std::int64_t extent, std::int64_t pad,
                                        bool count_include_pad) {
  const std::int64_t end = start + size;
  if (count_include_pad) return (end < extent + pad ? end : extent + pad) - start;
  return (end < extent ? end : extent) - (start > 0 ? start : 0);
}

}  // namespace hybra::detail::nn
