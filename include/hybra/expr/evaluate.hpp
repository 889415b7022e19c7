#pragma once
// Fused evaluation: an expression whose tensors share one dtype runs as ONE
// loop over the output (no temporaries); contiguous same-shape operands take a
// flat vectorised loop, anything else (broadcasting, views) a strided loop
// over collapsed dimensions. Mixed-dtype trees run node by node, each node
// fused, with narrower operands converted first (docs/tensors.md). Each
// evaluation is one engine op (engine/push.hpp).
#include <boost/container/small_vector.hpp>
#include <cstring>
#include <optional>
#include <ostream>

#include "../ops/tape.hpp"
#include "../backend/cpu/isa.hpp"
#include "../backend/cpu/threads.hpp"
#include "../core/format.hpp"
#include "../engine/push.hpp"
#include "kernel.hpp"
#include "print.hpp"

namespace hybra {

namespace detail {

template <class V>
inline constexpr bool is_tensor_v = std::is_same_v<std::remove_cvref_t<V>, Tensor>;

using leaf_list = boost::container::small_vector<const Tensor*, 8>;

template <class E>
leaf_list tensor_leaves(const E& e) {
  leaf_list leaves;
  auto leaf = [&](const auto& v) {
    if constexpr (is_tensor_v<decltype(v)>) leaves.push_back(&v.require("expression"));
    return 0;
  };
  auto node = [](auto, auto...) { return 0; };
  fold(e, leaf, node);
  for (auto* t : leaves) require_same_device("expression", *leaves.front(), *t);
  return leaves;
}

// The broadcast shape of an expression; a mismatch names the op and shapes.
// The shapes wait on a stack, each node replacing its children's with its
// own, rather than being folded as values: moving a small_vector through
// Hana's tuples trips GCC 12's -Wstringop-overread at -O1 and above, a false
// report in every user's build.
template <class E>
Shape infer_shape(const E& e) {
  boost::container::small_vector<Shape, 4> stack;
  auto leaf = [&](const auto& v) {
    if constexpr (is_tensor_v<decltype(v)>) stack.push_back(v.shape());
    else stack.emplace_back();
    return 0;
  };
  auto node = [&](auto op, auto... children) {
    const std::size_t first = stack.size() - sizeof...(children);
    for (std::size_t k = first + 1; k < stack.size(); ++k)
      stack[first] = broadcast_shapes(stack[first], stack[k], decltype(op)::name);
    stack.resize(first + 1);
    return 0;
  };
  fold(e, leaf, node);
  return stack.front();
}

// Strides of `t` seen through broadcasting to `shape` (0 on broadcast axes),
// written into `s` (zeros, of shape's rank), or returned.
inline void broadcast_strides(const Tensor& t, const Shape& shape, Strides& s) {
  auto lead = shape.size() - t.shape().size();
  for (std::size_t i = 0; i < t.shape().size(); ++i) s[lead + i] = t.shape()[i] == 1 ? 0 : t.strides()[i];
}
inline Strides broadcast_strides(const Tensor& t, const Shape& shape) {
  Strides s(shape.size(), 0);
  broadcast_strides(t, shape, s);
  return s;
}

// How a strided evaluation walks its operands: strides per operand (the
// output last) over the output's dims, neighbouring dims merged wherever every
// operand is contiguous across them, cut into work items that are pieces of
// rows (so one long broadcast row still splits across threads). It does not
// depend on dtypes or the expression, so it is compiled once, not per kernel.
struct strided_plan {
  Shape dims;
  boost::container::small_vector<Strides, 9> strides;
  boost::container::small_vector<std::int64_t, 9> inner_stride;
  std::int64_t inner = 1, piece = 1, pieces_per_row = 1, items = 0;

