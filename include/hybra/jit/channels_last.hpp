#pragma once
// Which values of a captured CPU plan (plan.hpp) stay NHWC. oneDNN's forward
// convolutions read and write NHWC (ops/conv_onednn.hpp); an eager call
// reorders its NCHW input to NHWC and its result back, two passes over
// activations that its kernel reads and writes once. A value that such a
// convolution writes and only such convolutions read needs neither: the plan
// keeps it NHWC, and runs the epilogue of the convolution that writes it
// (BatchNorm's multiply and add, the residual add, ReLU) over it as an
// (N, H, W, C) loop. The bits are the eager op's: the same primitive, the
// same epilogue arithmetic per element.
#include <cstddef>
#include <vector>

#include "../core/tensor.hpp"
#include "../expr/evaluate.hpp"
#include "../graph/graph.hpp"

namespace hybra::jit::detail {

// onednn_conv[i]: node i is a conv2d step whose kernel is oneDNN's. Value i
// stays NHWC when its node is such a step, it is not an output of the graph,
// and every node that reads it is such a step, reading it as the
// convolution's input or in its epilogue (not as weights or bias). An
// epilogue reads its operands through their layouts, so one in the other
// layout than the step's result (a residual from a pooling, say) is read
// through a permutation, correctly.
inline std::vector<bool> channels_last_values(const graph::Graph& g, const std::vector<bool>& onednn_conv) {
  std::vector<bool> nhwc = onednn_conv;
  for (int o : g.outputs) nhwc[static_cast<std::size_t>(o)] = false;
  for (std::size_t j = 0; j < g.nodes.size(); ++j) {
    const auto& n = g.nodes[j];
    for (std::size_t p = 0; p < n.inputs.size(); ++p) {
      const bool read_as_activation = onednn_conv[j] && (p == 0 || p >= graph::own_inputs(n));
      if (!read_as_activation) nhwc[static_cast<std::size_t>(n.inputs[p])] = false;
    }
  }
  return nhwc;
}

// Operand `layout` of a loop over a step's result of NCHW shape `nchw` (the
// operand of that shape, or broadcast to it), as the loop reads it: in dims
// (N, H, W, C) where the result lies NHWC (`out_nhwc`), else (N, C, H, W);
// the operand's own elements lying NHWC where `nhwc`.
inline Tensor loop_layout(const Tensor& layout, const Shape& nchw, bool nhwc, bool out_nhwc) {
  Strides s;
  if (nhwc) {
    const Shape& d = layout.shape();
    s = hybra::detail::broadcast_strides(layout.view(d, {d[1] * d[2] * d[3], 1, d[3] * d[1], d[1]}, layout.offset()), nchw);
  } else {
    s = hybra::detail::broadcast_strides(layout, nchw);
  }
  if (!out_nhwc) return layout.view(nchw, s, layout.offset());
  return layout.view({nchw[0], nchw[2], nchw[3], nchw[1]}, {s[0], s[2], s[3], s[1]}, layout.offset());
}

}  // namespace hybra::jit::detail
