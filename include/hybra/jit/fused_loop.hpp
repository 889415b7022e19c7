#pragma once
// A fused elementwise subgraph (graph.hpp's `body`), compiled for the CPU.
// The graph is only known at run time, so the loop cannot be a C++
// expression template: it is a short program of op-table ops, run over the
// output in blocks of `block` elements. Each instruction is one tight,
// vectorised loop over a block held in L1 (the op's `apply`, instantiated
// per op and dtype ahead of time), so intermediate values never reach
// memory and the whole group costs one pass over its inputs and output.
#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "../backend/cpu/threads.hpp"
#include "../expr/evaluate.hpp"
#include "../graph/graph.hpp"

namespace hybra::jit {

namespace detail {

inline constexpr std::int64_t block = 256;

template <class T>
using block_fn = void (*)(T* out, const T* const* in, std::int64_t n);

template <class Op, class T>
void run_block(T* out, const T* const* in, std::int64_t n) {
  if constexpr (Op::rule == op::DTypeRule::select) {
    const T *c = in[0], *a = in[1], *b = in[2];
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) out[i] = Op::apply(c[i] != T(0), a[i], b[i]);
  } else if constexpr (Op::arity == 1) {
    const T* a = in[0];
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) out[i] = Op::apply(a[i]);
  } else {
    const T *a = in[0], *b = in[1];
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) out[i] = Op::apply(a[i], b[i]);
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

// Registers 0 .. inputs-1 hold the inputs, then one register per
// instruction; the last instruction's result is the output.
class FusedLoop {
 public:
  struct Instr {
    int op;  // index into op::elementwise_ops
    int dst;
    std::array<int, 3> src;
  };

  // body: an elementwise graph (every node fusable, one output); input_layouts:
  // a tensor per body var with the shape and strides the inputs will have
  // (meta tensors do), and out_shape the (contiguous) output's.
  FusedLoop(const graph::Graph& body, const std::vector<Tensor>& input_layouts, const Shape& out_shape)
      : dtype_(*body.nodes[static_cast<std::size_t>(body.outputs.front())].meta.dtype) {
    std::vector<int> reg(body.nodes.size(), -1);
    inputs_ = static_cast<int>(input_layouts.size());
    int next = inputs_, var = 0;
    for (std::size_t i = 0; i < body.nodes.size(); ++i) {
      const auto& n = body.nodes[i];
      if (n.op == "var") {
        reg[i] = var++;
      } else if (n.op == "scalar" || n.op == "const") {
        reg[i] = next++;
        dispatch(dtype_, [&](auto tag) {
          using T = typename decltype(tag)::type;
          dispatch(n.value.dtype(), [&](auto s) {
            constants_.emplace_back(reg[i], static_cast<double>(static_cast<T>(
                                                *static_cast<const typename decltype(s)::type*>(n.value.contiguous().raw_data()))));
          });
        });
      } else {
        Instr ins{graph::find_op(n.op).elementwise, next++, {0, 0, 0}};
        for (std::size_t k = 0; k < n.inputs.size(); ++k) ins.src[k] = reg[static_cast<std::size_t>(n.inputs[k])];
        reg[i] = ins.dst;
        code_.push_back(ins);
      }
    }
    registers_ = next;
    result_ = reg[static_cast<std::size_t>(body.outputs.front())];
    Tensor out(out_shape, dtype_, meta());
    hybra::detail::leaf_list leaves;
    for (const auto& t : input_layouts) leaves.push_back(&t);
    plan_ = std::make_shared<hybra::detail::strided_plan>(leaves, out);
    size_ = out.size();
  }

  DType dtype() const { return dtype_; }

  // Runs over contiguous `out`; in[k] points at input k's element 0.
  void run(const void* const* in, void* out) const {
    dispatch(dtype_, [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_floating_point_v<T>) run_typed<T>(reinterpret_cast<const T* const*>(in), static_cast<T*>(out));
    });
  }

 private:
  template <class T>
  void run_typed(const T* const* in, T* out) const {
    if (size_ == 0) return;
    const auto& plan = *plan_;
    const auto& fns = detail::block_fns<T>();
    backend::cpu::parallel_for(plan.items, std::min(plan.piece, plan.inner), [&](std::int64_t first, std::int64_t last) {
      // Per thread, kept between calls: a call of a small plan allocates nothing.
      thread_local std::vector<T> scratch;
      thread_local std::vector<const T*> r;
      const auto regs = static_cast<std::size_t>(registers_);
      if (scratch.size() < regs * detail::block) scratch.resize(regs * detail::block);
      if (r.size() < regs) r.resize(regs);
      auto buf = [&](int k) { return scratch.data() + static_cast<std::size_t>(k) * detail::block; };
      for (auto [k, v] : constants_) {
        std::fill_n(buf(k), detail::block, static_cast<T>(v));
        r[static_cast<std::size_t>(k)] = buf(k);
      }
      boost::container::small_vector<std::int64_t, 9> off(static_cast<std::size_t>(inputs_) + 1);
      for (std::int64_t item = first; item < last; ++item) {
        const std::int64_t len = plan.locate(item, off.data());
        T* dst = out + off.back();
        for (std::int64_t b = 0; b < len; b += detail::block) {
          const std::int64_t n = std::min(detail::block, len - b);
          for (int k = 0; k < inputs_; ++k) {
            const auto ks = static_cast<std::size_t>(k);
            const std::int64_t s = plan.inner_stride[ks];
            const T* p = in[k] + off[ks] + b * s;
            if (s == 1) {
              r[ks] = p;
            } else {
              T* d = buf(k);
              for (std::int64_t i = 0; i < n; ++i) d[i] = p[i * s];
              r[ks] = d;
            }
          }
          for (const auto& ins : code_) {
            T* d = ins.dst == result_ ? dst + b : buf(ins.dst);
            const T* src[3] = {r[static_cast<std::size_t>(ins.src[0])], r[static_cast<std::size_t>(ins.src[1])],
                               r[static_cast<std::size_t>(ins.src[2])]};
            fns[static_cast<std::size_t>(ins.op)](d, src, n);
            r[static_cast<std::size_t>(ins.dst)] = d;
          }
        }
      }
    });
  }

  DType dtype_;
  int inputs_ = 0, registers_ = 0, result_ = 0;
  std::vector<Instr> code_;
  std::vector<std::pair<int, double>> constants_;
  std::shared_ptr<const hybra::detail::strided_plan> plan_;
  std::int64_t size_ = 0;
};

}  // namespace hybra::jit