  strided_plan(const leaf_list& leaves, const Tensor& out) : strides(leaves.size() + 1) {
    const auto& shape = out.shape();
    const std::size_t nl = leaves.size();
    boost::container::small_vector<Strides, 9> full;
    // Built in place: moving a Strides in trips GCC 12's -Wstringop-overread.
    for (auto* t : leaves) broadcast_strides(*t, shape, full.emplace_back(shape.size(), 0));
    full.push_back(out.strides());
    for (std::size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] == 1) continue;
      bool merge = !dims.empty();
      for (std::size_t l = 0; merge && l <= nl; ++l) merge = strides[l].back() == full[l][d] * shape[d];
      if (merge) dims.back() *= shape[d];
      else dims.push_back(shape[d]);
      for (std::size_t l = 0; l <= nl; ++l) {
        if (merge) strides[l].back() = full[l][d];
        else strides[l].push_back(full[l][d]);
      }
    }
    if (dims.empty()) {
      dims.push_back(1);
      for (auto& s : strides) s.push_back(0);
    }
    for (auto& s : strides) inner_stride.push_back(s.back());
    inner = dims.back();
    const std::int64_t rows = out.size() / inner;
    piece = rows >= num_threads() ? inner : std::max<std::int64_t>(1024, inner / num_threads());
    pieces_per_row = (inner + piece - 1) / piece;
    items = rows * pieces_per_row;
  }

  // Writes each operand's element offset for work item `item` into off[]
  // (the output's last) and returns the item's length.
  std::int64_t locate(std::int64_t item, std::int64_t* off) const {
    const std::int64_t from = (item % pieces_per_row) * piece;
    locate_row(item / pieces_per_row, from, off);
    return std::min(inner, from + piece) - from;
  }

  // Writes each operand's element offset for element `from` of row `row`
  // (a row: `inner` elements) into off[].
  void locate_row(std::int64_t row, std::int64_t from, std::int64_t* off) const {
    const std::size_t operands = strides.size();
    for (std::size_t l = 0; l < operands; ++l) off[l] = from * inner_stride[l];
    for (std::int64_t r = row, d = static_cast<std::int64_t>(dims.size()) - 2; d >= 0; --d) {
      for (std::size_t l = 0; l < operands; ++l) off[l] += (r % dims[d]) * strides[l][d];
      r /= dims[d];
    }
  }
};

// One thread's walk through strided work items (strided_plan), in chunks of
// at most `chunk` elements that the flat kernel runs over: a leaf whose inner
// stride is 1 is read in place, any other (a broadcast axis, a transposed
// view) is gathered into a buffer of the walk's first, and the result is
// written in place or scattered from a buffer. It depends on the dtypes
// only, so a strided expression adds no kernel of its own to compile (each
// distinct expression costs seconds of compile time per dtype it is
// instantiated for).
template <class T, class O>
class strided_chunks {
 public:
  static constexpr std::int64_t chunk = 512;

  strided_chunks(const strided_plan& plan, std::span<const T* const> bases, O* dst)
      : plan_(plan), bases_(bases), dst_(dst), leaves_(bases.size()), offsets_(bases.size() + 1) {
    std::size_t gathered = 0;
    for (std::size_t l = 0; l < bases.size(); ++l) gathered += plan.inner_stride[l] != 1;
    gather_.resize(gathered * chunk);
    if (plan.inner_stride[bases.size()] != 1) scatter_.resize(chunk);
  }

  // Starts work item `item`; next() then yields its chunks.
  void start(std::int64_t item) {
    length_ = plan_.locate(item, offsets_.data());
    at_ = 0;
    size_ = 0;
  }

  // Moves to the next chunk of the item, gathering the leaves that need it;
  // false when the item is done.
  bool next() {
    at_ += size_;
    size_ = std::min(chunk, length_ - at_);
    if (size_ <= 0) return false;
    T* buffer = gather_.data();
    for (std::size_t l = 0; l < leaves_.size(); ++l) {
      const std::int64_t stride = plan_.inner_stride[l];
      const T* from = bases_[l] + offsets_[l] + at_ * stride;
      if (stride == 1) {
        leaves_[l] = from;
        continue;
      }
      for (std::int64_t i = 0; i < size_; ++i) buffer[i] = from[i * stride];
      leaves_[l] = buffer;
      buffer += chunk;
    }
    return true;
  }

  const T* const* leaves() const { return leaves_.data(); }
  std::int64_t size() const { return size_; }
  // Where the kernel writes the chunk's results.
  O* out() { return scatter_.empty() ? dst_ + offsets_.back() + at_ : scatter_.data(); }

  // Puts a chunk written to out() into place.
  void store() {
    if (scatter_.empty()) return;
    const std::int64_t stride = plan_.inner_stride.back();
    O* to = dst_ + offsets_.back() + at_ * stride;
    for (std::int64_t i = 0; i < size_; ++i) to[i * stride] = scatter_[i];
  }

