#pragma once
// CUDA source for a fused elementwise program (backend/cpu/fused_loop.hpp's
// FusedProgram, what a captured graph's fused groups and an eager
// expression's ops become): one kernel, one thread per element, each
// instruction a call of its op's `apply` from the op table, which NVRTC
// compiles from ops/elementwise.hpp itself, so the GPU computes what the
// CPU loops compute, from the same line of code.
//
// The kernel's name is a hash of its body: the same program always gets the
// same source, and so one compile for the kernel cache (kernel_cache.hpp).
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "../backend/cpu/fused_loop.hpp"
#include "print.hpp"
#include "../backend/cuda/kernel_cache.hpp"
#include "../backend/cuda/source.hpp"
#include "../ops/elementwise.hpp"
#include "../backend/cuda/ptx.hpp"

namespace hybra::expr {


namespace detail {
struct ElementwiseOp {
  std::string_view name;
  int arity;
  op::DTypeRule rule;
};
inline const auto& elementwise_op_table() {
  static const auto table = []<std::size_t... I>(std::index_sequence<I...>) {
    return std::array<ElementwiseOp, sizeof...(I)>{ElementwiseOp{std::tuple_element_t<I, op::elementwise_ops>::name,
                                                                 std::tuple_element_t<I, op::elementwise_ops>::arity,
                                                                 std::tuple_element_t<I, op::elementwise_ops>::rule}...};
  }(std::make_index_sequence<std::tuple_size_v<op::elementwise_ops>>{});
  return table;
}

// A constant as a literal of the program's type, exactly: floats in hex, and
// infinities and NaNs (which have no literal) by their bits.
inline std::string cuda_literal(const backend::cpu::FusedProgram::Constant& c, DType d) {
  char text[64];
  if (is_floating(d) && !std::isfinite(c.real))
    std::snprintf(text, sizeof text, "__longlong_as_double(0x%016llxLL)", std::bit_cast<unsigned long long>(c.real));
  else if (is_floating(d))
    std::snprintf(text, sizeof text, "%a", c.real);
  else
    std::snprintf(text, sizeof text, "%lldLL", static_cast<long long>(c.integer));
  return text;
}
}  // namespace detail


// How a program's constants reach its kernel: as literals of the code (a
// captured graph's, whose constants are part of the graph), or as parameters
// after the element count, in the program's order (an eager expression's,
// whose kernel serves every value of its scalars).
enum class KernelConstants { literals, parameters };

// Parameters: the inputs (const T*, one per input register), the output
// (T*, contiguous), the element count (long long), then the constants
// when they are parameters (T, by value). Without `strides`
// every input is contiguous in the result's shape and is read at the
// element's own index. strides[k], when not empty, are input k's strides
// over the result's `shape` (0 on the axes it is broadcast along: expr's
// broadcast_strides): a broadcast operand or a view, read at the offset the
// element's coordinates give. Shapes and strides are constants of the code,
// so such a kernel serves one layout.
inline backend::cuda::CudaKernel cuda_elementwise_kernel(const backend::cpu::FusedProgram& p, const Shape& shape = {},
                                                         std::span<const Strides> strides = {},
                                                         KernelConstants constants = KernelConstants::literals) {
  const std::string T(backend::cuda::cuda_type(p.dtype));
  const bool strided = std::any_of(strides.begin(), strides.end(), [](const Strides& st) { return !st.empty(); });
  std::string constant_params;
  if (constants == KernelConstants::parameters)
    for (std::size_t k = 0; k < p.constants.size(); ++k) constant_params += ", " + T + " k" + std::to_string(k);
  // One element's code, its registers suffixed with `u`, at index `i`: its
  // loads, its arithmetic, its store.
  struct Element {
    std::string loads, compute, store;
  };
  auto element = [&](const std::string& u, const std::string& i) {
    auto reg = [&](int r) { return "r" + std::to_string(r) + u; };
    Element e;
    if (strided) {
      e.loads += "    long long rest = " + i + ";\n";
      for (std::size_t d = shape.size(); d-- > 0;)
        e.loads += d ? "    const long long c" + std::to_string(d) + " = rest % " + std::to_string(shape[d]) +
                           "LL; rest /= " + std::to_string(shape[d]) + "LL;\n"
                     : "    const long long c0 = rest;\n";
    }
    for (int k = 0; k < p.inputs; ++k) {
      std::string index = i;
      if (static_cast<std::size_t>(k) < strides.size() && !strides[static_cast<std::size_t>(k)].empty()) {
        const Strides& st = strides[static_cast<std::size_t>(k)];
        if (st.size() != shape.size())
          fail<ShapeError>("cuda: input ", k, " has strides for ", st.size(), " dims over a result of ", shape.size());
        index.clear();
        for (std::size_t d = 0; d < st.size(); ++d)
          if (st[d] != 0) index += (index.empty() ? "" : " + ") + ("c" + std::to_string(d) + " * " + std::to_string(st[d]) + "LL");
        if (index.empty()) index = "0";
      }
      e.loads += "    const T " + reg(k) + " = in" + std::to_string(k) + "[" + index + "];\n";
    }
    for (std::size_t k = 0; k < p.constants.size(); ++k) {
      const auto& c = p.constants[k];
      e.compute += "    const T " + reg(c.reg) + " = " +
                   (constants == KernelConstants::parameters ? "k" + std::to_string(k)
                                                             : "T(" + detail::cuda_literal(c, p.dtype) + ")") +
                   ";\n";
    }
    const auto& ops = detail::elementwise_op_table();
    for (const auto& ins : p.code) {
      if (ins.op < 0 || static_cast<std::size_t>(ins.op) >= ops.size())
        fail<ValueError>("cuda: fused program instruction names op #", ins.op, ", which is not in the op table");
      const auto& op = ops[static_cast<std::size_t>(ins.op)];
      std::string args;
      for (int a = 0; a < op.arity; ++a) {
        std::string operand = reg(ins.src[static_cast<std::size_t>(a)]);
        if (a == 0 && op.rule == op::DTypeRule::select) operand = "(" + operand + " != T(0))";
        args += (a ? ", " : "") + operand;
      }
      e.compute += "    const T " + reg(ins.dst) + " = static_cast<T>(hybra::op::" + std::string(op.name) +
                   "::apply<T>(" + args + "));\n";
    }
    e.store = "    out[" + i + "] = " + reg(p.result) + ";\n";
    return e;
  };

  // A grid-stride loop; where every operand is read at the element's own
  // index, four elements a turn, their loads first, so that a thread has
  // several in flight (what memory-bound chains need to reach the copy's
  // bandwidth), then the one-element loop for the rest.
  std::string loops;
  if (!strided) {
    std::string loads, compute, stores;
    for (int u = 0; u < 4; ++u) {
      const Element e = element("_" + std::to_string(u), "i" + std::to_string(u));
      loads += e.loads;
      compute += e.compute;
      stores += e.store;
    }
    loops += "  for (; i + 3 * stride < n; i += 4 * stride) {\n"
             "    const long long i0 = i, i1 = i + stride, i2 = i + 2 * stride, i3 = i + 3 * stride;\n" +
             loads + compute + stores + "  }\n";
  }
  const Element one = element("", "i");
  loops += "  for (; i < n; i += stride) {\n" + one.loads + one.compute + one.store + "  }\n";

  std::string params;
  for (int k = 0; k < p.inputs; ++k) params += "const " + T + "* __restrict__ in" + std::to_string(k) + ", ";
  backend::cuda::CudaKernel k;
  k.name = "hybra_fused_" + backend::cuda::fnv1a64_hex(T + constant_params + '\n' + loops);
  k.definition = "extern \"C\" __global__ void " + k.name + "(" + params + T + "* __restrict__ out, long long n" +
                 constant_params + ") {\n" +
                 "  using T = " + T + ";\n" +
                 "  const long long stride = static_cast<long long>(blockDim.x) * gridDim.x;\n" +
                 "  long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;\n" + loops + "}\n";
  return k;
}

// The fused program of an eager expression whose tensors share one dtype
// and whose result has it too (what the CPU runs as one flat loop): tensor
// leaves are the inputs in fold order, scalars constants of that dtype.
template <class E>
backend::cpu::FusedProgram fused_program(const E& e) {
  std::vector<DType> dtypes;
  auto collect = [&](const auto& value) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(value)>, Tensor>) dtypes.push_back(value.dtype());
    return 0;
  };
  auto ignore = [](auto, auto...) { return 0; };
  fold(e, collect, ignore);
  if (dtypes.empty()) fail<ValueError>("cuda: the expression ", to_string(e), " has no tensor");
  backend::cpu::FusedProgram p;
  p.dtype = dtypes.front();
  for (DType d : dtypes)
    if (d != p.dtype)
      fail<DTypeError>("cuda: ", to_string(e), " mixes ", name(p.dtype), " and ", name(d),
                       "; one kernel takes tensors of one dtype (convert with astype first)");
  dispatch(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (!std::is_same_v<kernel::result_t<E, T>, T>)
      fail<DTypeError>("cuda: ", to_string(e), " on ", name(p.dtype), " tensors computes another dtype; "
                       "one kernel computes in its tensors' dtype (convert with astype first)");
  });
  p.inputs = static_cast<int>(dtypes.size());
  int next_input = 0, next_register = p.inputs;
  auto leaf = [&](const auto& value) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(value)>, Tensor>) {
      return next_input++;
    } else {
      p.constants.push_back({next_register, static_cast<double>(value), static_cast<std::int64_t>(value)});
      return next_register++;
    }
  };
  auto node = [&]<class Op>(Op, auto... operands) {
    p.code.push_back({op::elementwise_index<Op>(), next_register, {operands...}});
    return next_register++;
  };
  p.result = fold(e, leaf, node);
  p.registers = next_register;
  return p;
}


}  // namespace hybra::expr
