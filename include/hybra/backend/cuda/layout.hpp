#pragma once
// Copies between layouts on a GPU, and the ops made of them: gathering a
// view, writing into one (assign, a copy), concat's parts and slice's
// gradient. The device code is kernels/copy.cuh, one kernel per element
// width that takes shape and strides as its parameter, so a new layout
// costs no compile; this file merges the axes both sides walk alike,
// writes the entries and launches them.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpu.hpp"
#include "../../core/tensor.hpp"
#include "../../engine/push.hpp"
#include "launch.hpp"
#include "ptx.hpp"

namespace hybra::backend::cuda {

// kernels/copy.cuh's copy_layout, as the host passes it.
inline constexpr int copy_max_axes = 6;
struct CopyLayout {
  int axes = 0;
  std::int64_t extent[copy_max_axes] = {}, from[copy_max_axes] = {}, to[copy_max_axes] = {};
};
static_assert(sizeof(CopyLayout) == 8 + 3 * copy_max_axes * sizeof(long long) && sizeof(long long) == sizeof(std::int64_t));

// The copy of a `shape` read through strides `from` and written through
// `to`: axes of extent 1 dropped, and an axis merged into the one before it
// where both sides step over it as over the rest of that axis. A view the
// ops make keeps at most a few; `op` names the copy in the error for more.
inline CopyLayout copy_layout(const Shape& shape, const Strides& from, const Strides& to, std::string_view op) {
  CopyLayout l;
  std::vector<std::int64_t> extent, src, dst;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!extent.empty() && src.back() == from[d] * shape[d] && dst.back() == to[d] * shape[d]) {
      extent.back() *= shape[d];
      src.back() = from[d];
      dst.back() = to[d];
      continue;
    }
    extent.push_back(shape[d]);
    src.push_back(from[d]);
    dst.push_back(to[d]);
  }
  if (extent.size() > static_cast<std::size_t>(copy_max_axes))
    fail<ShapeError>(op, ": a copy of shape ", to_string(shape), " from strides ", to_string(from), " to strides ",
                     to_string(to), " walks ", extent.size(), " axes that do not merge; a GPU copies through at most ",
                     copy_max_axes, " (make the operand contiguous first)");
  l.axes = static_cast<int>(extent.size());
  for (int a = 0; a < l.axes; ++a) {
    l.extent[a] = extent[static_cast<std::size_t>(a)];
    l.from[a] = src[static_cast<std::size_t>(a)];
    l.to[a] = dst[static_cast<std::size_t>(a)];
  }
  return l;
}

// The copy kernel's entry for elements of `width` bytes (a copy moves bits:
// one entry serves every dtype of a width).
inline std::string copy_entry(std::size_t width) { return hybra::detail::concat("hybra_copy_", width); }

inline std::string cuda_copy_program() {
  std::string source = "#include <kernels/copy.cuh>\n";
  for (const auto& [width, type] : {std::pair{1, "unsigned char"}, {2, "unsigned short"}, {4, "unsigned int"},
                                     {8, "unsigned long long"}})
    source += hybra::detail::concat("\nextern \"C\" __global__ void __launch_bounds__(256) ", copy_entry(width), "(const ",
                                    type, "* from, ", type,
                                    "* to, hybra::kernels::copy_layout l, long long count) {\n"
                                    "  hybra::kernels::copy_between_layouts(from, to, l, count);\n}\n");
  return source;
}

// One copy, as launched: what it reads and writes is given at the launch.
struct LayoutCopy {
  CopyLayout layout;
  std::int64_t count = 0;
  std::size_t width = 0;
  ElementwiseGrid grid{};
  std::int64_t to_offset = 0;  // elements into the destination

  LayoutCopy(const Tensor& from, const Tensor& to, std::int64_t to_offset, std::string_view op, int multiprocessors)
      : layout(copy_layout(from.shape(), from.strides(), to.strides(), op)),
        count(from.size()),
        width(size_of(from.dtype())),
        grid(grid_over(from.size(), multiprocessors)),
        to_offset(to_offset) {}

  void run(backend::cuda::Gpu& gpu, const std::string& ptx, const void* from, void* to, std::string_view op) const {
    if (count == 0) return;
    void* destination = static_cast<char*>(to) + to_offset * static_cast<std::int64_t>(width);
    CopyLayout l = layout;
    long long n = count;
    void* args[] = {&from, &destination, &l, &n};
    gpu.launch_grid(gpu.function(ptx, copy_entry(width)), grid.blocks, grid.threads, args, op);
  }
};