 private:
  const strided_plan& plan_;
  std::span<const T* const> bases_;
  O* dst_;
  boost::container::small_vector<const T*, 8> leaves_;
  boost::container::small_vector<std::int64_t, 9> offsets_;
  std::vector<T> gather_;
  std::vector<O> scatter_;
  std::int64_t length_ = 0, at_ = 0, size_ = 0;
};

// Writes k(i) for i in [begin, end) to out[i]: the one loop every fused
// kernel runs, contiguous on both sides, out of line (HYBRA_ROUND_EVERY_OP).
//
// A kernel with a costly op is bound by its arithmetic. It takes the target's
// widest vectors (a cheap kernel keeps the compiler's choice: bound by memory,
// it measured slower with them on a Skylake-class CPU). With so many
// instructions per element too few loads are in flight for the hardware
// prefetcher to hide memory latency on arrays beyond the caches (such a loop
// ran 3-6% behind Eigen's inline math on 2^24 floats, docs/benchmarks.md,
// "vector math"), so the loop requests its operands 2 KiB ahead, a chunk at a
// time. Every chunk has the same length, so that GCC sets the vector loop's
// constants up once, not once per chunk (a chunk of a long chain is a few
// iterations of a loop with dozens of constants). The length is whole cache
// lines, a multiple of every vector width, so each element takes the same code
// path (vector body or scalar tail) and gets the same value as in one
// unchunked loop.
template <class T, class O, class K>
HYBRA_ROUND_EVERY_OP void run_kernel(const K& kernel, O* out, std::int64_t begin, std::int64_t end) {
  const K k = kernel;  // a local copy: GCC keeps its pointers in registers, not reloading them through `kernel`
  if constexpr (K::costly) {
    constexpr std::int64_t line = 64 / sizeof(T), chunk = 4 * line, ahead = 2048 / sizeof(T);
    std::int64_t c = begin;
    for (; c + chunk <= end; c += chunk) {
      for (std::int64_t i = c + ahead; i < std::min(end, c + ahead + chunk); i += line) k.prefetch(i);
#pragma omp simd simdlen(backend::cpu::simd_lanes<T, O>)
      for (std::int64_t i = c; i < c + chunk; ++i) out[i] = static_cast<O>(k(i));
    }
#pragma omp simd simdlen(backend::cpu::simd_lanes<T, O>)
    for (std::int64_t i = c; i < end; ++i) out[i] = static_cast<O>(k(i));
  } else {
#pragma omp simd
    for (std::int64_t i = begin; i < end; ++i) out[i] = static_cast<O>(k(i));
  }
}

// Runs e's kernel (tensor dtype T) into `out` (C++ type O, out.shape() is the
// broadcast shape of every leaf). Any layout on either side.
template <class T, class O, class E>
void run_fused(const E& e, const leaf_list& leaves, const Tensor& out) {
  const auto n = out.size();
  if (n == 0) return;
  const auto& shape = out.shape();
  boost::container::small_vector<const T*, 8> ptrs;
  bool flat = out.is_contiguous();
  for (auto* t : leaves) {
    ptrs.push_back(static_cast<const T*>(t->raw_data()));
    flat = flat && t->shape() == shape && t->is_contiguous();
  }
  O* dst = static_cast<O*>(out.raw_data());
  if (flat) {
    auto k = kernel::build<T>(e, ptrs.data());
    backend::cpu::parallel_for(n, 1, [&](std::int64_t begin, std::int64_t end) { run_kernel<T>(k, dst, begin, end); });
    return;
  }

  const strided_plan plan(leaves, out);
  backend::cpu::parallel_for(plan.items, std::min(plan.piece, plan.inner), [&](std::int64_t first, std::int64_t last) {
    strided_chunks<T, O> walk(plan, ptrs, dst);
    for (std::int64_t item = first; item < last; ++item)
      for (walk.start(item); walk.next(); walk.store())
        run_kernel<T>(kernel::build<T>(e, walk.leaves()), walk.out(), 0, walk.size());
  });
}

