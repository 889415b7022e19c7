#pragma once
// conv2d, its two gradients, pooling and its gradient, and batch_norm on a
// GPU: the device code is kernels/conv.cuh, kernels/pool.cuh and
// kernels/batch_norm.cuh; this file plans the convolutions' steps, writes
// the __global__ entries NVRTC compiles with that code (one program per op
// family and dtype, compiled once, through the kernel cache), and returns
// each op's work as a backend::cuda::CudaLaunch (cuda_launch.hpp), which the eager ops
// (ops/conv.hpp, ops/conv_backward.hpp) and captured plans run.
//
// A convolution is GEMMs around kernels that move data, for a chunk of
// images at a time (as many as keep the scratch memory under a limit):
//   forward          im2col (x to columns), a GEMM per group W columns,
//                    conv_output (the product to NCHW, plus the bias);
//   data gradient    filters_major (dy to (F, pixels)), a GEMM per group
//                    W^T dy, col2im (each input element gathers its taps);
//   weight gradient  filters_major, im2col, a GEMM per group dy columns^T,
//                    accumulating into dW from the second chunk on.
// Pooling, its gradient and batch_norm are one kernel each.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "../backend/cuda/cublas.hpp"
#include "../backend/cuda/gpu.hpp"
#include "../core/dtype.hpp"
#include "conv_geometry.hpp"
#include "../backend/cuda/launch.hpp"
#include "../backend/cuda/ptx.hpp"
#include "../backend/cuda/source.hpp"

