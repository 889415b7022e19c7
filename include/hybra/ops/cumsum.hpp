#pragma once
// cumsum: the running sum along an axis (NumPy's cumsum; no axis: along the
// flattened tensor), from the first element or, with `reverse`, from the
// last (TensorFlow's reverse: the gradient of each is the other). Integers
// sum to int64 as hybra::sum does; floats keep their dtype and add in order
// in it, as NumPy does, on the CPU and on a GPU whose kernel has a thread
// per column; where a GPU's blocks scan long columns (kernel_for), floats
// agree with the CPU's to rounding and integers exactly. The whole op is
// this file: the eager op on tensors and symbols, the entries of its GPU
// kernels (kernels/cumsum.cuh) and every facet of ops/op.hpp.
#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "half.hpp"
#include "../backend/cpu/threads.hpp"
#include "../expr/evaluate.hpp"
#include "../backend/cuda/launch.hpp"
#include "../backend/cuda/ptx.hpp"
#include "../backend/cuda/reduce.hpp"
#include "../backend/cuda/source.hpp"
#include "layout.hpp"
#include "op.hpp"

namespace hybra {

namespace detail::cumsum {

using i64 = std::int64_t;

// x seen as (outer, R, inner) around the axis; no axis: x flattened.
struct Block {
  i64 outer, R, inner;
};
inline Block block(const Shape& shape, std::optional<i64> axis) {
  if (!axis) return {1, checked_numel(shape), 1};
  const auto a = static_cast<std::size_t>(checked_axis(*axis, shape, "cumsum"));
  Block b{1, shape[a], 1};
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (d < a) b.outer *= shape[d];
    if (d > a) b.inner *= shape[d];
  }
  return b;
}

inline DType result_dtype(DType in) { return is_floating(in) ? in : DType::int64; }

inline op::Attrs attrs(std::optional<i64> axis, bool reverse) {
  return {{"axis", op::attr_text(axis)}, {"reverse", op::attr_text(reverse)}};
}

// Each of the R rows of an (outer) block adds the previous one, so the
// inner elements run side by side (vector adds) and every element's sum
// is added in the same order as the GPU kernel adds it.
template <class In, class Out>
void scan(const In* x, Out* y, Block b, bool reverse) {
  backend::cpu::parallel_for(b.outer, b.R * b.inner, [&](i64 first, i64 last) {
    for (i64 o = first; o < last; ++o) {
      const In* xo = x + o * b.R * b.inner;
      Out* yo = y + o * b.R * b.inner;
      for (i64 k = 0; k < b.R; ++k) {
        const i64 row = (reverse ? b.R - 1 - k : k) * b.inner;
        const Out* previous = k ? yo + (reverse ? row + b.inner : row - b.inner) : nullptr;
        for (i64 i = 0; i < b.inner; ++i)
          yo[row + i] = (previous ? previous[i] : Out(0)) + static_cast<Out>(xo[row + i]);
      }
    }
  });
}

// The GPU kernels of kernels/cumsum.cuh; the threads of a block of the
// block scans (its scan_block_threads) and the rows of a tile (times its
// scan_items).
enum class Kernel { by_thread, by_block, by_chunks };
constexpr unsigned block_threads = backend::cuda::Gpu::threads_per_block;
constexpr i64 tile_rows = i64{block_threads} * 4;

// The block scans' version unless one is forced on every op: the tree,
// since CUB's BlockScan was slower on strided columns and no faster on rows
// (docs/benchmarks.md).
constexpr bool scan_cub_default = false;

// The blocks that fill a GPU: 8 of block_threads per multiprocessor.
inline i64 block_slots(int multiprocessors) { return i64{std::max(1, multiprocessors)} * 8; }

// A block per column where a thread per column would leave a GPU idle or
// read it badly: columns long enough to give each of a block's threads an
// element, and either rows (inner == 1: a thread per row reads a row apart
// from its warp's neighbours) or too few columns to give each
// multiprocessor a block's worth of threads. Columns of many tiles too few
// to fill half the block slots are cut into chunks, a block each.
inline Kernel kernel_for(Block b, int multiprocessors) {
  const i64 columns = b.outer * b.inner;
  const bool long_columns = b.R >= i64{block_threads};
  const bool few_columns = columns < i64{std::max(1, multiprocessors)} * block_threads;
  if (!long_columns || (b.inner != 1 && !few_columns)) return Kernel::by_thread;
  return b.R >= 16 * tile_rows && 2 * columns <= block_slots(multiprocessors) ? Kernel::by_chunks : Kernel::by_block;
}

// by_chunks' chunk: whole tiles, enough chunks to fill the block slots.
inline i64 chunk_rows(Block b, int multiprocessors) {
  const i64 per_column = std::max<i64>(1, block_slots(multiprocessors) / std::max<i64>(1, b.outer * b.inner));
  const i64 tiles = (b.R + tile_rows - 1) / tile_rows;
  return (tiles + per_column - 1) / per_column * tile_rows;
}

// A GPU caches its functions by name: each block scan's version names its
// program's entries. by_thread's program has one entry; the block scans'
// program has by_block's and by_chunks' three (chunk_totals, chunk_carries,
// by_chunks, in launch order).
inline std::string entry(DType in, std::string_view kernel, bool cub) {
  return hybra::detail::concat("hybra_cumsum_", name(in), '_', kernel, backend::cuda::block_combine_suffix(cub));
}
inline std::string program_name(DType in, Kernel k, bool cub) {
  return k == Kernel::by_thread ? hybra::detail::concat("hybra_cumsum_", name(in)) : entry(in, "by_block", cub);
}

// The NVRTC program of by_thread, or of the block scans, for one input
// dtype.
inline std::string cuda_program(DType in, Kernel k, bool cub) {
  const std::string X(backend::cuda::cuda_type(in)), Y(backend::cuda::cuda_type(result_dtype(in)));
  const std::string column = "long long outer, long long R, long long inner, bool reverse";
  const auto global = [](const std::string& name, const std::string& params, const std::string& body) {
    return hybra::detail::concat("\nextern \"C\" __global__ void __launch_bounds__(256) ", name, "(", params,
                                 ") {\n  hybra::kernels::", body, ";\n}\n");
  };
  if (k == Kernel::by_thread)
    return "#include <kernels/cumsum.cuh>\n" +
           global(program_name(in, k, cub), "const " + X + "* x, " + Y + "* y, " + column,
                  "cumsum_by_thread(x, y, outer, R, inner, reverse)");
  return hybra::detail::concat(
      backend::cuda::block_combine_define(cub), "#include <kernels/cumsum.cuh>\n",
      global(entry(in, "by_block", cub), "const " + X + "* x, " + Y + "* y, " + column,
             "cumsum_by_block(x, y, outer, R, inner, reverse)"),
      global(entry(in, "chunk_totals", cub), "const " + X + "* x, " + Y + "* totals, " + column + ", long long chunk",
             "cumsum_chunk_totals(x, totals, outer, R, inner, reverse, chunk)"),
      global(entry(in, "chunk_carries", cub), Y + "* totals, long long columns, long long R, long long chunk",
             "cumsum_chunk_carries(totals, columns, R, chunk)"),
      global(entry(in, "by_chunks", cub),
             "const " + X + "* x, const " + Y + "* carries, " + Y + "* y, " + column + ", long long chunk",
             "cumsum_chunks(x, carries, y, outer, R, inner, reverse, chunk)"));
}

// by_block's grid: a block per column, up to the block slots; more columns
// take turns.
inline unsigned by_block_count(Block b, int multiprocessors) {
  return static_cast<unsigned>(std::clamp<i64>(b.outer * b.inner, 1, block_slots(multiprocessors)));
}

// A contiguous x of dtype `in`, laid out as b, on a GPU, through kernel k.
inline backend::cuda::CudaLaunch cuda_launch(Block b, bool reverse, DType in, backend::cuda::Gpu& gpu, Kernel k) {
  const bool cub = k != Kernel::by_thread && backend::cuda::cub_block_combine(scan_cub_default);
  const std::string& ptx = backend::cuda::program_ptx(program_name(in, k, cub), gpu.arch(),
                                                      [in, k, cub] { return cuda_program(in, k, cub); });
  const int sms = gpu.info().multiprocessors;
  if (k == Kernel::by_chunks) {
    const i64 chunk = chunk_rows(b, sms), columns = b.outer * b.inner, chunks = (b.R + chunk - 1) / chunk;
    const auto blocks = static_cast<unsigned>(std::min(columns * chunks, block_slots(sms)));
    const unsigned carry_blocks = by_block_count(b, sms);
    const i64 scratch = columns * chunks * static_cast<i64>(size_of(result_dtype(in)));
    return {scratch, [&ptx, in, cub, b, reverse, chunk, blocks, carry_blocks](
                         backend::cuda::Gpu& gpu, std::span<const void* const> operands, void* out, void* totals) {
              if (b.outer * b.inner == 0) return;
              const void* x = operands[0];
              const void* carries = totals;
              long long outer = b.outer, R = b.R, inner = b.inner, rows = chunk, columns = b.outer * b.inner;
              bool backwards = reverse;
              void* sum_args[] = {&x, &totals, &outer, &R, &inner, &backwards, &rows};
              void* carry_args[] = {&totals, &columns, &R, &rows};
              void* scan_args[] = {&x, &carries, &out, &outer, &R, &inner, &backwards, &rows};
              gpu.launch_grid(gpu.function(ptx, entry(in, "chunk_totals", cub)), blocks, block_threads, sum_args,
                              "cumsum");
              gpu.launch_grid(gpu.function(ptx, entry(in, "chunk_carries", cub)), carry_blocks, block_threads,
                              carry_args, "cumsum");
              gpu.launch_grid(gpu.function(ptx, entry(in, "by_chunks", cub)), blocks, block_threads, scan_args,
                              "cumsum");
            }};
  }
  const std::string function = k == Kernel::by_thread ? program_name(in, k, cub) : entry(in, "by_block", cub);
  const backend::cuda::ElementwiseGrid grid =
      k == Kernel::by_thread ? backend::cuda::grid_over(b.outer * b.inner, sms)
                             : backend::cuda::ElementwiseGrid{by_block_count(b, sms), block_threads};
  return {0, [&ptx, function, b, reverse, grid](backend::cuda::Gpu& gpu, std::span<const void* const> operands,
                                                void* out, void*) {
            if (b.outer * b.R * b.inner == 0) return;
            const void* x = operands[0];
            long long outer = b.outer, R = b.R, inner = b.inner;
            bool backwards = reverse;
            void* args[] = {&x, &out, &outer, &R, &inner, &backwards};
            gpu.launch_grid(gpu.function(ptx, function), grid.blocks, grid.threads, args, "cumsum");
          }};
}

inline backend::cuda::CudaLaunch cuda_launch(Block b, bool reverse, DType in, backend::cuda::Gpu& gpu) {
  return cuda_launch(b, reverse, in, gpu, kernel_for(b, gpu.info().multiprocessors));
}

inline Tensor run(Tensor x, std::optional<i64> axis, bool reverse) {
  x.require("cumsum");
  if (auto r = compute_in_float32({x}, [&](std::span<const Tensor> f) { return run(f[0], axis, reverse); })) return *r;
  const Block b = block(x.shape(), axis);
  const Tensor xc = x.contiguous();
  Tensor out(axis ? x.shape() : Shape{b.R}, result_dtype(x.dtype()), x.device());
  if (out.device().kind == DeviceKind::cuda) {
    backend::cuda::push_cuda_launch("cumsum", {xc}, out,
                                    cuda_launch(b, reverse, xc.dtype(), backend::cuda::gpu(xc.device().id)));
    return out;
  }
  push_kernel("cumsum", {xc}, {out}, [xc, out, b, reverse] {
    dispatch(xc.dtype(), [&](auto tag) {
      using In = typename decltype(tag)::type;
      using Out = std::conditional_t<std::is_floating_point_v<In>, In, std::int64_t>;
      scan(static_cast<const In*>(xc.raw_data()), static_cast<Out*>(out.raw_data()), b, reverse);
    });
  });
  return out;
}

}  // namespace detail::cumsum