template <class E>
Tensor evaluate_unfused(const E& e);
template <class E>
Tensor evaluate_recorded(const E& e);
// One elementwise op of the table chosen at run time (expr/elementwise_op.hpp).
inline Tensor run_elementwise(int index, op::DTypeRule rule, std::string_view name, std::span<const Tensor> in);
// On a GPU an expression is one kernel NVRTC compiles from its type (expr/cuda_eager.hpp).
template <class E>
void push_fused_cuda(const E& e, const leaf_list& leaves, const Tensor& out);

inline void copy_into(const Tensor& src, const Tensor& dst);

// Queues converting src into dst, both contiguous on one GPU (defined by expr/cuda_eager.hpp).
inline void push_convert_cuda(const Tensor& src, const Tensor& dst);

// Queues copying src into dst, both on one GPU in one dtype, any layouts (defined by backend/cuda/layout.hpp).
inline void push_copy_cuda(const Tensor& src, const Tensor& dst);

// Queues a copy to, from or between GPUs: bytes moved on the GPU's stream
// (from the host through pinned staging). The host's side is made contiguous
// and converted on the host; on a GPU a view is read or written, and a dtype
// converted, by a kernel.
inline void copy_with_gpu(const Tensor& src, const Tensor& dst) {
  const Device gpu = dst.device().kind == DeviceKind::cuda ? dst.device() : src.device();
  if (src.device().kind != DeviceKind::cuda && (!src.is_contiguous() || src.dtype() != dst.dtype())) {
    Tensor staged(src.shape(), dst.dtype(), src.device());
    copy_into(src, staged);
    return copy_with_gpu(staged, dst);
  }
  if (dst.device().kind != DeviceKind::cuda && (!dst.is_contiguous() || src.dtype() != dst.dtype())) {
    Tensor staged(dst.shape(), src.dtype(), dst.device());
    copy_with_gpu(src, staged);
    return copy_into(staged, dst);
  }
  if (src.device() == dst.device() && src.dtype() == dst.dtype() && (!src.is_contiguous() || !dst.is_contiguous()))
    return push_copy_cuda(src, dst);
  if (!src.is_contiguous()) {
    Tensor gathered(src.shape(), src.dtype(), src.device());
    push_copy_cuda(src, gathered);
    return copy_with_gpu(gathered, dst);
  }
  if (!dst.is_contiguous()) {
    Tensor staged(dst.shape(), dst.dtype(), dst.device());
    copy_with_gpu(src, staged);
    return push_copy_cuda(staged, dst);
  }
  if (src.dtype() != dst.dtype()) {
    // Both sides are on GPUs: src is converted on its GPU by a kernel.
    if (src.device() == dst.device()) return push_convert_cuda(src, dst);
    Tensor converted(src.shape(), dst.dtype(), src.device());
    push_convert_cuda(src, converted);
    return copy_with_gpu(converted, dst);
  }
  push_op_on(gpu, "copy", {src}, {dst}, [src, dst] {
    using backend::cuda::CUdeviceptr;
    const std::size_t bytes = static_cast<std::size_t>(src.size()) * size_of(src.dtype());
    auto address = [](const Tensor& t) { return reinterpret_cast<CUdeviceptr>(t.raw_data()); };
    if (src.device().kind != DeviceKind::cuda)
      backend::cuda::gpu(dst.device().id).copy_from_host(address(dst), src.raw_data(), bytes);
    else if (dst.device().kind != DeviceKind::cuda)
      backend::cuda::gpu(src.device().id).copy_to_host(dst.raw_data(), address(src), bytes);
    else
      backend::cuda::gpu(dst.device().id).copy_from(address(dst), backend::cuda::gpu(src.device().id), address(src), bytes);
  });
}

// Writes src (broadcast to dst's shape) into dst, each element converted by
// static_cast, in one walk through both layouts: how the 16-bit floats, which
// no fused kernel reads or writes, are copied and converted on the CPU.
inline void convert_elements(const Tensor& src, const Tensor& dst) {
  const Strides from = broadcast_strides(src, dst.shape());
  dispatch_stored(src.dtype(), [&](auto s) {
    dispatch_stored(dst.dtype(), [&](auto d) {
      using S = typename decltype(s)::type;
      using D = typename decltype(d)::type;
      const S* in = static_cast<const S*>(src.raw_data());
      D* out = static_cast<D*>(dst.raw_data());
      for_each_offsets(dst.shape(), [&](std::int64_t i, std::int64_t o) { out[o] = static_cast<D>(in[i]); }, from,
                       dst.strides());
    });
  });
}