inline const std::string& copy_ptx(backend::cuda::Gpu& gpu) {
  return program_ptx("hybra_copy", gpu.arch(), [] { return cuda_copy_program(); });
}

// The work of an op whose result is its operands written into views of it
// (concat's parts, slice's gradient), zeroed first unless the views cover
// it: views[k] is where operand k goes, a view of `result`'s layout (meta
// tensors will do). Operands may be views themselves; nullopt where an
// operand's dtype is not the result's (the eager op converts it first).
inline std::optional<CudaLaunch> cuda_write_views_launch(std::span<const Tensor> operands, std::span<const Tensor> views,
                                                         const Tensor& result, bool zero_first, std::string_view op,
                                                         backend::cuda::Gpu& gpu) {
  std::vector<LayoutCopy> copies;
  for (std::size_t k = 0; k < operands.size(); ++k) {
    if (operands[k].dtype() != result.dtype()) return std::nullopt;
    copies.emplace_back(operands[k], views[k], views[k].offset() - result.offset(), op, gpu.info().multiprocessors);
  }
  const std::size_t bytes = static_cast<std::size_t>(result.size()) * size_of(result.dtype());
  CudaLaunch launch{0, [copies = std::move(copies), &ptx = copy_ptx(gpu), zero_first, bytes, op](
                           backend::cuda::Gpu& gpu, std::span<const void* const> in, void* out, void*) {
    if (zero_first && bytes) gpu.fill(reinterpret_cast<backend::cuda::CUdeviceptr>(out), 0, 1, bytes);
    for (std::size_t k = 0; k < copies.size(); ++k) copies[k].run(gpu, ptx, in[k], out, op);
  }};
  launch.reads_views = true;
  return launch;
}

// `launch`, made for contiguous operands, run on `operands` laid out as
// given (views among them): each view is first gathered into scratch memory
// after the launch's own by the copy kernel, so that a plan step whose op
// reads only contiguous operands (a softmax of a strided slice, say) is still
// launches a CUDA graph replays. Not for a launch that draws (its scratch is
// its draw parameters).
inline CudaLaunch gather_views_first(CudaLaunch launch, std::span<const Tensor> operands, std::string_view op,
                                     backend::cuda::Gpu& gpu) {
  struct Gather {
    std::size_t operand;
    std::int64_t offset;  // bytes into the scratch memory
    LayoutCopy copy;
  };
  constexpr std::int64_t align = Storage::alignment;
  auto aligned = [&](std::int64_t bytes) { return (bytes + align - 1) / align * align; };
  std::vector<Gather> gathers;
  std::int64_t scratch_bytes = aligned(launch.scratch_bytes);
  for (std::size_t k = 0; k < operands.size(); ++k) {
    const Tensor& view = operands[k];
    if (view.is_contiguous()) continue;
    gathers.push_back({k, scratch_bytes, LayoutCopy(view, Tensor(view.shape(), view.dtype(), meta()), 0, op,
                                                    gpu.info().multiprocessors)});
    scratch_bytes += aligned(view.size() * static_cast<std::int64_t>(size_of(view.dtype())));
  }
  CudaLaunch gathered{scratch_bytes, [run = std::move(launch.run), gathers = std::move(gathers), &ptx = copy_ptx(gpu), op](
                                         backend::cuda::Gpu& gpu, std::span<const void* const> in, void* out,
                                         void* scratch) {
    boost::container::small_vector<const void*, 4> dense(in.begin(), in.end());
    for (const Gather& g : gathers) {
      void* to = static_cast<char*>(scratch) + g.offset;
      g.copy.run(gpu, ptx, in[g.operand], to, op);
      dense[g.operand] = to;
    }
    run(gpu, std::span<const void* const>(dense.data(), dense.size()), out, scratch);
  }};
  gathered.reads_views = true;
  return gathered;
}

}  // namespace hybra::backend::cuda

namespace hybra::detail {

// Queues copying src into dst on their GPU: one dtype, any layouts.
inline void push_copy_cuda(const Tensor& src, const Tensor& dst) {
  backend::cuda::Gpu& gpu = backend::cuda::gpu(dst.device().id);
  backend::cuda::LayoutCopy copy(src, dst, 0, "copy", gpu.info().multiprocessors);
  push_op_on(dst.device(), "copy", {src}, {dst}, [src, dst, copy, &ptx = backend::cuda::copy_ptx(gpu)] {
    copy.run(backend::cuda::gpu(dst.device().id), ptx, src.raw_data(), dst.raw_data(), "copy");
  });
}

}  // namespace hybra::detail
