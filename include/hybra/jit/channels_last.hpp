#pragma once
// Which values of a captured CPU plan (plan.hpp) stay NHWC. oneDNN's forward
// convolutions read and write NHWC (ops/conv_onednn.hpp); an eager call
// reorders its NCHW input to NHWC and its result back, two passes over
// activations that its kernel reads and writes once. A value that such a
// convolution writes and only such convolutions read needs neither: the plan
// keeps it NHWC, and runs the epilogue of the convolution that writes it
// (BatchNorm's multiply and add, the residual add, ReLU) over it as an
// (N, H, W, C) loop. Poolings between them (VGG's, ResNet's first) keep it
// too: hybra's pooling kernel has an NHWC form (ops/pool.hpp). The bits are
// the eager ops': the same primitive, the same arithmetic per element.
#include <cstddef>
#include <vector>

#include "../core/tensor.hpp"
#include "../expr/evaluate.hpp"
#include "../graph/graph.hpp"

namespace hybra::jit::detail {

// onednn_conv[i]: node i is a conv2d step whose kernel is oneDNN's; pool[i]:
// a pool step (hybra's pooling kernel, which reads and writes either layout,
// its result lying as its input). Value i stays NHWC when its node is such a
// step, it is not an output of the graph, every node that reads it reads
// NHWC there (a oneDNN convolution as its input or in its epilogue, not as
// weights or bias; a pooling), and where a pooling reads it or writes it, the
// pooling's other value stays NHWC too. An epilogue reads its operands
// through their layouts, so one in the other layout than the step's result
// (a residual from an NCHW value, say) is read through a permutation,
// correctly.
inline std::vector<bool> channels_last_values(const graph::Graph& g, const std::vector<bool>& onednn_conv,
                                              const std::vector<bool>& pool) {
  const std::size_t count = g.nodes.size();
  std::vector<bool> nhwc(count);
  for (std::size_t i = 0; i < count; ++i) nhwc[i] = onednn_conv[i] || pool[i];
  for (int o : g.outputs) nhwc[static_cast<std::size_t>(o)] = false;
  for (std::size_t j = 0; j < count; ++j) {
    const auto& n = g.nodes[j];
    for (std::size_t p = 0; p < n.inputs.size(); ++p) {
      const bool reads_nhwc = (onednn_conv[j] && (p == 0 || p >= graph::own_inputs(n))) || (pool[j] && p == 0);
      if (!reads_nhwc) nhwc[static_cast<std::size_t>(n.inputs[p])] = false;
    }
  }
  // Only a pooling ties two values' layouts: settle the pairs (a value made
  // NCHW makes no other pair's value change but through them).
  for (bool changed = true; changed;) {
    changed = false;
    for (std::size_t j = 0; j < count; ++j) {
      if (!pool[j]) continue;
      const auto in = static_cast<std::size_t>(g.nodes[j].inputs[0]);
      if (nhwc[j] == nhwc[in]) continue;
      nhwc[j] = nhwc[in] = false;
      changed = true;
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