// Queues writing src into dst (same shape, any layouts, any devices),
// converting the dtype.
inline void copy_into(const Tensor& src, const Tensor& dst) {
  if (src.device().kind == DeviceKind::cuda || dst.device().kind == DeviceKind::cuda) return copy_with_gpu(src, dst);
  if (is_half(src.dtype()) || is_half(dst.dtype()))
    return push_kernel("copy", {src}, {dst}, [src, dst] { convert_elements(src, dst); });
  push_kernel("copy", {src}, {dst}, [src, dst] {
    auto e = yap::make_terminal<expression>(src);
    leaf_list leaves{&src};
    dispatch(src.dtype(), [&](auto s) {
      dispatch(dst.dtype(), [&](auto d) {
        run_fused<typename decltype(s)::type, typename decltype(d)::type>(e, leaves, dst);
      });
    });
  });
}

// A copy of e that holds its tensors (sharing their storage) and scalars by
// value: the tree an engine op runs after the caller's tensors, scalars and
// sub-expressions may be gone.
template <class E>
auto owning_copy(const E& e) {
  auto leaf = [](const auto& v) { return v; };
  auto node = [](auto op, auto&&... children) {
    return apply_op<decltype(op)>(std::move(children)...);
  };
  return fold(e, leaf, node);
}

// Queues running e's kernel into out (see run_fused); the op is named by
// e's type, e.g. `relu((Tensor * Tensor) + int)`.
template <class T, class O, class E>
void push_fused(const E& e, const leaf_list& leaves, const Tensor& out) {
  if (out.device().kind == DeviceKind::cuda) return push_fused_cuda(e, leaves, out);
  static const std::string name = type_string(e);
  push_kernel(name, leaves, {out}, [owned = owning_copy(e), out] { run_fused<T, O>(owned, tensor_leaves(owned), out); });
}

// Calls fused(type_tag<T>{}) for float32 and float64, the dtypes a fused
// kernel is instantiated for, and returns otherwise() for any other. Each
// dtype costs every distinct expression about half a second of compile time
// (docs/benchmarks.md), and models compute in floats: an expression over
// integer tensors runs node by node, as mixed dtypes do.
template <class Fused, class Otherwise>
decltype(auto) dispatch_fused(DType d, Fused&& fused, Otherwise&& otherwise) {
  if (d == DType::float32) return fused(type_tag<float>{});
  if (d == DType::float64) return fused(type_tag<double>{});
  return otherwise();
}

template <class E>
constexpr bool is_terminal() {
  using X = std::remove_cvref_t<E>;
  if constexpr (is_tensor_v<X>) return true;
  else if constexpr (X::kind == yap::expr_kind::expr_ref) return is_terminal<decltype(yap::deref(std::declval<X>()))>();
  else return X::kind == yap::expr_kind::terminal;
}

}  // namespace detail

// Evaluates an expression into a new contiguous tensor, fused. For a Tensor,
// returns it unchanged (no copy).
template <class E>
Tensor eval(const E& e) {
  static_assert(!contains_symbol_v<E>,
                "hybra: an expression over symbols has no values to evaluate; assign it to a Symbol (it becomes "
                "graph nodes), or call the block with tensors");
  if constexpr (detail::is_tensor_v<E>) {
    return e;
  } else if constexpr (detail::is_terminal<E>()) {
    return detail::tensor_leaves(e).front()->copy();
  } else {
    auto leaves = detail::tensor_leaves(e);
    Shape shape = detail::infer_shape(e);
    if (autograd::is_recording())
      for (auto* t : leaves)
        if (autograd::requires_grad(*t)) return detail::evaluate_recorded(e);
    // Mixed dtypes go node by node, as do the 16-bit floats (computed in
    // float32) and the integers (detail::dispatch_fused).
    for (auto* t : leaves)
      if (t->dtype() != leaves.front()->dtype()) return detail::evaluate_unfused(e);
    return detail::dispatch_fused(
        leaves.front()->dtype(),
        [&](auto tag) {
          using T = typename decltype(tag)::type;
          using R = kernel::result_t<E, T>;
          Tensor out(shape, dtype_of_v<R>, leaves.front()->device());
          detail::push_fused<T, R>(e, leaves, out);
          return out;
        },
        [&] { return detail::evaluate_unfused(e); });
  }
}

