#pragma once
// An op's work on a GPU as launches that touch nothing but the addresses
// they are given: the op's operands, its result, and scratch memory of a
// size known before the call. That is what lets a captured plan (plan.hpp)
// run the op inside its own buffers and record it into a CUDA graph, which
// replays the same addresses at every call; the eager op runs the very same
// launches (push_cuda_launch). The op table names an op's form
// (graph::OpDef::cuda_launch).
#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "gpu.hpp"
#include "../../core/tensor.hpp"
#include "../../engine/push.hpp"

namespace hybra::backend::cuda {

struct CudaLaunch {
  std::int64_t scratch_bytes = 0;
  // Queues the op's launches on the GPU's stream: in holds its operands'
  // data (in the op's order), out the result's (contiguous), scratch at
  // least scratch_bytes. It allocates nothing and waits for nothing.
  std::function<void(backend::cuda::Gpu&, std::span<const void* const> in, void* out, void* scratch)> run;
  // Whether the operands may be views, strided as those the launches were
  // made for (cuBLAS reads a transposed matrix in place); else they are
  // contiguous.
  bool reads_views = false;
  // A launch that draws random numbers (dropout): the counter blocks one run
  // takes. Such a run is handed, in place of scratch memory, the address on
  // the GPU of the kernels::draw_params its draws start from (key and first
  // block), which whoever runs it writes there first: a CUDA graph replays
  // the same launches, and draws anew each call.
  std::uint64_t draw_blocks = 0;
};

// How a grid-stride kernel of kernels/ covers `elements`, as Gpu::launch
// would; fixed when a launch is made, so a test can run the same grid.
struct ElementwiseGrid {
  unsigned blocks, threads;
};

inline ElementwiseGrid grid_over(std::int64_t elements, int multiprocessors) {
  return {backend::cuda::Gpu::elementwise_blocks(elements, multiprocessors), backend::cuda::Gpu::threads_per_block};
}

// The eager op: queues `launch` on out's GPU as one engine op reading
// `inputs` (laid out as the launch was made for) and writing out, with
// scratch memory of its own if it needs any.
inline void push_cuda_launch(std::string_view op, const std::vector<Tensor>& inputs, const Tensor& out,
                             CudaLaunch launch) {
  const Device device = out.device();
  const Tensor scratch = launch.scratch_bytes ? Tensor({launch.scratch_bytes}, DType::uint8, device) : Tensor{};
  push_op_on(device, op, inputs, {out}, [inputs, out, scratch, run = std::move(launch.run)] {
    boost::container::small_vector<const void*, 4> in;
    for (const Tensor& t : inputs) in.push_back(t.raw_data());
    run(backend::cuda::gpu(out.device().id), std::span<const void* const>(in.data(), in.size()), out.raw_data(),
        scratch.defined() ? scratch.raw_data() : nullptr);
  });
}

}  // namespace hybra::backend::cuda
