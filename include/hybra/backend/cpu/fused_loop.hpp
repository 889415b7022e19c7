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
#include <span>
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

// Asks for the cache lines of a streamed operand two blocks ahead of the n
// elements from p: between its reads a block's instructions run in L1, and
// the hardware's prefetcher, which follows the misses, would leave the next
// block's lines to be fetched when they are read.
template <class T>
inline void prefetch_ahead(const T* p, std::int64_t n) {
  constexpr std::int64_t line = 64 / static_cast<std::int64_t>(sizeof(T));
  for (std::int64_t i = 0; i < n; i += line) __builtin_prefetch(p + 2 * block + i);
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
    const auto& plan = *plan_;
    for (std::size_t k = 0; k < input_layouts.size(); ++k) {
      dense_.push_back(plan.strides[k] == plan.strides.back());
      same_rows_.push_back(std::all_of(plan.strides[k].begin(), plan.strides[k].end() - 1, [](auto s) { return s == 0; }));
    }
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
  // One thread's registers: the constants' blocks, filled once, and a block
  // per input and instruction. Kept between calls per thread, so that a
  // call of a small plan allocates nothing; a thread holds one Registers at
  // a time.
  template <class T>
  class Registers {
   public:
    explicit Registers(const FusedProgram& p)
        : p_(p), filled_(static_cast<std::size_t>(p.inputs), nullptr), tiled_(static_cast<std::size_t>(p.inputs)) {
      thread_local std::vector<T> scratch;
      thread_local std::vector<const T*> r;
      const auto regs = static_cast<std::size_t>(p.registers);
      if (scratch.size() < regs * detail::block) scratch.resize(regs * detail::block);
      if (r.size() < regs) r.resize(regs);
      scratch_ = scratch.data();
      r_ = r.data();
      for (const auto& c : p.constants) {
        std::fill_n(buf(c.reg), detail::block, std::is_integral_v<T> ? static_cast<T>(c.integer) : static_cast<T>(c.real));
        r_[c.reg] = buf(c.reg);
      }
    }

    // Runs the program over the n <= block elements from element b of the
    // run whose operands start at off[], into dst.
    void block(const hybra::detail::strided_plan& plan, const T* const* in, const std::int64_t* off, std::int64_t b,
               std::int64_t n, T* dst) {
      for (int k = 0; k < p_.inputs; ++k) {
        const auto ks = static_cast<std::size_t>(k);
        const std::int64_t s = plan.inner_stride[ks];
        const T* src = in[k] + off[ks] + b * s;
        if (s == 1) {
          detail::prefetch_ahead(src, n);
          r_[k] = src;
        } else if (s == 0) {
          // A broadcast input (a per-channel scale, say) holds one value over a run's blocks: its
          // register is filled when that value's address changes, not per block.
          if (filled_[ks] != src) std::fill_n(buf(k), detail::block, *src);
          filled_[ks] = src;
          tiled_[ks] = {};
          r_[k] = buf(k);
        } else {
          T* d = buf(k);
          for (std::int64_t i = 0; i < n; ++i) d[i] = src[i * s];
          tiled_[ks] = {};
          r_[k] = d;
        }
      }
      execute(n, dst);
    }

    // Runs the program over the n <= block elements from element `at` of
    // the result, which may cross rows (rows shorter than a block): inputs
    // that lie as the result does are read in place, the others gathered
    // row by row. off: room for an offset per operand. An input that is the
    // same in every row (a per-channel scale over NHWC's rows of channels)
    // is gathered once for spans that start a row: such spans of one length
    // gather the same elements.
    void span(const hybra::detail::strided_plan& plan, std::span<const bool> dense, std::span<const bool> same_rows,
              const T* const* in, std::int64_t at, std::int64_t n, T* dst, std::int64_t* off) {
      // The next row's offsets are the last one's plus the stride of the
      // dimension outside the rows, until that dimension wraps round: no
      // division per row.
      const std::size_t outer = plan.dims.size() >= 2 ? plan.dims.size() - 2 : 0;
      const std::int64_t wrap = plan.dims.size() >= 2 ? plan.dims[outer] : 1;
      std::int64_t row = at / plan.inner, from = at % plan.inner, digit = row % wrap;
      plan.locate_row(row, 0, off);
      boost::container::small_vector<bool, 8> gathered(static_cast<std::size_t>(p_.inputs));
      for (int k = 0; k < p_.inputs; ++k) {
        const auto ks = static_cast<std::size_t>(k);
        if (dense[ks]) continue;
        const Tiled start{in[k] + off[ks], n};
        gathered[ks] = from == 0 && same_rows[ks] && tiled_[ks].src == start.src && tiled_[ks].count >= n;
        tiled_[ks] = from == 0 && same_rows[ks] ? start : Tiled{};
      }
      for (std::int64_t pos = at; pos < at + n;) {
        const std::int64_t len = std::min(at + n - pos, plan.inner - from);
        for (int k = 0; k < p_.inputs; ++k) {
          const auto ks = static_cast<std::size_t>(k);
          if (dense[ks] || gathered[ks]) continue;
          const std::int64_t s = plan.inner_stride[ks];
          const T* src = in[k] + off[ks] + from * s;
          T* d = buf(k) + (pos - at);
          if (s == 0) std::fill_n(d, len, *src);
          else for (std::int64_t i = 0; i < len; ++i) d[i] = src[i * s];
        }
        pos += len;
        from = 0;
        if (pos == at + n) break;
        ++row;
        if (++digit < wrap) {
          for (std::size_t l = 0; l < plan.strides.size(); ++l) off[l] += plan.strides[l][outer];
        } else {
          digit = 0;
          plan.locate_row(row, 0, off);
        }
      }
      for (int k = 0; k < p_.inputs; ++k) {
        if (!dense[static_cast<std::size_t>(k)]) {
          r_[k] = buf(k);
          continue;
        }
        detail::prefetch_ahead(in[k] + at, n);
        r_[k] = in[k] + at;
      }
      std::fill(filled_.begin(), filled_.end(), nullptr);  // block() refills a broadcast register after this
      execute(n, dst);
    }

   private:
    void execute(std::int64_t n, T* dst) {
      const auto& fns = detail::block_fns<T>();
      for (const auto& ins : p_.code) {
        T* d = ins.dst == p_.result ? dst : buf(ins.dst);
        const T* operands[3] = {r_[ins.src[0]], r_[ins.src[1]], r_[ins.src[2]]};
        fns[static_cast<std::size_t>(ins.op)](d, operands, n);
        r_[ins.dst] = d;
      }
    }
    T* buf(int k) { return scratch_ + static_cast<std::size_t>(k) * detail::block; }
    // What an input's register holds after span(): its rows from `src`, over
    // `count` elements (none: count 0).
    struct Tiled {
      const T* src = nullptr;
      std::int64_t count = 0;
    };
    const FusedProgram& p_;
    T* scratch_;
    const T** r_;
    boost::container::small_vector<const T*, 8> filled_;
    boost::container::small_vector<Tiled, 8> tiled_;
  };

 public:
  // One thread's evaluation of the program over runs of the result's
  // elements (in row-major order), with no buffer of the result: what a
  // reduction of the loop's value reads (jit/plan.hpp), run after run.
  template <class T>
  class Reader {
   public:
    static constexpr std::int64_t capacity = 1024;  // the longest run
    // into: where the result lies. Runs are then computed there, each just
    // the elements asked for (a sum that writes the loop's value as it reads
    // it, jit/plan.hpp: each thread writes only the runs it asks for).
    Reader(const FusedLoop& loop, const T* const* in, T* into = nullptr)
        : loop_(loop), in_(in), into_(into), regs_(loop.p_) {}
    // Elements [at, at + n) of the result, n <= capacity. They are computed
    // `capacity` at a time from the first one asked for, so that a reader of
    // short runs in order (rows of a few elements, a sum's pairwise blocks)
    // computes each element once, in blocks that span its runs. Where the
    // loop's rows are long and the run lies in one, the elements computed
    // end with that row: a reader of rows (BatchNorm's sums over NCHW's
    // planes) then computes none twice, and a broadcast operand is filled
    // once per row, not per block.
    const T* run(std::int64_t at, std::int64_t n) {
      if (into_) {
        compute(at, n, into_ + at);
        return into_ + at;
      }
      if (at < from_ || at + n > from_ + count_) {
        const auto& plan = *loop_.plan_;
        from_ = at;
        count_ = std::min(capacity, loop_.size_ - at);
        if (plan.inner >= detail::block && at % plan.inner + n <= plan.inner)
          count_ = std::min(count_, plan.inner - at % plan.inner);
        compute(at, count_, values_.data());
      }
      return values_.data() + (at - from_);
    }

   private:
    // Elements [at, at + n) into dst: block by block along one row where
    // they lie in one, else span by span across rows.
    void compute(std::int64_t at, std::int64_t n, T* dst) {
      const auto& plan = *loop_.plan_;
      const std::int64_t from = at % plan.inner;
      if (plan.inner >= detail::block && from + n <= plan.inner) {
        plan.locate_row(at / plan.inner, 0, off_.data());
        for (std::int64_t b = 0; b < n; b += detail::block)
          regs_.block(plan, in_, off_.data(), from + b, std::min(detail::block, n - b), dst + b);
      } else {
        for (std::int64_t b = 0; b < n; b += detail::block)
          regs_.span(plan, loop_.dense(), loop_.same_rows(), in_, at + b, std::min(detail::block, n - b), dst + b,
                     off_.data());
      }
    }

    const FusedLoop& loop_;
    const T* const* in_;
    T* into_;
    Registers<T> regs_;
    boost::container::small_vector<std::int64_t, 9> off_ = boost::container::small_vector<std::int64_t, 9>(
        static_cast<std::size_t>(loop_.p_.inputs) + 1);
    std::int64_t from_ = 0, count_ = 0;
    std::array<T, capacity> values_;
  };

 private:
  template <class T>
  void run_typed(const T* const* in, T* out) const {
    if (size_ == 0) return;
    const auto& plan = *plan_;
    if (plan.inner < detail::block && size_ > plan.inner) {
      // Rows shorter than a block (a per-channel operand over 4 x 4 pixels, NHWC's rows of channels):
      // blocks of whole rows, so that an operand the same in every row is gathered once per thread.
      const std::int64_t len = detail::block / plan.inner * plan.inner;
      parallel_for((size_ + len - 1) / len, len, [&](std::int64_t first, std::int64_t last) {
        Registers<T> regs(p_);
        boost::container::small_vector<std::int64_t, 9> off(static_cast<std::size_t>(p_.inputs) + 1);
        for (std::int64_t b = first; b < last; ++b) {
          const std::int64_t at = b * len;
          regs.span(plan, dense(), same_rows(), in, at, std::min(len, size_ - at), out + at, off.data());
        }
      });
      return;
    }
    parallel_for(plan.items, std::min(plan.piece, plan.inner), [&](std::int64_t first, std::int64_t last) {
      Registers<T> regs(p_);
      boost::container::small_vector<std::int64_t, 9> off(static_cast<std::size_t>(p_.inputs) + 1);
      for (std::int64_t item = first; item < last; ++item) {
        const std::int64_t len = plan.locate(item, off.data());
        T* dst = out + off.back();
        for (std::int64_t b = 0; b < len; b += detail::block)
          regs.block(plan, in, off.data(), b, std::min(detail::block, len - b), dst + b);
      }
    });
  }

  FusedProgram p_;
  std::shared_ptr<const hybra::detail::strided_plan> plan_;
  std::int64_t size_ = 0;
  boost::container::small_vector<bool, 8> dense_;      // per input: it lies as the result does
  boost::container::small_vector<bool, 8> same_rows_;  // per input: every row of the result reads the same elements
  std::span<const bool> dense() const { return {dense_.data(), dense_.size()}; }
  std::span<const bool> same_rows() const { return {same_rows_.data(), same_rows_.size()}; }
};

}  // namespace hybra::backend::cpu
