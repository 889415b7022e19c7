#pragma once
// One elementwise op of the table on tensors, the op chosen at run time: a
// fused program of one instruction, run by the CPU's fused loop
// (backend/cpu/fused_loop.hpp) or as a kernel on a GPU (expr/cuda_eager.hpp).
// A graph's lone elementwise node runs this way (graph/registry.hpp), and so
// does each node of an eager expression evaluated node by node (mixed dtypes,
// autograd: expr/evaluate.hpp), so that those paths compile once instead of
// once per expression type.
#include <array>
#include <memory>
#include <span>
#include <string_view>
#include <tuple>
#include <vector>

#include "../backend/cpu/fused_loop.hpp"
#include "cuda_eager.hpp"

namespace hybra::detail {

// Operands are converted to the dtype the op computes in first, as an
// unfused eager expression converts them; a condition (where) first becomes
// 1/0. Scalars arrive as 0-d tensors of the node's common dtype.
inline Tensor run_elementwise(int index, op::DTypeRule rule, std::string_view name, std::span<const Tensor> in) {
  const std::size_t first = rule == op::DTypeRule::select ? 1 : 0;
  Shape shape;
  for (const auto& t : in) {
    t.require(name.data());
    require_same_device(name, in.front(), t);
    shape = broadcast_shapes(shape, t.shape(), name);
  }
  DType common = in[first].dtype();
  for (std::size_t k = first; k < in.size(); ++k) common = promote_types(common, in[k].dtype());
  // The 16-bit floats compute in float32 and round once, into the result.
  if (is_half(common)) {
    std::vector<Tensor> wide(in.begin(), in.end());
    for (std::size_t k = first; k < wide.size(); ++k)
      if (is_half(wide[k].dtype())) wide[k] = wide[k].astype(DType::float32);
    return run_elementwise(index, rule, name, wide).astype(common);
  }
  const DType compute = rule == op::DTypeRule::promote_float && !is_floating(common) ? DType::float32 : common;
  std::vector<Tensor> operands;
  for (std::size_t k = 0; k < in.size(); ++k) {
    Tensor t = in[k];
    if (k < first && t.dtype() != compute)
      t = run_elementwise(op::elementwise_index<op::not_equal>(), op::not_equal::rule, "not_equal",
                          std::vector<Tensor>{t, zeros({}, t.dtype(), t.device())});
    operands.push_back(t.dtype() == compute ? t : t.astype(compute));
  }
  backend::cpu::FusedProgram program;
  program.dtype = compute;
  program.inputs = static_cast<int>(operands.size());
  program.registers = program.inputs + 1;
  program.result = program.inputs;
  program.code.push_back({index, program.inputs, {0, operands.size() > 1 ? 1 : 0, operands.size() > 2 ? 2 : 0}});
  Tensor out(shape, compute, in.front().device());
  if (out.device().kind == DeviceKind::cuda) {
    // Never destroyed, as push_fused_cuda's: queued ops may outlive statics.
    static auto& kernels = *new std::array<CudaExpressionKernels, std::tuple_size_v<op::elementwise_ops>>;
    leaf_list leaves;
    for (const auto& t : operands) leaves.push_back(&t);
    push_fused_program_cuda(
        name, kernels[static_cast<std::size_t>(index)],
        [](const void* p) { return *static_cast<const backend::cpu::FusedProgram*>(p); }, &program, leaves, out, {});
    return out;
  }
  auto loop = std::make_shared<const backend::cpu::FusedLoop>(std::move(program), operands, shape);
  push_kernel(name, operands, {out}, [loop, operands, out] {
    boost::container::small_vector<const void*, 3> ptrs;
    for (const auto& t : operands) ptrs.push_back(t.raw_data());
    loop->run(ptrs.data(), out.raw_data());
  });
  return out;
}

}  // namespace hybra::detail
