#pragma once
// An eager expression on a GPU, as ONE kernel: at the first evaluation of an
// expression type in a dtype on a GPU (and in a layout, for broadcast
// operands and views), its fused program (from
// the type alone: jit::fused_program) becomes CUDA source, NVRTC compiles it
// (through the kernel cache: memory, then disk), and the PTX is loaded into
// the GPU; each evaluation is then one launch on the GPU's stream. A compile
// error is thrown by the call that needed the kernel. A dtype conversion
// (astype, a copy into another dtype) is likewise one kernel per pair of
// dtypes.
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>
#include <utility>

#include "../backend/cuda/gpu.hpp"
#include "cuda_layout.hpp"
#include "cuda_source.hpp"

namespace hybra {

namespace jit {

// Converting `count` contiguous elements from one dtype to another on a GPU
// (astype, a copy into another dtype): one kernel per pair of dtypes.
inline CudaLaunch cuda_convert_launch(DType from, DType to, std::int64_t count, backend::cuda::Gpu& gpu) {
  std::string kernel = cuda_convert_kernel_name(from, to);
  const std::string& ptx = program_ptx(kernel, gpu.arch(), [&] { return cuda_program({cuda_convert_kernel(from, to)}); });
  return {0, [&ptx, kernel = std::move(kernel), count](backend::cuda::Gpu& gpu, std::span<const void* const> in, void* out,
                                                        void*) {
            const void* source = in[0];
            long long n = count;
            void* args[] = {&source, &out, &n};
            gpu.launch(gpu.function(ptx, kernel), n, args, "astype");
          }};
}

}  // namespace jit

namespace detail {

// The kernels of one expression type, by dtype, GPU and layout (empty for
// the contiguous kernel).
struct CudaExpressionKernels {
  struct Compiled {
    std::string ptx, kernel;
  };
  std::mutex mutex;
  std::map<std::tuple<DType, int, std::string>, Compiled> compiled;
};

// push_fused_cuda without the expression's type: its name (which outlives
// the op), its kernels, and its fused program made on demand.
inline void push_fused_program_cuda(std::string_view name, CudaExpressionKernels& kernels,
                                    backend::cpu::FusedProgram (*program)(const void*), const void* expression,
                                    const leaf_list& leaves, const Tensor& out) {
  if (!out.is_contiguous()) {
    // A kernel writes its result contiguously (one kernel per layout of the
    // operands is enough); a copy then puts it into the view.
    Tensor whole(out.shape(), out.dtype(), out.device());
    push_fused_program_cuda(name, kernels, program, expression, leaves, whole);
    return push_copy_cuda(whole, out);
  }
  // Operands of the result's shape that are contiguous are read at the
  // element's index by one kernel per dtype; a broadcast operand or a view
  // gets a kernel of its own layout (its strides are constants of the code).
  std::vector<Strides> strides;
  std::string layout;
  for (const Tensor* t : leaves)
    if (t->shape() != out.shape() || !t->is_contiguous()) {
      strides.assign(leaves.size(), {});
      for (std::size_t k = 0; k < leaves.size(); ++k) {
        const Tensor& leaf = *leaves[k];
        if (leaf.shape() == out.shape() && leaf.is_contiguous()) continue;
        strides[k] = broadcast_strides(leaf, out.shape());
        layout += std::to_string(k) + ':' + to_string(strides[k]) + ' ';
      }
      layout += to_string(out.shape());
      break;
    }
  backend::cuda::Gpu& gpu = backend::cuda::gpu(out.device().id);

  const CudaExpressionKernels::Compiled* kernel;
  {
    std::lock_guard g(kernels.mutex);
    auto key = std::make_tuple(out.dtype(), out.device().id, std::move(layout));
    auto it = kernels.compiled.find(key);
    if (it == kernels.compiled.end()) {
      // GPUs of one architecture share the compile through the kernel cache.
      jit::CudaKernel k = jit::cuda_elementwise_kernel(program(expression), out.shape(), strides);
      std::string ptx = jit::cuda_ptx(jit::cuda_program({k}), k.name + ".cu", gpu.arch());
      it = kernels.compiled.emplace(std::move(key), CudaExpressionKernels::Compiled{std::move(ptx), std::move(k.name)})
               .first;
    }
    kernel = &it->second;  // std::map entries stay where they are
  }

  boost::container::small_vector<Tensor, 8> inputs;
  for (const Tensor* t : leaves) inputs.push_back(*t);
  push_op_on(out.device(), name, leaves, {out}, [inputs = std::move(inputs), out, kernel, name] {
    backend::cuda::Gpu& g = backend::cuda::gpu(out.device().id);
    boost::container::small_vector<void*, 10> pointers, args;
    for (const Tensor& t : inputs) pointers.push_back(t.raw_data());
    pointers.push_back(out.raw_data());
    long long n = out.size();
    for (void*& p : pointers) args.push_back(&p);
    args.push_back(&n);
    g.launch(g.function(kernel->ptx, kernel->kernel), n, args.data(), name);
  });
}

inline void push_convert_cuda(const Tensor& src, const Tensor& dst) {
  jit::push_cuda_launch("astype", {src}, dst,
                        jit::cuda_convert_launch(src.dtype(), dst.dtype(), dst.size(), backend::cuda::gpu(dst.device().id)));
}

}  // namespace detail

// The expression's type decides its name and program; the rest is
// push_fused_program_cuda, compiled once whatever the expression.
template <class E>
void detail::push_fused_cuda(const E& e, const leaf_list& leaves, const Tensor& out) {
  // Never destroyed: ops still queued when the program ends run after
  // function-local statics are gone, and they use these.
  static const std::string& name = *new std::string(type_string(e));
  static CudaExpressionKernels& kernels = *new CudaExpressionKernels;
  push_fused_program_cuda(
      name, kernels, [](const void* expression) { return jit::fused_program(*static_cast<const E*>(expression)); }, &e,
      leaves, out);
}

}  // namespace hybra
