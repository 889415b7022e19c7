#pragma once
// An eager expression on a GPU, as ONE kernel: at the first evaluation of an
// expression type in a dtype on a GPU (and in a layout, for broadcast
// operands and views), its fused program (from
// the type alone: expr::fused_program) becomes CUDA source, NVRTC compiles it
// (through the kernel cache: memory, then disk), and the PTX is loaded into
// the GPU; each evaluation is then one launch on the GPU's stream, its
// scalars (`a * 2`'s 2) passed as the kernel's arguments: the kernel is the
// type's, the values the call's. A compile
// error is thrown by the call that needed the kernel. A dtype conversion
// (astype, a copy into another dtype) is likewise one kernel per pair of
// dtypes.
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../backend/cuda/gpu.hpp"
#include "../backend/cuda/layout.hpp"
#include "../backend/cuda/convert.hpp"
#include "../backend/cuda/source.hpp"
#include "cuda_elementwise.hpp"

namespace hybra {

namespace detail {

// A scalar of an eager expression as its kernel's argument: converted to
// the kernel's dtype as the literal of a graph's kernel would be, passed by
// value (expr::KernelConstants::parameters).
struct KernelScalar {
  alignas(8) unsigned char bytes[8] = {};
};
inline KernelScalar kernel_scalar(double real, std::int64_t integer, DType d) {
  KernelScalar s;
  dispatch(d, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T v = std::is_floating_point_v<T> ? static_cast<T>(real) : static_cast<T>(integer);
    std::memcpy(s.bytes, &v, sizeof v);
  });
  return s;
}
using KernelScalars = boost::container::small_vector<KernelScalar, 4>;

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
// the op), its kernels, its fused program made on demand, and this call's
// scalars, in the program's order of constants.
inline void push_fused_program_cuda(std::string_view name, CudaExpressionKernels& kernels,
                                    backend::cpu::FusedProgram (*program)(const void*), const void* expression,
                                    const leaf_list& leaves, const Tensor& out, const KernelScalars& scalars) {
  if (!out.is_contiguous()) {
    // A kernel writes its result contiguously (one kernel per layout of the
    // operands is enough); a copy then puts it into the view.
    Tensor whole(out.shape(), out.dtype(), out.device());
    push_fused_program_cuda(name, kernels, program, expression, leaves, whole, scalars);
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
    const bool hit = it != kernels.compiled.end();
    if (!hit || backend::cuda::check_caches()) {
      // GPUs of one architecture share the compile through the kernel cache.
      const backend::cpu::FusedProgram p = program(expression);
      if (p.constants.size() != scalars.size())
        fail<Error>("cuda: ", name, " has ", scalars.size(), " scalars but its program ", p.constants.size(), " constants");
      backend::cuda::CudaKernel k =
          expr::cuda_elementwise_kernel(p, out.shape(), strides, expr::KernelConstants::parameters);
      if (hit && k.name != it->second.kernel)
        fail<Error>("cuda: the kernel cached for ", name, " is ", it->second.kernel, " but this call's code is ", k.name,
                    ": the cache's key misses something the code depends on");
      if (!hit) {
        std::string ptx = backend::cuda::cuda_ptx(backend::cuda::cuda_program({k}), k.name + ".cu", gpu.arch());
        it = kernels.compiled.emplace(std::move(key), CudaExpressionKernels::Compiled{std::move(ptx), std::move(k.name)})
                 .first;
      }
    }
    kernel = &it->second;  // std::map entries stay where they are
  }

  boost::container::small_vector<Tensor, 8> inputs;
  for (const Tensor* t : leaves) inputs.push_back(*t);
  push_op_on(out.device(), name, leaves, {out}, [inputs = std::move(inputs), out, kernel, name, scalars] {
    backend::cuda::Gpu& g = backend::cuda::gpu(out.device().id);
    boost::container::small_vector<void*, 10> pointers, args;
    for (const Tensor& t : inputs) pointers.push_back(t.raw_data());
    pointers.push_back(out.raw_data());
    long long n = out.size();
    for (void*& p : pointers) args.push_back(&p);
    args.push_back(&n);
    for (const KernelScalar& s : scalars) args.push_back(const_cast<unsigned char*>(s.bytes));
    g.launch(g.function(kernel->ptx, kernel->kernel), n, args.data(), name);
  });
}

inline void push_convert_cuda(const Tensor& src, const Tensor& dst) {
  backend::cuda::push_cuda_launch(
      "astype", {src}, dst,
      backend::cuda::cuda_convert_launch(src.dtype(), dst.dtype(), dst.size(), backend::cuda::gpu(dst.device().id)));
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
  KernelScalars scalars;
  auto leaf = [&](const auto& value) {
    if constexpr (!std::is_same_v<std::remove_cvref_t<decltype(value)>, Tensor>)
      scalars.push_back(kernel_scalar(static_cast<double>(value), static_cast<std::int64_t>(value), out.dtype()));
    return 0;
  };
  auto node = [](auto, auto...) { return 0; };
  fold(e, leaf, node);  // the order expr::fused_program numbers its constants in
  push_fused_program_cuda(
      name, kernels, [](const void* expression) { return expr::fused_program(*static_cast<const E*>(expression)); }, &e,
      leaves, out, scalars);
}

}  // namespace hybra
