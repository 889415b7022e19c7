#pragma once
// random_uniform and random_normal on a GPU (and so dropout and the
// initialisers there): one kernel of kernels/random.cuh per draw and dtype,
// drawing from the counter blocks the call reserved, as the CPU would.
#include <array>
#include <cstdint>
#include <string>

#include "../backend/cuda/gpu.hpp"
#include "../core/random.hpp"
#include "../core/tensor.hpp"
#include "../engine/push.hpp"
#include "cuda_launch.hpp"
#include "cuda_ptx.hpp"
#include "cuda_source.hpp"

namespace hybra::jit {

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

// One program: an entry per draw and floating dtype.
inline std::string cuda_random_program() {
  std::string source = "#include <kernels/random.cuh>\n";
  for (DType t : {DType::float32, DType::float64})
    for (bool normal : {false, true}) {
      const std::string T(cuda_type(t));
      source += hybra::detail::concat("\nextern \"C\" __global__ void __launch_bounds__(256) ", random_entry(normal, t),
                                      "(", T, "* out, long long count, hybra::kernels::draw_params p) {\n"
                                      "  hybra::kernels::random_fill<", T, ", ", normal ? "true" : "false",
                                      ">(out, count, p);\n}\n");
    }
  return source;
}

}  // namespace hybra::jit

namespace hybra::detail {

inline void push_draws_cuda(const Tensor& t, bool normal, double a, double b, std::array<std::uint32_t, 2> key,
                            std::uint64_t first, const char* op) {
  backend::cuda::Gpu& gpu = backend::cuda::gpu(t.device().id);
  const std::string& ptx = jit::program_ptx("hybra_random", gpu.arch(), [] { return jit::cuda_random_program(); });
  const jit::ElementwiseGrid grid = jit::grid_over(Generator::blocks_for(t.size()), gpu.info().multiprocessors);
  const jit::DrawParams params{first, key[0], key[1], a, b};
  push_op_on(t.device(), op, {}, {t}, [t, normal, params, grid, &ptx, op] {
    if (t.size() == 0) return;
    backend::cuda::Gpu& g = backend::cuda::gpu(t.device().id);
    void* out = t.raw_data();
    long long count = t.size();
    jit::DrawParams p = params;
    void* args[] = {&out, &count, &p};
    g.launch_grid(g.function(ptx, jit::random_entry(normal, t.dtype())), grid.blocks, grid.threads, args, op);
  });
}

}  // namespace hybra::detail