namespace hybra::detail::nn {

using Conv2dGeometry = hybra::detail::nn::Conv2dGeometry;
using Pool2dGeometry = hybra::detail::nn::Pool2dGeometry;
// The kernels take these structs by value as kernels/conv.cuh's
// conv_geometry and kernels/pool.cuh's pool_geometry: fields of long long.
static_assert(sizeof(Conv2dGeometry) == 16 * sizeof(long long) && sizeof(long long) == sizeof(std::int64_t));
static_assert(sizeof(Pool2dGeometry) == 12 * sizeof(long long));

// ---- convolutions ----

enum class ConvKernel { im2col, conv_output, filters_major, col2im, fill_zero };

// Where a step's operand is: one of the op's operands (index), its result,
// an element offset into the scratch memory, or nothing (a null pointer).
struct ConvOperand {
  enum class Buffer { input, result, scratch, none };
  Buffer buffer = Buffer::none;
  int index = 0;
  std::int64_t offset = 0;  // elements
};

// One launch of a kernels/conv.cuh kernel (reading a and b, writing c, over
// `images` images; fill_zero: `images` elements), or one GEMM c = op(a)
// op(b) (+ c when accumulate), row-major as backend::cuda::gemm takes it.
struct ConvStep {
  bool gemm = false;
  ConvKernel kernel = ConvKernel::im2col;
  ConvOperand a, b, c;
  std::int64_t images = 0;
  backend::cuda::ElementwiseGrid grid{0, 0};
  bool trans_a = false, trans_b = false, accumulate = false;
  std::int64_t M = 0, N = 0, K = 0, lda = 0, ldb = 0, ldc = 0;
};

struct ConvPlan {
  Conv2dGeometry geometry;
  std::vector<ConvStep> steps;
  std::int64_t scratch_elements = 0;
};

// The scratch memory a convolution's plan keeps under, in elements, unless
// a single image needs more.
inline constexpr std::int64_t conv_scratch_elements = std::int64_t{1} << 24;

// The steps of one pass of the convolution of geometry g (with a bias: the
// forward's third operand) on a GPU of `multiprocessors` SMs. The operands
// are the ops': forward (x, w[, bias]) to y; backward_data (dy, w) to dx;
// backward_weight (dy, x) to dW. Scratch holds, per image of a chunk, F P
// elements of filter-major products and C KH KW P of columns.
inline ConvPlan plan_conv2d(ConvPass pass, const Conv2dGeometry& g, bool bias, int multiprocessors,
                            std::int64_t scratch_limit = conv_scratch_elements) {
  using i64 = std::int64_t;
  using B = ConvOperand::Buffer;
  ConvPlan plan{g, {}, 0};
  const i64 P = g.OH * g.OW, taps = g.C * g.KH * g.KW, Fg = g.F / g.groups, K = taps / g.groups;
  const i64 image_elements = g.C * g.H * g.W;
  auto input = [](int index, i64 offset) { return ConvOperand{B::input, index, offset}; };
  auto result = [](i64 offset) { return ConvOperand{B::result, 0, offset}; };
  auto scratch = [](i64 offset) { return ConvOperand{B::scratch, 0, offset}; };
  auto kernel = [&](ConvKernel k, ConvOperand a, ConvOperand b, ConvOperand c, i64 images, i64 elements) {
    plan.steps.push_back(ConvStep{.kernel = k,
                                  .a = a,
                                  .b = b,
                                  .c = c,
                                  .images = images,
                                  .grid = backend::cuda::grid_over(elements, multiprocessors)});
  };
  auto gemm = [&](bool trans_a, bool trans_b, i64 M, i64 N, i64 K_, ConvOperand a, i64 lda, ConvOperand b, i64 ldb,
                  ConvOperand c, i64 ldc, bool accumulate) {
    plan.steps.push_back(ConvStep{.gemm = true, .a = a, .b = b, .c = c, .trans_a = trans_a, .trans_b = trans_b,
                                  .accumulate = accumulate, .M = M, .N = N, .K = K_, .lda = lda, .ldb = ldb, .ldc = ldc});
  };

  const i64 result_size = pass == ConvPass::forward         ? g.N * g.F * P
                          : pass == ConvPass::backward_data ? g.N * image_elements
                                                            : g.F * K;
  if (result_size == 0) return plan;
  // What nothing contributes to: a data gradient through no filters, a
  // weight gradient of no images, a forward of no channels (the bias alone).
  if (pass == ConvPass::backward_data && g.F == 0) {
    kernel(ConvKernel::fill_zero, {}, {}, result(0), result_size, result_size);
    return plan;
  }
  if (pass == ConvPass::backward_weight && g.N == 0) {
    kernel(ConvKernel::fill_zero, {}, {}, result(0), result_size, result_size);
    return plan;
  }
  if (pass == ConvPass::forward && K == 0) {
    kernel(ConvKernel::conv_output, {}, bias ? input(2, 0) : ConvOperand{}, result(0), g.N, result_size);
    return plan;
  }

  const i64 per_image = (taps + g.F) * P;
  const i64 chunk = std::clamp<i64>(scratch_limit / std::max<i64>(per_image, 1), 1, g.N);
  plan.scratch_elements = chunk * per_image;
  const i64 columns_at = chunk * g.F * P;  // the products (F, chunk P) first, then the columns (C KH KW, chunk P)
  for (i64 n0 = 0; n0 < g.N; n0 += chunk) {
    const i64 images = std::min(chunk, g.N - n0), cols = images * P;
    switch (pass) {
      case ConvPass::forward:
        kernel(ConvKernel::im2col, input(0, n0 * image_elements), {}, scratch(columns_at), images, taps * cols);
        for (i64 grp = 0; grp < g.groups; ++grp)
          gemm(false, false, Fg, cols, K, input(1, grp * Fg * K), K, scratch(columns_at + grp * K * cols), cols,
               scratch(grp * Fg * cols), cols, false);
        kernel(ConvKernel::conv_output, scratch(0), bias ? input(2, 0) : ConvOperand{}, result(n0 * g.F * P), images,
               images * g.F * P);
        break;
      case ConvPass::backward_data:
        kernel(ConvKernel::filters_major, input(0, n0 * g.F * P), {}, scratch(0), images, images * g.F * P);
        for (i64 grp = 0; grp < g.groups; ++grp)
          gemm(true, false, K, cols, Fg, input(1, grp * Fg * K), K, scratch(grp * Fg * cols), cols,
               scratch(columns_at + grp * K * cols), cols, false);
        kernel(ConvKernel::col2im, scratch(columns_at), {}, result(n0 * image_elements), images,
               images * image_elements);
        break;
      case ConvPass::backward_weight:
        kernel(ConvKernel::filters_major, input(0, n0 * g.F * P), {}, scratch(0), images, images * g.F * P);
        kernel(ConvKernel::im2col, input(1, n0 * image_elements), {}, scratch(columns_at), images, taps * cols);
        for (i64 grp = 0; grp < g.groups; ++grp)
          gemm(false, true, Fg, K, cols, scratch(grp * Fg * cols), cols, scratch(columns_at + grp * K * cols), cols,
               result(grp * Fg * K), K, n0 > 0);
        break;
    }
  }
  return plan;
}

// Runs a plan's steps in order, its operands made addresses: kernel(step, a,
// b, c) and gemm(step, a, b, c) (the GPU's launches and cuBLAS, or a test's).
// element_bytes is the dtype's size, for the offsets.
template <class Kernel, class Gemm>
void run_conv_plan(const ConvPlan& plan, std::span<const void* const> in, void* result, void* scratch,
                   std::size_t element_bytes, Kernel&& kernel, Gemm&& gemm) {
  auto address = [&](const ConvOperand& o) -> void* {
    const auto bytes = static_cast<std::ptrdiff_t>(o.offset) * static_cast<std::ptrdiff_t>(element_bytes);
    switch (o.buffer) {
      case ConvOperand::Buffer::input:
        return const_cast<char*>(static_cast<const char*>(in[static_cast<std::size_t>(o.index)])) + bytes;
      case ConvOperand::Buffer::result: return static_cast<char*>(result) + bytes;
      case ConvOperand::Buffer::scratch: return static_cast<char*>(scratch) + bytes;
      case ConvOperand::Buffer::none: return nullptr;
    }
    return nullptr;
  };
  for (const ConvStep& s : plan.steps) {
    if (s.gemm) gemm(s, address(s.a), address(s.b), address(s.c));
    else kernel(s, address(s.a), address(s.b), address(s.c));
  }
}

inline std::string_view conv_kernel_name(ConvKernel k) {
  switch (k) {
    case ConvKernel::im2col: return "im2col";
    case ConvKernel::conv_output: return "conv_output";
    case ConvKernel::filters_major: return "filters_major";
    case ConvKernel::col2im: return "col2im";
    case ConvKernel::fill_zero: return "fill_zero";
  }
  return "?";
}

inline std::string conv_entry(ConvKernel k, DType t) {
  return hybra::detail::concat("hybra_conv_", conv_kernel_name(k), '_', name(t));
}

// The NVRTC program of the convolutions of one floating dtype: an entry per
// ConvKernel, all with the parameters (a, b, c, geometry, images).
inline std::string cuda_conv_program(DType t) {
  const std::string T(backend::cuda::cuda_type(t));
  std::string source = "#include <kernels/conv.cuh>\n";
  for (ConvKernel k : {ConvKernel::im2col, ConvKernel::conv_output, ConvKernel::filters_major, ConvKernel::col2im,
                       ConvKernel::fill_zero}) {
    const std::string_view call = k == ConvKernel::conv_output ? "(a, b, c, g, images)"
                                  : k == ConvKernel::fill_zero ? "(c, images)"
                                                               : "(a, c, g, images)";
    source += hybra::detail::concat("\nextern \"C\" __global__ void __launch_bounds__(256) ", conv_entry(k, t),
                                    "(const ", T, "* a, const ", T, "* b, ", T,
                                    "* c, hybra::kernels::conv_geometry g, long long images) {\n  hybra::kernels::",
                                    conv_kernel_name(k), call, ";\n}\n");
  }
  return source;
}

// The op's work for a pass of the convolution g in dtype t (float32 or
// float64) on a GPU: the program is compiled at the call (a compile error is
// the caller's), the steps planned for this GPU.
inline backend::cuda::CudaLaunch cuda_conv2d_launch(ConvPass pass, const Conv2dGeometry& g, bool bias, DType t,
                                                    backend::cuda::Gpu& gpu) {
  const std::string& ptx = backend::cuda::program_ptx(hybra::detail::concat("hybra_conv_", name(t)), gpu.arch(),
                                                      [&] { return cuda_conv_program(t); });
  auto plan = std::make_shared<const ConvPlan>(plan_conv2d(pass, g, bias, gpu.info().multiprocessors));
  const std::string_view what = pass == ConvPass::forward         ? "conv2d"
                                : pass == ConvPass::backward_data ? "conv2d_backward_data"
                                                                  : "conv2d_backward_weight";
  return {plan->scratch_elements * static_cast<std::int64_t>(size_of(t)),
          [plan, &ptx, t, what](backend::cuda::Gpu& gpu, std::span<const void* const> in, void* out, void* scratch) {
            run_conv_plan(
                *plan, in, out, scratch, size_of(t),
                [&](const ConvStep& s, void* a, void* b, void* c) {
                  Conv2dGeometry geometry = plan->geometry;
                  long long images = s.images;
                  void* args[] = {&a, &b, &c, &geometry, &images};
                  gpu.launch_grid(gpu.function(ptx, conv_entry(s.kernel, t)), s.grid.blocks, s.grid.threads, args,
                                  what);
                },
                [&](const ConvStep& s, void* a, void* b, void* c) {
                  auto product = [&]<class T>(T) {
                    backend::cuda::gemm<T>(gpu, s.trans_a, s.trans_b, s.M, s.N, s.K, T(1), static_cast<const T*>(a),
                                           s.lda, static_cast<const T*>(b), s.ldb, T(s.accumulate ? 1 : 0),
                                           static_cast<T*>(c), s.ldc);
                  };
                  if (t == DType::float32) product(float{});
                  else product(double{});
                });
          }};
}

// ---- pooling ----

inline std::string pool_entry(bool max, bool backward, DType t) {
  return hybra::detail::concat("hybra_", max ? "max" : "avg", backward ? "_pool2d_backward_" : "_pool2d_", name(t));
}
inline std::string disjoint_max_pool_backward_entry(DType t) {
  return hybra::detail::concat("hybra_max_pool2d_backward_disjoint_", name(t));
}

// Whether no input element is in two windows (along each axis the stride is
// at least the window, or there is one window): then a max pool's gradient
// is a thread per window (kernels/pool.cuh).
inline bool disjoint_windows(const Pool2dGeometry& g) {
  return (g.sh >= g.KH || g.OH <= 1) && (g.sw >= g.KW || g.OW <= 1);
}

// The NVRTC program of pooling of one floating dtype: max and average,
// forward (x, -, y) and backward (dy, x, dx), all with the parameters (a, b,
// out, geometry, count_include_pad).
inline std::string cuda_pool_program(DType t) {
  const std::string T(backend::cuda::cuda_type(t));
  std::string source = "#include <kernels/pool.cuh>\n";
  for (bool backward : {false, true})
    for (bool max : {true, false})
      source += hybra::detail::concat(
          "\nextern \"C\" __global__ void __launch_bounds__(256) ", pool_entry(max, backward, t), "(const ", T,
          "* a, const ", T, "* b, ", T, "* out, hybra::kernels::pool_geometry g, int count_include_pad) {\n  ",
          backward ? "hybra::kernels::pool2d_backward<" : "hybra::kernels::pool2d<", T, max ? ", true>" : ", false>",
          backward ? "(a, b, out, g, count_include_pad != 0);\n}\n" : "(a, out, g, count_include_pad != 0);\n}\n");
  source += hybra::detail::concat("\nextern \"C\" __global__ void __launch_bounds__(256) ",
                                  disjoint_max_pool_backward_entry(t), "(const ", T, "* a, const ", T, "* b, ", T,
                                  "* out, hybra::kernels::pool_geometry g, int) {\n"
                                  "  hybra::kernels::max_pool2d_backward_disjoint(a, b, out, g);\n}\n");
  return source;
}

// The op's work for a pooling of geometry g (max or average; backward: its
// gradient, whose operands are (dy, x)) in dtype t on a GPU.
inline backend::cuda::CudaLaunch cuda_pool2d_launch(bool max, bool backward, const Pool2dGeometry& g,
                                                    bool count_include_pad, DType t, backend::cuda::Gpu& gpu) {
  const std::string& ptx = backend::cuda::program_ptx(hybra::detail::concat("hybra_pool_", name(t)), gpu.arch(),
                                                      [&] { return cuda_pool_program(t); });
  // A max pool's gradient over disjoint windows: zero dx, then a thread per window.
  const bool per_window = max && backward && disjoint_windows(g);
  const std::int64_t elements = backward && !per_window ? g.N * g.C * g.H * g.W : g.N * g.C * g.OH * g.OW;
  const std::size_t dx_bytes = per_window ? static_cast<std::size_t>(g.N * g.C * g.H * g.W) * size_of(t) : 0;
  const backend::cuda::ElementwiseGrid grid = backend::cuda::grid_over(elements, gpu.info().multiprocessors);
  std::string entry = per_window ? disjoint_max_pool_backward_entry(t) : pool_entry(max, backward, t);
  return {0, [&ptx, g, count_include_pad, backward, elements, dx_bytes, grid, entry = std::move(entry)](
                 backend::cuda::Gpu& gpu, std::span<const void* const> in, void* out, void*) {
            if (dx_bytes) gpu.fill(reinterpret_cast<backend::cuda::CUdeviceptr>(out), 0, 1, dx_bytes);
            if (elements == 0) return;
            const void* a = in[0];
            const void* b = backward ? in[1] : nullptr;
            Pool2dGeometry geometry = g;
            int include_pad = count_include_pad ? 1 : 0;
            void* args[] = {&a, &b, &out, &geometry, &include_pad};
            gpu.launch_grid(gpu.function(ptx, entry), grid.blocks, grid.threads, args,
                            backward ? "pool2d_backward" : "pool2d");
          }};
}

// ---- batch_norm ----

inline std::string batch_norm_entry(DType t) { return hybra::detail::concat("hybra_batch_norm_", name(t)); }

// The NVRTC program of batch_norm's inference form of one floating dtype:
// one entry (x, gamma, beta, mean, var, y, outer, C, inner, eps).
inline std::string cuda_batch_norm_program(DType t) {
  const std::string T(backend::cuda::cuda_type(t));
  return hybra::detail::concat("#include <kernels/batch_norm.cuh>\n\nextern \"C\" __global__ void __launch_bounds__(256) ",
                               batch_norm_entry(t), "(const ", T, "* x, const ", T, "* gamma, const ", T, "* beta, const ",
                               T, "* mean, const ", T, "* var, ", T,
                               "* y, long long outer, long long C, long long inner, double eps) {\n"
                               "  hybra::kernels::batch_norm(x, gamma, beta, mean, var, y, outer, C, inner, eps);\n}\n");
}

// batch_norm of x seen as (outer, C, inner), operands (x, gamma, beta,
// running_mean, running_var), in dtype t on a GPU.
inline backend::cuda::CudaLaunch cuda_batch_norm_launch(std::int64_t outer, std::int64_t C, std::int64_t inner,
                                                        double eps, DType t, backend::cuda::Gpu& gpu) {
  const std::string& ptx =
      backend::cuda::program_ptx(batch_norm_entry(t), gpu.arch(), [&] { return cuda_batch_norm_program(t); });
  const backend::cuda::ElementwiseGrid grid = backend::cuda::grid_over(outer * C * inner, gpu.info().multiprocessors);
  return {0, [&ptx, outer, C, inner, eps, t, grid](backend::cuda::Gpu& gpu, std::span<const void* const> in, void* out,
                                                   void*) {
            if (outer * C * inner == 0) return;
            const void* operands[5] = {in[0], in[1], in[2], in[3], in[4]};
            long long o = outer, c = C, i = inner;
            double e = eps;
            void* args[] = {&operands[0], &operands[1], &operands[2], &operands[3], &operands[4], &out, &o, &c, &i, &e};
            gpu.launch_grid(gpu.function(ptx, batch_norm_entry(t)), grid.blocks, grid.threads, args, "batch_norm");
          }};
}

}  // namespace hybra::detail::nn
