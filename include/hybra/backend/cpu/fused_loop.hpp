#pragma once
// Elementwise op-table ops chosen at run time, fused into one loop: what a
// captured graph's fused groups compile to (jit/plan.hpp), and how the
// graph evaluates a lone elementwise node (graph/registry.hpp).
//
// The ops are known only at run time, so the loop cannot be a C++
// expression template. It is a short program: each instruction is one
// tight, vectorised loop over a block of `block` elements held in L1 (the
// op's `apply`, instantiated ahead of time per op and dtype), so
// intermediate values never reach memory and the group costs one pass over
// its inputs and output. Instantiating one small loop per (op, dtype) also
// keeps a translation unit that uses graphs cheap to compile, where a Yap
// kernel per op would instantiate the whole fused-expression machinery.
#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "../../expr/evaluate.hpp"
#include "isa.hpp"
#include "threads.hpp"

namespace hybra::backend::cpu {

namespace detail {

inline constexpr std::int64_t block = 256;

template <class T>
using block_fn = void (*)(T* out, const T* const* in, std::int64_t n);

// Every op asks for the target's widest vectors (isa.hpp): the costly ones
// need them, and over a block in L1 the cheap ones measured no slower.
template <class Op, class T>
HYBRA_ROUND_EVERY_OP void run_block(T* out, const T* const* in, std::int64_t n) {
  if constexpr (Op::rule == op::DTypeRule::select) {
    const T *c = in[0], *a = in[1], *b = in[2];
#pragma omp simd simdlen(simd_lanes<T>)
    for (std::int64_t i = 0; i < n; ++i) out[i] = Op::apply(c[i] != T(0), a[i], b[i]);
  } else if constexpr (Op::arity == 1) {
    const T* a = in[0];
#pragma omp simd simdlen(simd_lanes<T>)
    for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(Op::apply(a[i]));
  } else {
    const T *a = in[0], *b = in[1];
#pragma omp simd simdlen(simd_lanes<T>)
    for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(Op::apply(a[i], b[i]));
  }
}

template <class T>
const auto& block_fns() {
  static const auto table = []<std::size_t... I>(std::index_sequence<I...>) {
    return std::array<block_fn<T>, sizeof...(I)>{&run_block<std::tuple_element_t<I, op::elementwise_ops>, T>...};
  }(std::make_index_sequence<std::tuple_size_v<op::elementwise_ops>>{});
  return table;
}

}  // namespace detail

// Registers 0 .. inputs-1 hold the inputs' elements, then constants and one
// register per instruction; `result` is the output's. Every value has the
// program's dtype (operands are converted before), and instructions run in
// that dtype: an op whose rule makes floats of integers must be given floats.
struct FusedProgram {
  struct Instr {
    int op;  // index into op::elementwise_ops
    int dst;
    std::array<int, 3> src;
  };
  struct Constant {
    int reg;
    double real;  // the value as the program's dtype, held exactly by one of these two
    std::int64_t integer;
  };
  DType dtype = DType::float32;
  int inputs = 0, registers = 0, result = 0;
  std::vector<Instr> code;
  std::vector<Constant> constants;
};

class FusedLoop {
 public:
  // input_layouts: a tensor per input with the shape and strides the inputs
  // will have (meta tensors do); the output is contiguous, of out_shape.
  FusedLoop(FusedProgram program, const std::vector<Tensor>& input_layouts, const Shape& out_shape)
      : p_(std::move(program)) {
    Tensor out(out_shape, p_.dtype, meta());
    hybra::detail::leaf_list leaves;
    for (const auto& t : input_layouts) leaves.push_back(&t);
    plan_ = std::make_shared<hybra::detail::strided_plan>(leaves, out);
    size_ = out.size();
  }

  const FusedProgram& program() const { return p_; }

  // Runs over contiguous `out`; in[k] points at input k's element 0.
  void run(const void* const* in, void* out) const {
    dispatch(p_.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      run_typed<T>(reinterpret_cast<const T* const*>(in), static_cast<T*>(out));
    });
  }

 private:
  template <class T>
  void run_typed(const T* const* in, T* out) const {
    if (size_ == 0) return;
    const auto& plan = *plan_;
    const auto& fns = detail::block_fns<T>();
    parallel_for(plan.items, std::min(plan.piece, plan.inner), [&](std::int64_t first, std::int64_t last) {
      // Per thread, kept between calls: a call of a small plan allocates nothing.
      thread_local std::vector<T> scratch;
      thread_local std::vector<const T*> r;
      const auto regs = static_cast<std::size_t>(p_.registers);
      if (scratch.size() < regs * detail::block) scratch.resize(regs * detail::block);
      if (r.size() < regs) r.resize(regs);
      auto buf = [&](int k) { return scratch.data() + static_cast<std::size_t>(k) * detail::block; };
      for (const auto& c : p_.constants) {
        std::fill_n(buf(c.reg), detail::block, std::is_integral_v<T> ? static_cast<T>(c.integer) : static_cast<T>(c.real));
        r[static_cast<std::size_t>(c.reg)] = buf(c.reg);
      }
      boost::container::small_vector<std::int64_t, 9> off(static_cast<std::size_t>(p_.inputs) + 1);
      // A broadcast input (stride 0: a per-channel scale, say) holds one value over an item's blocks: its
      // register is filled when that value's address changes, not per block.
      boost::container::small_vector<const T*, 8> filled(static_cast<std::size_t>(p_.inputs), nullptr);
      for (std::int64_t item = first; item < last; ++item) {
        const std::int64_t len = plan.locate(item, off.data());
        T* dst = out + off.back();
        for (std::int64_t b = 0; b < len; b += detail::block) {
          const std::int64_t n = std::min(detail::block, len - b);
          for (int k = 0; k < p_.inputs; ++k) {
            const auto ks = static_cast<std::size_t>(k);
            const std::int64_t s = plan.inner_stride[ks];
            const T* src = in[k] + off[ks] + b * s;
            if (s == 1) {
              r[ks] = src;
            } else if (s == 0) {
              if (filled[ks] != src) std::fill_n(buf(k), detail::block, *src);
              filled[ks] = src;
              r[ks] = buf(k);
            } else {
              T* d = buf(k);
              for (std::int64_t i = 0; i < n; ++i) d[i] = src[i * s];
              r[ks] = d;
            }
          }
          for (const auto& ins : p_.code) {
            T* d = ins.dst == p_.result ? dst + b : buf(ins.dst);
            const T* operands[3] = {r[static_cast<std::size_t>(ins.src[0])], r[static_cast<std::size_t>(ins.src[1])],
                                    r[static_cast<std::size_t>(ins.src[2])]};
            fns[static_cast<std::size_t>(ins.op)](d, operands, n);
            r[static_cast<std::size_t>(ins.dst)] = d;
          }
        }
      }
    });
  }

  FusedProgram p_;
  std::shared_ptr<const hybra::detail::strided_plan> plan_;
  std::int64_t size_ = 0;
};

}  // namespace hybra::backend::cpu