// Evaluates node by node, each node into a temporary of its own: the
// reference fused results are tested against, and the path for mixed dtypes.
template <class E>
Tensor eval_unfused(const E& e) {
  return detail::evaluate_unfused(e);
}

namespace detail {

// One node of an expression on its operands' values (tensors and C++
// scalars), as run_elementwise: the node's dtype is the fused rule's
// (op::result: scalars are weak), scalars become 0-d tensors of it, and the
// op compiles once, not once per node type.
template <class Op, class... Args>
Tensor run_node(const Args&... args) {
  constexpr auto is_condition = [](std::size_t i) { return Op::rule == op::DTypeRule::select && i == 0; };
  std::optional<Device> device;
  std::optional<DType> common;
  bool weak = true;
  auto note = [&](std::size_t i, const auto& a) {
    if constexpr (is_tensor_v<decltype(a)>) {
      if (!device) device = a.device();
      if (!is_condition(i)) {
        common = common ? promote_types(*common, weak, a.dtype(), false) : a.dtype();
        weak = false;
      }
    } else if (!is_condition(i)) {
      const DType d = dtype_of_v<kernel::scalar_type_t<std::remove_cvref_t<decltype(a)>>>;
      common = common ? promote_types(*common, weak, d, true) : d;
    }
  };
  // A condition keeps its own dtype: run_elementwise makes it 1/0 first.
  auto operand = [&](std::size_t i, const auto& a) -> Tensor {
    if constexpr (is_tensor_v<decltype(a)>) {
      return a;
    } else {
      using S = kernel::scalar_type_t<std::remove_cvref_t<decltype(a)>>;
      return dispatch_stored(is_condition(i) ? dtype_of_v<S> : *common, [&](auto tag) {
        using T = typename decltype(tag)::type;
        return array<T>(std::vector<T>{static_cast<T>(static_cast<S>(a))}, Shape{}, *device);
      });
    }
  };
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    (note(I, args), ...);
    const std::vector<Tensor> operands{operand(I, args)...};
    return run_elementwise(op::elementwise_index<Op>(), Op::rule, Op::name, operands);
  }(std::index_sequence_for<Args...>{});
}

template <class E>
Tensor evaluate_unfused(const E& e) {
  auto leaf = [](const auto& v) { return v; };
  auto node = [](auto op, const auto&... args) -> Tensor { return run_node<decltype(op)>(args...); };
  Tensor result = fold(e, leaf, node);
  if constexpr (is_terminal<E>()) return result.copy();
  else return result;
}

// While recording: node by node, each node one recorded op (the gradient
// needs every intermediate value). C++ scalars are recorded as 0-d tensors
// of their own dtype, marked weak.
template <class E>
Tensor evaluate_recorded(const E& e) {
  auto leaf = [](const auto& v) { return v; };
  auto node = [](auto op, const auto&... args) -> Tensor {
    using Op = decltype(op);
    std::vector<Tensor> inputs;
    std::vector<bool> weak;
    bool needed = false;
    std::optional<Device> device;  // of the first tensor operand: where the scalars go
    auto locate = [&](const auto& a) {
      if constexpr (is_tensor_v<decltype(a)>)
        if (!device) device = a.device();
    };
    (locate(args), ...);
    auto note = [&](const auto& a) {
      if constexpr (is_tensor_v<decltype(a)>) {
        inputs.push_back(a);
        weak.push_back(false);
        needed = needed || autograd::requires_grad(a);
      } else {
        using S = kernel::scalar_type_t<std::remove_cvref_t<decltype(a)>>;
        inputs.push_back(array<S>(std::vector<S>{static_cast<S>(a)}, Shape{}, *device));
        weak.push_back(true);
      }
    };
    (note(args), ...);
    Tensor out;
    {
      autograd::pause inside(autograd::is_training());
      out = run_node<Op>(args...);
    }
    if (needed) autograd::record_node(std::string(Op::name), {}, std::move(inputs), std::move(weak), std::span<Tensor>(&out, 1));
    return out;
  };
  return fold(e, leaf, node);
}

}  // namespace detail

