#pragma once
// random_uniform, random_normal and dropout on a GPU: one kernel of
// kernels/random.cuh per draw and dtype, drawing from the counter blocks the
// call reserved, as the CPU would.
#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "gpu.hpp"
#include "../../core/random.hpp"
#include "../../core/tensor.hpp"
#include "../../engine/push.hpp"
#include "launch.hpp"
#include "ptx.hpp"
#include "source.hpp"

namespace hybra::backend::cuda {

// kernels/random.cuh's draw_params, as the host passes it.
struct DrawParams {
  std::uint64_t first;
  std::uint32_t key0, key1;
  double a, b;
};
static_assert(sizeof(DrawParams) == 32);

inline std::string random_entry(bool normal, DType t) {
  return hybra::detail::concat("hybra_random_", normal ? "normal_" : "uniform_", name(t));
}
inline std::string dropout_entry(DType t) { return hybra::detail::concat("hybra_dropout_", name(t)); }

// One program: an entry per draw and floating dtype, and dropout's.
inline std::string cuda_random_program() {
  std::string source = "#include <kernels/random.cuh>\n";
  for (DType t : {DType::float32, DType::float64}) {
    const std::string T(cuda_type(t));
    for (bool normal : {false, true})
      source += hybra::detail::concat("\nextern \"C\" __global__ void __launch_bounds__(256) ", random_entry(normal, t),
                                      "(", T, "* out, long long count, hybra::kernels::draw_params p) {\n"
                                      "  hybra::kernels::random_fill<", T, ", ", normal ? "true" : "false",
                                      ">(out, count, p);\n}\n");
    source += hybra::detail::concat("\nextern \"C\" __global__ void __launch_bounds__(256) ", dropout_entry(t), "(const ",
                                    T, "* x, ", T, "* y, long long count, hybra::kernels::draw_params by_value, "
                                    "const hybra::kernels::draw_params* from_plan, double rate) {\n"
                                    "  hybra::kernels::dropout(x, y, count, by_value, from_plan, rate);\n}\n");
  }
  return source;
}

inline const std::string& random_ptx(backend::cuda::Gpu& gpu) {
  return program_ptx("hybra_random", gpu.arch(), [] { return cuda_random_program(); });
}

// Training dropout of `count` elements of dtype t at `rate` on a GPU: one
// kernel, a thread per pair of elements.
struct DropoutKernel {
  DType dtype;
  std::int64_t count;
  double rate;
  ElementwiseGrid grid;
  const std::string* ptx;

  DropoutKernel(DType t, std::int64_t count, double rate, backend::cuda::Gpu& gpu)
      : dtype(t), count(count), rate(rate), grid(grid_over(Generator::blocks_for(count), gpu.info().multiprocessors)),
        ptx(&random_ptx(gpu)) {}

  // Queues it on gpu's stream, drawing from `by_value`, or from the
  // draw_params at `from_plan` on the GPU when that is not null.
  void run(backend::cuda::Gpu& gpu, const void* x, void* y, const DrawParams& by_value, const void* from_plan) const {
    if (count == 0) return;
    long long n = count;
    DrawParams p = by_value;
    double r = rate;
    void* args[] = {&x, &y, &n, &p, &from_plan, &r};
    gpu.launch_grid(gpu.function(*ptx, dropout_entry(dtype)), grid.blocks, grid.threads, args, "dropout");
  }
};

// Dropout as a plan's step (graph::OpDef::cuda_launch): its draws come from
// the draw_params the plan writes before each call (CudaLaunch::draw_blocks).
inline CudaLaunch cuda_dropout_launch(DType t, std::int64_t count, double rate, backend::cuda::Gpu& gpu) {
  CudaLaunch launch{0, [kernel = DropoutKernel(t, count, rate, gpu)](backend::cuda::Gpu& gpu,
                                                                      std::span<const void* const> in, void* out,
                                                                      void* draws) { kernel.run(gpu, in[0], out, {}, draws); }};
  launch.draw_blocks = Generator::blocks_for(count);
  return launch;
}

}  // namespace hybra::backend::cuda

namespace hybra::detail {

inline void push_draws_cuda(const Tensor& t, bool normal, double a, double b, std::array<std::uint32_t, 2> key,
                            std::uint64_t first, const char* op) {
  backend::cuda::Gpu& gpu = backend::cuda::gpu(t.device().id);
  const std::string& ptx = backend::cuda::random_ptx(gpu);
  const backend::cuda::ElementwiseGrid grid =
      backend::cuda::grid_over(Generator::blocks_for(t.size()), gpu.info().multiprocessors);
  const backend::cuda::DrawParams params{first, key[0], key[1], a, b};
  push_op_on(t.device(), op, {}, {t}, [t, normal, params, grid, &ptx, op] {
    if (t.size() == 0) return;
    backend::cuda::Gpu& g = backend::cuda::gpu(t.device().id);
    void* out = t.raw_data();
    long long count = t.size();
    backend::cuda::DrawParams p = params;
    void* args[] = {&out, &count, &p};
    g.launch_grid(g.function(ptx, backend::cuda::random_entry(normal, t.dtype())), grid.blocks, grid.threads, args, op);
  });
}

}  // namespace hybra::detail