// The running sums of x along `axis` (none: of x flattened, a 1-d result),
// from the last element backwards when `reverse`. On symbols it adds a node.
template <array_like X>
auto cumsum(X&& x, std::optional<std::int64_t> axis = std::nullopt, bool reverse = false) {
  if constexpr (symbol_like<X>) {
    using S = std::conditional_t<symbol_like<X>, Symbol, void>;
    return op::make_node<S>("cumsum", detail::cumsum::attrs(axis, reverse), {S(std::forward<X>(x))});
  } else {
    Tensor t = eval(x);
    autograd::op_record rec("cumsum", {t});
    return rec.output(detail::cumsum::run(t, axis, reverse), [&] { return detail::cumsum::attrs(axis, reverse); });
  }
}

namespace op {

struct cumsum {
  static constexpr std::string_view name = "cumsum";
  static Tensor eval(std::span<const Tensor> in, const op::Attrs& a) {
    return hybra::cumsum(in[0], op::optional_int_attr(a, "axis", name), op::bool_attr(a, "reverse", name));
  }
  static std::optional<backend::cuda::CudaLaunch> cuda_launch(std::span<const Tensor> in, const Tensor&,
                                                              const op::Attrs& a, backend::cuda::Gpu& gpu) {
    const auto b = hybra::detail::cumsum::block(in[0].shape(), op::optional_int_attr(a, "axis", name));
    return hybra::detail::cumsum::cuda_launch(b, op::bool_attr(a, "reverse", name), in[0].dtype(), gpu);
  }
  // Each x[k] adds to every sum from k on: dx is dy's running sum the other way.
  template <class G>
  static auto gradient(const G& g) {
    const auto axis = op::optional_int_attr(g.attrs, "axis", "gradient");
    const bool reverse = op::bool_attr(g.attrs, "reverse", "gradient");
    return g.grads(g.reshape(hybra::cumsum(g.dy, axis, !reverse), g.shape(0)));
  }
  // MXNet's numpy cumsum, with the result's dtype written out (MXNet's own
  // default keeps an integer input's dtype); it has no reverse.
  static constexpr std::array<std::string_view, 1> mxnet{"_np_cumsum"};
  template <class W>
  static auto write(const W& w) {
    if (op::parse_bool(w.attr("reverse"), name)) w.reject("with reverse=true (MXNet's cumsum has no reverse)");
    op::Attrs a{{"dtype", std::string(hybra::name(*w.node.meta.dtype))}};
    if (w.attr("axis") != "None") a.emplace_back("axis", w.attr("axis"));
    return w.keep_all("_np_cumsum", std::move(a));
  }
  template <class R>
  static auto read(const R& r) {
    r.arity(1, 1);
    const auto axis = r.parsed("axis", [](std::string_view t) { return op::parse_int(t, "axis"); });
    auto y = r.make("cumsum", hybra::detail::cumsum::attrs(axis, false));
    const auto& x = r.inputs[0].node().meta.dtype;
    const auto want = r.attr("dtype");
    if (want && *want != hybra::name(*y.node().meta.dtype)) return r.make("astype", {{"dtype", *want}}, {y});
    if (!want && x && *x != *y.node().meta.dtype)
      return r.make("astype", {{"dtype", std::string(hybra::name(*x))}}, {y});
    return y;
  }
};

}  // namespace op

}  // namespace hybra
