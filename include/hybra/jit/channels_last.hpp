#pragma once
// Which values of a captured CPU plan (plan.hpp) stay NHWC. oneDNN's forward
// convolutions read and write NHWC (ops/conv_onednn.hpp); an eager call
// reorders its NCHW input to NHWC and its result back, two passes over
// activations that its kernel reads and writes once. Values between such
// convolutions need neither: the plan keeps them NHWC. Between them may lie
// poolings (VGG's, ResNet's first: hybra's pooling kernel has an NHWC form,
// ops/pool.hpp), elementwise loops (DenseNet's BatchNorm and ReLU before each
// convolution, the epilogues of the convolutions) and concatenations
// (DenseNet's): each writes its value in its operands' layout. The bits are
// the NCHW plan's: the same primitives, the same arithmetic per element.
//
// An NHWC value's layout says so: its tensor keeps the NCHW shape, with
// NHWC's strides (channels_last_layout), so that whatever reads it through
// its strides (a concatenation's copy, a loop) reads it right.
#include <cstddef>
#include <vector>

#include "../core/tensor.hpp"
#include "../expr/evaluate.hpp"
#include "../graph/graph.hpp"

namespace hybra::jit::detail {

// How a CPU plan's step treats layouts.
enum class LayoutRole {
  fixed,        // reads its operands NCHW and writes NCHW: every other step
  onednn_conv,  // oneDNN's forward convolution: reads its input and its epilogue's operands, and writes, in either
  pool,         // hybra's windowed pooling: writes its input's layout
  follows,      // a loop or a concatenation of 4-d values: writes the layout of the operands it is tied to
};

// Whether node n's operand p must lie as n's value: a pooling's input; a
// concatenation's parts; a loop's operands of its result's shape (a
// broadcast one, a per-channel scale, is read through its strides either way).
inline bool tied(const graph::Graph& g, const graph::Node& n, LayoutRole role, std::size_t p) {
  if (role == LayoutRole::pool) return p == 0;
  if (role != LayoutRole::follows) return false;
  return n.op == "concat" || g.nodes[static_cast<std::size_t>(n.inputs[p])].meta.shape == n.meta.shape;
}

// Value i stays NHWC when its step's role is not fixed, it is not an output
// of the graph, every node that reads it reads NHWC there (a oneDNN
// convolution as its input or in its epilogue, not as weights or bias; a
// pooling; a loop; a concatenation), and every value tied to it stays NHWC
// too. A loop reads an operand that is not tied to its result through
// the operand's strides, correctly in either layout.
inline std::vector<bool> channels_last_values(const graph::Graph& g, const std::vector<LayoutRole>& role) {
  const std::size_t count = g.nodes.size();
  std::vector<bool> nhwc(count);
  for (std::size_t i = 0; i < count; ++i) nhwc[i] = role[i] != LayoutRole::fixed;
  for (int o : g.outputs) nhwc[static_cast<std::size_t>(o)] = false;
  for (std::size_t j = 0; j < count; ++j) {
    const auto& n = g.nodes[j];
    for (std::size_t p = 0; p < n.inputs.size(); ++p) {
      const bool reads_nhwc = (role[j] == LayoutRole::onednn_conv && (p == 0 || p >= graph::own_inputs(n))) ||
                              (role[j] == LayoutRole::pool && p == 0) || role[j] == LayoutRole::follows;
      if (!reads_nhwc) nhwc[static_cast<std::size_t>(n.inputs[p])] = false;
    }
  }
  // Settle the ties: a value made NCHW makes the values tied to it NCHW.
  for (bool changed = true; changed;) {
    changed = false;
    for (std::size_t j = 0; j < count; ++j) {
      const auto& n = g.nodes[j];
      for (std::size_t p = 0; p < n.inputs.size(); ++p) {
        const auto in = static_cast<std::size_t>(n.inputs[p]);
        if (!tied(g, n, role[j], p) || nhwc[j] == nhwc[in]) continue;
        nhwc[j] = nhwc[in] = false;
        changed = true;
      }
    }
  }
  return nhwc;
}

// An NCHW layout's NHWC form: the same shape, channels innermost.
inline Tensor channels_last_layout(const Tensor& nchw) {
  const Shape& d = nchw.shape();
  return nchw.view(d, {d[1] * d[2] * d[3], 1, d[3] * d[1], d[1]}, nchw.offset());
}

// Operand `layout` (its own strides: NCHW or NHWC) of a loop over an NHWC
// result of NCHW shape `nchw`, as that loop reads it: in dims (N, H, W, C),
// broadcast where the operand is.
inline Tensor loop_layout(const Tensor& layout, const Shape& nchw) {
  const Strides s = hybra::detail::broadcast_strides(layout, nchw);
  return layout.view({nchw[0], nchw[2], nchw[3], nchw[1]}, {s[0], s[2], s[3], s[1]}, layout.offset());
}

}  // namespace hybra::jit::detail
