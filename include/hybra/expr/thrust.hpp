#pragma once
// The compile-time fusion path through Thrust: an expression's kernel tree
// (kernel.hpp) evaluated by thrust::transform (with_thrust::evaluate, or
// assign into a tensor of the caller's), or reduced by
// thrust::transform_reduce (sum, max, min), as one pass with no temporaries. Which backend
// runs it follows where the tensors live:
// - on cuda(i), Thrust's CUDA backend on that GPU's stream, with scratch from
//   hybra's caching allocator; only code that nvcc compiles has it, so a
//   GPU operand elsewhere is a DeviceError that says so;
// - on the CPU, Thrust's OpenMP backend (its serial C++ backend in builds
//   without OpenMP, such as ThreadSanitizer's, which cannot see into libgomp).
// So one call runs on both devices in an nvcc program, and the CPU side is
// tested in every build without a GPU. Each call is one engine op, ordered
// with hybra's own ops on the tensors it reads and writes; a failure inside
// Thrust is that op's failure, delivered at the next wait.
//
// Operands of the result's shape that are contiguous are read in place; one
// that broadcasts or is a view is first copied into the result's shape (one
// copy op), since the kernel tree reads every leaf at the element's index.
// The tensors must share one dtype, as the tree is built for one element type.
// The path records no gradients: it refuses to run while autograd records.
//
// Not part of hybra.hpp: it needs Thrust's headers (CMake: CCCL::Thrust).
#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform.h>
#include <thrust/transform_reduce.h>

#include <cstring>
#include <limits>
#include <string_view>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#include <thrust/system/omp/execution_policy.h>
#else
#include <thrust/system/cpp/execution_policy.h>
#endif
#if defined(__CUDACC__)
#include <thrust/system/cuda/execution_policy.h>
#endif

#include "../ops/layout.hpp"
#include "../ops/reduce.hpp"
#include "evaluate.hpp"