template <tensor_expression E>
Tensor::Tensor(E&& e) : Tensor(eval(e)) {}

template <tensor_expression E>
Tensor& Tensor::operator=(E&& e) {
  return *this = eval(e);
}

template <class E>
Tensor& Tensor::assign(E&& e) {
  require("assign");
  Shape shape = detail::infer_shape(e);
  if (broadcast_shapes(shape, shape_, "assign") != shape_)
    fail<ShapeError>("assign: a value of shape ", to_string(shape), " cannot be written into shape ", to_string(shape_));
  if constexpr (detail::is_tensor_v<E>) {
    // Another view of this storage (a transpose of itself) would be read
    // while it is overwritten: copy it out first.
    const bool other_view = e.storage() == storage_ && (e.shape() != shape_ || e.strides() != strides_ ||
                                                        e.offset() != offset_);
    detail::copy_into(other_view ? e.copy() : Tensor(e), *this);
  } else {
    auto leaves = detail::tensor_leaves(e);
    if (leaves.front()->device() != device())
      fail<DeviceError>("assign: the value is computed on ", leaves.front()->device(), " but the destination lives on ",
                        device(), "; evaluate it there and copy_to the destination");
    bool direct = true;
    for (auto* t : leaves) {
      direct = direct && t->dtype() == leaves.front()->dtype();
      // Reading a different view of the storage being written would read
      // values already overwritten; such expressions go through a temporary.
      if (t->storage() == storage_)
        direct = direct && t->shape() == shape_ && t->strides() == strides_ && t->offset() == offset_;
    }
    if (direct) {
      direct = detail::dispatch_fused(
          leaves.front()->dtype(),
          [&](auto tag) {
            using T = typename decltype(tag)::type;
            using R = kernel::result_t<E, T>;
            if (dtype_of_v<R> != dtype_) return false;
            detail::push_fused<T, R>(e, leaves, *this);
            return true;
          },
          [] { return false; });
    }
    if (!direct) detail::copy_into(eval(e), *this);
  }
  return *this;
}

inline Tensor Tensor::copy() const {
  autograd::op_record rec("copy", {require("copy")});
  Tensor out(shape_, dtype_, device());
  detail::copy_into(*this, out);
  return rec.output_with_rule(out, [](std::span<const Tensor> dy) { return std::vector<Tensor>{dy[0]}; });
}

inline Tensor Tensor::contiguous() const { return is_contiguous() ? *this : copy(); }

inline Tensor Tensor::to(Device d) const {
  if (require("to").device() == d) return *this;
  autograd::op_record rec("to", {*this});
  Tensor out(shape_, dtype_, d);
  detail::copy_into(*this, out);
  return rec.output_with_rule(out, [from = device()](std::span<const Tensor> dy) { return std::vector<Tensor>{dy[0].to(from)}; });
}

inline void Tensor::copy_to(const Tensor& dst) const {
  require("copy_to");
  dst.require("copy_to");
  if (dst.shape() != shape_)
    fail<ShapeError>("copy_to: source of shape ", to_string(shape_), " does not match destination of shape ",
                     to_string(dst.shape()));
  detail::copy_into(*this, dst);
}

inline Tensor Tensor::astype(DType d) const {
  autograd::op_record rec("astype", {require("astype")});
  Tensor out(shape_, d, device());
  detail::copy_into(*this, out);
  return rec.output(out, [d] { return op::Attrs{{"dtype", std::string(hybra::name(d))}}; });
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  static_assert(std::is_arithmetic_v<T>, "hybra::Tensor::to_vector<T>: T must be an arithmetic type");
  if (require("to_vector").device().kind == DeviceKind::cuda) return to(cpu()).to_vector<T>();
  Tensor c = contiguous();
  c.wait_to_read();
  std::vector<T> v(static_cast<std::size_t>(c.size()));
  dispatch_stored(dtype_, [&](auto tag) {
    using S = typename decltype(tag)::type;
    const S* p = static_cast<const S*>(c.raw_data());
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<T>(p[i]);
  });
  return v;
}

// Prints an expression's value.
template <tensor_expression E>
std::ostream& operator<<(std::ostream& os, const E& e) {
  return os << eval(e);
}

}  // namespace hybra
