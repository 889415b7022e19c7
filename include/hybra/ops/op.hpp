#pragma once
// The op contract. An op is a struct in hybra::op that carries every facet
// the layers above it read; ops/table.hpp lists each op once, and from that
// list the graph's registry (graph/registry.hpp), the gradient rules
// (autograd/gradients.hpp) and the model-file rows (io/mxnet_graph.hpp) are
// generated. Every facet but the name has a default, so a new facet touches
// no existing op; ops/table.hpp checks each op against this contract at
// compile time.
//
//   name            the op's name in graphs, errors and generated code
//   arity           how many operands; -1: one or more               [1]
//   eval(in, attrs) the eager op on tensors, attributes parsed from the
//                   node's text; inference runs it on meta tensors, so each
//                   op has one shape rule and one set of errors
//                                 [elementwise: the op on the fused loop]
//   eval_into(in, out, attrs)  the eager op writing its result into `out`, a
//                   CPU tensor of the result's shape and dtype: a CPU plan
//                   runs it into the value's planned buffer, where eval
//                   would allocate (and fault in) a fresh one per call
//                                                   [none: eval's result]
//   multiply_adds(in, out)  a product's work (meta tensors will do), by
//                   which the CPU plan sizes a call     [none: bytes-bound]
//   cuda_launch(in, out, attrs, gpu)  the op's GPU work as launches a plan
//                   runs in its own buffers and records into a CUDA graph
//                   (backend/cuda/launch.hpp); nullopt where the eager op must
//                   run                               [none: the eager op]
//   gradient(g)     the operands' gradients, a template over autograd's
//                   builder `g` (g.in, g.out, g.dy, g.attrs, g.wanted, and
//                   the symbolic functions as g.sum, g.where, ...)
//                   [required unless gradient_only; `g.grads()`: none flows]
//   decompose(c)    the op as a composition of others, a template over the
//                   graph's rule context `c` (graph/compose.hpp: c.in,
//                   c.attrs, c.sqrt, ...); graphs use it so that its parts
//                   fuse with their neighbours; an undefined symbol keeps
//                   the node whole                        [none: a primitive]
//   mxnet           MXNet's spellings (the first is written, all are read),
//   write(w), read(r)  the node as MXNet's and back, templates over the
//                   model-file layer's Writing and Reading
//                   [elementwise: from their spellings; required otherwise
//                    unless gradient_only]
//   gradient_only   made only by gradient rules: never in a user's graph or
//                   in a model file                                 [false]
//   pure            the result depends on the operands alone (dropout's
//                   does not): common sub-expressions may merge it  [true]
//   product         a product whose result a fused elementwise group may
//                   rewrite in place as its epilogue                [false]
#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "attrs.hpp"

namespace hybra::op {

// Elementwise ops have a dtype rule and a scalar function (ops/elementwise.hpp).
template <class Op>
concept elementwise = requires { Op::rule; };

template <class Op>
inline constexpr int arity_of = [] {
  if constexpr (requires { Op::arity; }) return Op::arity;
  else return 1;
}();

template <class Op>
inline constexpr bool gradient_only = [] {
  if constexpr (requires { Op::gradient_only; }) return Op::gradient_only;
  else return false;
}();

template <class Op>
inline constexpr bool pure = [] {
  if constexpr (requires { Op::pure; }) return Op::pure;
  else return true;
}();

template <class Op>
inline constexpr bool product = [] {
  if constexpr (requires { Op::product; }) return Op::product;
  else return false;
}();

// Whether gradient(g) exists for autograd's builder type G.
template <class Op, class G>
concept differentiable = requires(const G& g) { Op::gradient(g); };

template <class Op>
concept exported = elementwise<Op> || requires { Op::mxnet; };

template <class Op>
concept has_multiply_adds = requires { &Op::multiply_adds; };

template <class Op>
concept has_eval_into = requires { &Op::eval_into; };

template <class Op>
concept has_cuda_launch = requires { &Op::cuda_launch; };

// A node of `op` over symbols: how an op's public function, given symbols,
// adds its node to the graph being built without naming the graph layer
// above it (graph/symbol.hpp defines it, for S = Symbol).
template <class S>
S make_node(std::string name, op::Attrs attrs, std::vector<S> inputs);

}  // namespace hybra::op