namespace hybra {

namespace detail::thrust_path {

// The tensors an expression reads, each of the result's shape and
// contiguous, and what the call computes over.
struct Operands {
  std::vector<Tensor> tensors;
  Shape shape;
  DType dtype;
  Device device;
};

template <class E>
Operands operands(std::string_view op, const E& e) {
  if (autograd::is_recording())
    fail<ValueError>(op, ": the Thrust path records no gradients; call it outside autograd::record, or evaluate the ",
                     "expression itself");
  const leaf_list leaves = tensor_leaves(e);  // one device, or a DeviceError
  if (leaves.empty()) fail<ValueError>(op, ": the expression has no tensor, so no device or dtype to run on");
  Operands o{{}, infer_shape(e), leaves.front()->dtype(), leaves.front()->device()};
  for (const Tensor* t : leaves) {
    if (t->dtype() != o.dtype)
      fail<DTypeError>(op, ": the expression's tensors have dtypes ", name(o.dtype), " and ", name(t->dtype()),
                       "; the Thrust path fuses one dtype (convert with astype first)");
    o.tensors.push_back(t->shape() == o.shape && t->is_contiguous() ? *t : broadcast_to(*t, o.shape).contiguous());
  }
#if !defined(__CUDACC__)
  if (o.device.kind == DeviceKind::cuda)
    fail<DeviceError>(op, ": the expression's tensors live on ", o.device,
                      ", and Thrust's CUDA backend runs only in code that nvcc compiles; compile this file with nvcc, ",
                      "or evaluate the expression itself (hybra's NVRTC kernels)");
#endif
  return o;
}

template <class T>
std::vector<const T*> pointers(const Operands& o) {
  std::vector<const T*> p;
  for (const Tensor& t : o.tensors) p.push_back(static_cast<const T*>(t.raw_data()));
  return p;
}

#if defined(__CUDACC__)
// Thrust's scratch (a reduction's partial results) from the GPU's caching
// allocator: cudaMalloc and cudaFree would synchronise the device at every
// call. A block given back is reused only by later work on the same stream.
struct GpuScratch {
  using value_type = char;
  backend::cuda::CachingAllocator* memory;
  char* allocate(std::ptrdiff_t bytes) {
    return reinterpret_cast<char*>(memory->allocate(static_cast<std::size_t>(bytes)));
  }
  void deallocate(char* p, std::size_t) noexcept { memory->release(reinterpret_cast<backend::cuda::CUdeviceptr>(p)); }
};
#endif

// Calls run(policy) with the Thrust policy of `device`. Called inside the
// engine op, where a GPU's context is already the thread's; on the CPU,
// Thrust's OpenMP loops take as many threads as hybra's own would
// (set_num_threads, and the logical CPU device's share of the cores).
template <class Run>
void with_policy(Device device, Run&& run) {
#if defined(__CUDACC__)
  if (device.kind == DeviceKind::cuda) {
    backend::cuda::Gpu& g = backend::cuda::gpu(device.id);
    return run(::thrust::cuda::par_nosync(GpuScratch{&g.memory()}).on(reinterpret_cast<cudaStream_t>(g.stream())));
  }
#endif
#if defined(_OPENMP)
  omp_set_num_threads(backend::cpu::available_threads());
  run(::thrust::omp::par);
#else
  run(::thrust::cpp::par);
#endif
}

// Element i of the kernel tree in the output's C++ type.
template <class Kernel, class Out>
struct element_as {
  Kernel k;
  HYBRA_HD Out operator()(std::int64_t i) const { return static_cast<Out>(k(i)); }
};

// Writes one value of C++ type V into the one-element tensor out.
template <class V>
void store(const Tensor& out, V value) {
#if defined(__CUDACC__)
  if (out.device().kind == DeviceKind::cuda)
    return backend::cuda::gpu(out.device().id)
        .copy_from_host(reinterpret_cast<backend::cuda::CUdeviceptr>(out.raw_data()), &value, sizeof value);
#endif
  std::memcpy(out.raw_data(), &value, sizeof value);
}

// The expression's result dtype when its tensors have dtype d.
template <class E>
DType result_dtype(DType d) {
  DType r = d;
  dispatch(d, [&](auto tag) { r = dtype_of_v<kernel::result_t<E, typename decltype(tag)::type>>; });
  return r;
}

// One thrust::transform of e's kernel tree into out: contiguous, of o's
// shape and device and of e's result dtype.
template <class E>
void transform_into(std::string_view op, const Tensor& out, const Operands& o, const E& e) {
  dispatch(o.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using R = kernel::result_t<E, T>;
    const std::int64_t n = checked_numel(o.shape, op);
    const std::vector<const T*> ptrs = pointers<T>(o);
    auto k = kernel::build<T>(e, ptrs.data());
    push_op_on(o.device, op, TensorRefs(o.tensors), {out}, [o, out, k, n] {
      with_policy(o.device, [&](auto policy) {
        ::thrust::transform(policy, ::thrust::counting_iterator<std::int64_t>(0),
                            ::thrust::counting_iterator<std::int64_t>(n), static_cast<R*>(out.raw_data()),
                            element_as<decltype(k), R>{k});
      });
    });
  });
}

// How a reduction loads an element into its accumulator, combines two and
// starts, with ops/reduce.hpp's rules: float sums in double, integer sums
// modulo 2^64 into int64, NaN wins max and min. Only a sum has a value for
// no elements; the extremes start from the far end of their type.
template <class R>
struct sum_rule {
  using acc = std::conditional_t<std::is_floating_point_v<R>, double, std::uint64_t>;
  using out = std::conditional_t<std::is_floating_point_v<R>, R, std::int64_t>;
  static constexpr std::string_view name = "with_thrust::sum";
  static constexpr bool has_identity = true;
  static acc start() { return 0; }
  HYBRA_HD static acc load(R v) { return reduce::load<acc>(v); }
  HYBRA_HD acc operator()(acc a, acc b) const { return a + b; }
};
template <class R, bool Max>
struct extreme_rule {
  using acc = R;
  using out = R;
  static constexpr std::string_view name = Max ? "with_thrust::max" : "with_thrust::min";
  static constexpr bool has_identity = false;
  static acc start() {
    using limits = std::numeric_limits<R>;
    if constexpr (limits::has_infinity)
      return Max ? -limits::infinity() : limits::infinity();
    else
      return Max ? limits::lowest() : limits::max();
  }
  HYBRA_HD static acc load(R v) { return v; }
  HYBRA_HD acc operator()(acc a, acc b) const { return reduce::pick<Max>(a, b); }
};
template <class R>
using max_rule = extreme_rule<R, true>;
template <class R>
using min_rule = extreme_rule<R, false>;

template <class Kernel, class Rule>
struct load_as {
  Kernel k;
  HYBRA_HD typename Rule::acc operator()(std::int64_t i) const { return Rule::load(k(i)); }
};

// One reduction over every element of e, as a 0-d tensor on e's device.
template <template <class> class RuleOf, class E>
Tensor reduce_all(const E& e) {
  const std::string_view op = RuleOf<float>::name;
  Operands o = operands(op, e);
  Tensor out;
  dispatch(o.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Rule = RuleOf<kernel::result_t<E, T>>;
    const std::int64_t n = checked_numel(o.shape, op);
    if (n == 0 && !Rule::has_identity)
      fail<ValueError>(op, ": the expression has shape ", to_string(o.shape), ", no elements, and ", op,
                       " has no identity");
    out = Tensor(Shape{}, dtype_of_v<typename Rule::out>, o.device);
    const std::vector<const T*> ptrs = pointers<T>(o);
    auto k = kernel::build<T>(e, ptrs.data());
    push_op_on(o.device, op, TensorRefs(o.tensors), {out}, [o, out, k, n] {
      with_policy(o.device, [&](auto policy) {
        const typename Rule::acc total = ::thrust::transform_reduce(
            policy, ::thrust::counting_iterator<std::int64_t>(0), ::thrust::counting_iterator<std::int64_t>(n),
            load_as<decltype(k), Rule>{k}, Rule::start(), Rule{});
        store(out, static_cast<typename Rule::out>(total));
      });
    });
  });
  return out;
}

}  // namespace detail::thrust_path

