#pragma once
// Reductions, argmax, softmax and log_softmax on a GPU: the device code is
// kernels/reduce.cuh and kernels/softmax.cuh; this file plans a reduction's
// steps, writes the __global__ entries NVRTC compiles with that code (one
// program per op and dtype, compiled once, through the kernel cache), and
// launches them on the GPU's stream. ops/reduce.hpp and ops/softmax.hpp
// call it for tensors on cuda(i).
//
// A reduction arrives as the passes the CPU makes too (ops/reduce.hpp): each
// reduces the middle axis of a contiguous (O, R, I) block. A pass whose few
// outputs would leave most of the GPU idle (a whole-tensor sum, say) is cut
// into pieces along R: a first step reduces each piece into an accumulator
// in scratch memory, a second combines the pieces. Accumulators stay
// accumulators (double sums, (value, index) pairs) between steps; only the
// last step finishes them into the result's dtype.
//
// A block's threads combine their accumulators with one of two versions of
// kernels/reduce.cuh's block_combine: a tree in shared memory, or CUB's
// warp shuffles, chosen per op (BlockCombineChoice below). Each version is
// a program of its own, under entry names of its own, since a GPU caches
// its functions by name.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpu.hpp"
#include "../../core/dtype.hpp"
#include "ptx.hpp"
#include "source.hpp"

namespace hybra::backend::cuda {

// Which block combine the programs chosen from now on use. Each op has its
// own default, the version it ran faster with on a GPU (docs/cuda.md says
// which and why); HYBRA_CUDA_CUB=1 or =0, or set_cub_block_combine, forces
// one version on every op.
class BlockCombineChoice {
 public:
  BlockCombineChoice() {
    const char* v = std::getenv("HYBRA_CUDA_CUB");
    const std::string_view value = v ? v : "";
    forced_.store(value == "1" ? on : value == "0" ? off : unforced);
  }
  std::optional<bool> forced() const {
    const int f = forced_.load(std::memory_order_relaxed);
    return f == unforced ? std::nullopt : std::optional<bool>(f == on);
  }
  void force(std::optional<bool> cub) { forced_.store(cub ? (*cub ? on : off) : unforced); }

 private:
  static constexpr int unforced = -1, off = 0, on = 1;
  std::atomic<int> forced_;
};

inline BlockCombineChoice& block_combine_choice() {
  static BlockCombineChoice choice;
  return choice;
}
// Whether an op whose default is op_default combines with CUB.
inline bool cub_block_combine(bool op_default) { return block_combine_choice().forced().value_or(op_default); }
// Forces one version on every op (nullopt: each op's default again).
inline void set_cub_block_combine(std::optional<bool> cub) { block_combine_choice().force(cub); }

// The ops' defaults: CUB's warp shuffles were faster for reductions, argmax
// and softmax, and never slower.
constexpr bool reduce_cub_default = true;
constexpr bool softmax_cub_default = true;

// One version forced for a scope (a test's or a benchmark's case), then the
// choice put back as it was.
class CubBlockCombineScope {
 public:
  explicit CubBlockCombineScope(bool cub) : before_(block_combine_choice().forced()) { set_cub_block_combine(cub); }
  ~CubBlockCombineScope() { set_cub_block_combine(before_); }
  CubBlockCombineScope(const CubBlockCombineScope&) = delete;
  CubBlockCombineScope& operator=(const CubBlockCombineScope&) = delete;