namespace with_thrust {

// Writes the expression's value into `out`, a tensor of the expression's
// shape on its tensors' device, by one thrust::transform over the kernel
// tree. An out of another dtype, or a view, gets the values through a
// contiguous tensor of the expression's dtype, converted and copied as
// Tensor::assign does.
template <class E>
Tensor& assign(Tensor& out, const E& e) {
  using namespace detail::thrust_path;
  constexpr std::string_view op = "with_thrust::assign";
  out.require("with_thrust::assign");
  Operands o = operands(op, e);
  // A leaf that reads out's memory other than element for element (a
  // shifted or transposed view of it) would see elements this pass has
  // already written: it is read from a copy, so that the expression's
  // operands are its values before the call, as with Tensor::assign.
  for (Tensor& t : o.tensors)
    if (t.storage() == out.storage() && (t.offset() != out.offset() || t.strides() != out.strides())) t = t.copy();
  if (out.shape() != o.shape)
    fail<ShapeError>(op, ": the expression has shape ", to_string(o.shape), " but the output ", to_string(out.shape()));
  if (out.device() != o.device)
    fail<DeviceError>(op, ": the expression's tensors live on ", o.device, " but the output on ", out.device());
  const DType dtype = result_dtype<E>(o.dtype);
  if (out.dtype() == dtype && out.is_contiguous()) {
    transform_into(op, out, o, e);
  } else {
    Tensor whole(o.shape, dtype, o.device);
    transform_into(op, whole, o, e);
    out.assign(whole);
  }
  return out;
}

// The expression's value as a new contiguous tensor on its tensors' device.
template <class E>
Tensor evaluate(const E& e) {
  using namespace detail::thrust_path;
  constexpr std::string_view op = "with_thrust::evaluate";
  const Operands o = operands(op, e);
  Tensor out(o.shape, result_dtype<E>(o.dtype), o.device);
  transform_into(op, out, o, e);
  return out;
}

// The sum of every element of the expression, fused into one
// thrust::transform_reduce: floats sum in double and keep their dtype,
// integers sum modulo 2^64 into int64, as hybra's sum does. An empty sum is 0.
template <class E>
Tensor sum(const E& e) {
  return detail::thrust_path::reduce_all<detail::thrust_path::sum_rule>(e);
}

// The largest (smallest) element of the expression, NaN winning, as hybra's
// max (min); an expression with no elements is a ValueError.
template <class E>
Tensor max(const E& e) {
  return detail::thrust_path::reduce_all<detail::thrust_path::max_rule>(e);
}
template <class E>
Tensor min(const E& e) {
  return detail::thrust_path::reduce_all<detail::thrust_path::min_rule>(e);
}

}  // namespace with_thrust

}  // namespace hybra