 private:
  std::optional<bool> before_;
};

// What starts a program of kernels/reduce.cuh or softmax.cuh, and ends its
// entries' names, in the block combine's version.
inline std::string_view block_combine_define(bool cub) { return cub ? "#define HYBRA_KERNELS_CUB 1\n" : ""; }
inline std::string_view block_combine_suffix(bool cub) { return cub ? "_cub" : ""; }

enum class Reduction { sum, mean, max, min, argmax };

// One launch of kernels/reduce.cuh's reduce_rows (I == 1) or reduce_columns:
// the middle axis of the (O, R, I) block at src, in pieces of len along R,
// into dst. src and dst are byte offsets into the plan's scratch memory, or
// -1: the reduction's input (src) or result (dst).
struct ReduceStep {
  bool columns, from_acc, to_acc;
  std::int64_t O, R, I, len;
  std::int64_t src, dst;
  unsigned blocks, threads;
};

struct ReducePlan {
  std::vector<ReduceStep> steps;
  std::int64_t scratch_bytes = 0;
  std::int64_t count = 1;  // input elements per result element (a mean divides by it)
};

// kernels/reduce.cuh's warp_row_limit: rows (or pieces) this short are
// reduced by a warp each, up to 8 in a block.
constexpr std::int64_t warp_row_elements = 1024;

// The steps of a reduction whose passes are `blocks` ((O, R, I) each, the
// first reading the input), with accumulators of acc_bytes, for a GPU of
// `multiprocessors` SMs, at most max_threads (a power of two from 32 to 256)
// threads per block.
inline ReducePlan plan_reduce(std::span<const std::array<std::int64_t, 3>> blocks, std::int64_t acc_bytes,
                              int multiprocessors, unsigned max_threads = 256) {
  using i64 = std::int64_t;
  const i64 sms = std::max(1, multiprocessors), grid_cap = sms * 32;
  auto ceil_div = [](i64 a, i64 b) { return (a + b - 1) / b; };
  ReducePlan plan;
  i64 src = -1;
  bool from_acc = false;
  auto add = [&](i64 O, i64 R, i64 I, i64 len, bool to_acc, bool last) {
    ReduceStep s{I > 1, from_acc, to_acc, O, R, I, len, src, -1, 0, 0};
    if (!last || to_acc) {
      s.dst = plan.scratch_bytes;
      plan.scratch_bytes += ceil_div(O * ceil_div(R, len) * I * acc_bytes, 256) * 256;
    }
    if (s.columns) {
      s.threads = max_threads;
      s.blocks = static_cast<unsigned>(std::min(grid_cap, ceil_div(O * ceil_div(R, len) * I, max_threads)));
    } else if (len <= warp_row_elements) {
      const i64 pieces = O * ceil_div(R, len);
      s.threads = static_cast<unsigned>(std::min<i64>(max_threads, 32 * std::clamp<i64>(pieces, 1, 8)));
      s.blocks = static_cast<unsigned>(std::min(grid_cap, ceil_div(pieces, s.threads / 32)));
    } else {
      unsigned threads = 32;  // a warp at least; no more threads than a piece has elements
      while (threads < max_threads && threads < len) threads *= 2;
      s.threads = std::min(threads, max_threads);
      s.blocks = static_cast<unsigned>(std::min(grid_cap, O * ceil_div(R, len)));
    }
    plan.steps.push_back(s);
    src = s.dst;
    from_acc = true;
  };
  for (std::size_t k = 0; k < blocks.size(); ++k) {
    const auto [O, R, I] = blocks[k];
    plan.count *= R;
    const bool last = k + 1 == blocks.size();
    // Pieces only where the outputs alone would not fill the GPU, and never
    // so short that a thread has little to add.
    const i64 pieces = I == 1 ? std::clamp(ceil_div(16 * sms, O), i64{1}, std::max(i64{1}, R / 2048))
                              : std::clamp(ceil_div(sms * 2048, O * I), i64{1}, std::max(i64{1}, R / 64));
    const i64 len = ceil_div(R, pieces);
    if (ceil_div(R, len) > 1) {
      add(O, R, I, len, true, false);
      add(O, ceil_div(R, len), I, ceil_div(R, len), !last, last);
    } else {
      add(O, R, I, len, !last, last);
    }
  }
  return plan;
}

// Runs a plan's steps in order: launch(step, src, dst) with the steps'
// offsets made addresses (the GPU's launches, or a test's).
template <class Launch>
void run_reduce_plan(const ReducePlan& plan, const void* input, void* result, void* scratch, Launch&& launch) {
  auto at = [&](std::int64_t offset) { return static_cast<char*>(scratch) + offset; };
  for (const ReduceStep& s : plan.steps)
    launch(s, s.src < 0 ? input : at(s.src), s.dst < 0 ? result : static_cast<void*>(at(s.dst)));
}

namespace detail {

constexpr std::string_view reduction_name(Reduction r) {
  switch (r) {
    case Reduction::sum: return "sum";
    case Reduction::mean: return "mean";
    case Reduction::max: return "max";
    case Reduction::min: return "min";
    case Reduction::argmax: return "argmax";
  }
  return "?";
}

// kernels/reduce.cuh's policy for a reduction of `in`, and the C++ type of
// its result (what ops/reduce.hpp makes the result's dtype).
inline std::array<std::string, 2> reduce_policy(Reduction r, DType in) {
  const std::string T(cuda_type(in));
  const bool real = is_floating(in);
  switch (r) {
    case Reduction::sum:
      return {real ? "reduce_sum<double>" : "reduce_sum<unsigned long long>", real ? T : "long long"};
    case Reduction::mean: return {"reduce_mean", real ? T : "float"};
    case Reduction::max: return {"reduce_extreme<" + T + ", true>", T};
    case Reduction::min: return {"reduce_extreme<" + T + ", false>", T};
    case Reduction::argmax: return {"reduce_argmax<" + T + ">", "long long"};
  }
  return {};
}

inline std::string reduce_entry(Reduction r, DType in, const ReduceStep& s, bool cub) {
  return hybra::detail::concat("hybra_", reduction_name(r), '_', name(in), s.columns ? "_columns_" : "_rows_",
                               s.from_acc ? "acc" : "in", s.to_acc ? "_acc" : "_out", block_combine_suffix(cub));
}

}  // namespace detail

// The NVRTC program of one reduction of one dtype: its eight entries (rows
// or columns; reading the input or accumulators; writing accumulators or
// the result), all with the parameters (x, out, O, R, I, len, count).
inline std::string cuda_reduce_program(Reduction r, DType in, bool cub) {
  const auto [policy, out] = detail::reduce_policy(r, in);
  std::string source = std::string(block_combine_define(cub)) +
                       "#include <kernels/reduce.cuh>\n\nnamespace {\nusing P = hybra::kernels::" + policy +
                       ";\nusing In = " + std::string(cuda_type(in)) + ";\nusing Out = " + out +
                       ";\nusing Acc = P::acc;\n}  // namespace\n";
  for (bool columns : {false, true})
    for (bool from_acc : {false, true})
      for (bool to_acc : {false, true}) {
        const ReduceStep s{columns, from_acc, to_acc, 0, 0, 0, 0, 0, 0, 0, 0};
        source += hybra::detail::concat(
            "\nextern \"C\" __global__ void __launch_bounds__(256) ", detail::reduce_entry(r, in, s, cub), "(const ",
            from_acc ? "Acc" : "In", "* x, ", to_acc ? "Acc" : "Out",
            "* out, long long O, long long R, long long I, long long len, long long count) {\n  ",
            columns ? "hybra::kernels::reduce_columns<P, " : "hybra::kernels::reduce_rows<P, ",
            from_acc ? "Acc, " : "In, ", to_acc ? "Acc, " : "Out, ", from_acc ? "true, " : "false, ",
            to_acc ? "true" : "false",
            columns ? ">(x, out, O, R, I, len, count);\n}\n" : ">(x, out, O, R, len, count);\n}\n");
      }
  return source;
}

inline std::string softmax_entry(bool log, DType t, bool columns, bool cub) {
  return hybra::detail::concat("hybra_", log ? "log_softmax_" : "softmax_", name(t), columns ? "_columns" : "_rows",
                               block_combine_suffix(cub));
}

// The NVRTC program of softmax (or log_softmax) of one floating dtype: two
// entries (rows, columns), with the parameters (x, y, O, R, I).
inline std::string cuda_softmax_program(bool log, DType t, bool cub) {
  const std::string T(cuda_type(t)), L = log ? "true" : "false";
  return hybra::detail::concat(block_combine_define(cub),
                               "#include <kernels/softmax.cuh>\n\nextern \"C\" __global__ void __launch_bounds__(256) ",
                               softmax_entry(log, t, false, cub), "(const ", T, "* x, ", T,
                               "* y, long long O, long long R, long long) {\n  hybra::kernels::softmax_rows<", L,
                               ">(x, y, O, R);\n}\n\nextern \"C\" __global__ void __launch_bounds__(256) ",
                               softmax_entry(log, t, true, cub), "(const ", T, "* x, ", T,
                               "* y, long long O, long long R, long long I) {\n  hybra::kernels::softmax_columns<", L,
                               ">(x, y, O, R, I);\n}\n");
}

// Compiles the reduction's program for the GPU (at the call, so that a
// compile error is the caller's) and returns the closure's work: the plan's
// launches on the GPU's stream. x and out are contiguous; scratch holds at
// least plan.scratch_bytes.
inline auto cuda_reduce_launcher(Reduction r, DType in, backend::cuda::Gpu& gpu) {
  const bool cub = cub_block_combine(reduce_cub_default);
  const std::string& ptx =
      program_ptx(hybra::detail::concat("hybra_", detail::reduction_name(r), '_', name(in), block_combine_suffix(cub)),
                  gpu.arch(), [&] { return cuda_reduce_program(r, in, cub); });
  return [&ptx, r, in, cub](backend::cuda::Gpu& g, const ReducePlan& plan, const void* x, void* out, void* scratch,
                            std::string_view what) {
    run_reduce_plan(plan, x, out, scratch, [&](const ReduceStep& s, const void* src, void* dst) {
      auto xp = src;
      auto op = dst;
      long long O = s.O, R = s.R, I = s.I, len = s.len, count = plan.count;
      void* args[] = {&xp, &op, &O, &R, &I, &len, &count};
      g.launch_grid(g.function(ptx, detail::reduce_entry(r, in, s, cub)), s.blocks, s.threads, args, what);
    });
  };
}

// How softmax of an (O, R, I) block is launched: a warp per row (I == 1)
// of at most warp_row_elements, up to 8 rows in a block; a block per longer
// row, with as many threads as the row has elements, up to 256; or a thread
// per column.
struct SoftmaxLaunch {
  bool columns;
  unsigned blocks, threads;
};

inline SoftmaxLaunch plan_softmax(std::int64_t O, std::int64_t R, std::int64_t I, int multiprocessors) {
  const std::int64_t cap = std::int64_t{std::max(1, multiprocessors)} * 32;
  if (I > 1) return {true, static_cast<unsigned>(std::min(cap, (O * I + 255) / 256)), 256};
  if (R <= warp_row_elements) {
    const auto warps = static_cast<unsigned>(std::clamp<std::int64_t>(O, 1, 8));
    return {false, static_cast<unsigned>(std::min(cap, (O + warps - 1) / warps)), 32 * warps};
  }
  unsigned threads = 32;
  while (threads < 256 && threads < R) threads *= 2;
  return {false, static_cast<unsigned>(std::min(cap, O)), threads};
}

// softmax (or log_softmax) of the contiguous (O, R, I) block x into y, on
// the GPU's stream; the program is compiled at the call.
inline auto cuda_softmax_launcher(bool log, DType t, backend::cuda::Gpu& gpu) {
  const bool cub = cub_block_combine(softmax_cub_default);
  const std::string& ptx = program_ptx(
      hybra::detail::concat("hybra_", log ? "log_softmax_" : "softmax_", name(t), block_combine_suffix(cub)),
      gpu.arch(), [&] { return cuda_softmax_program(log, t, cub); });
  return [&ptx, log, t, cub](backend::cuda::Gpu& g, const void* x, void* y, std::int64_t O, std::int64_t R,
                             std::int64_t I, std::string_view what) {
    const SoftmaxLaunch launch = plan_softmax(O, R, I, g.info().multiprocessors);
    auto xp = x;
    auto yp = y;
    long long o = O, r = R, i = I;
    void* args[] = {&xp, &yp, &o, &r, &i};
    g.launch_grid(g.function(ptx, softmax_entry(log, t, launch.columns, cub)), launch.blocks, launch.threads, args,
                  what);
  };
}

}  // namespace hybra::backend::cuda
