#pragma once
// Tensor: a handle to a (possibly strided) view of a Storage, like MXNet's
// NDArray. Copying a Tensor shares the data; copy() makes a deep copy.
//
// A Tensor is a future: the op that computes it is queued on the engine and
// the call returns at once. Reading values (to_vector, item, data, printing)
// or wait_to_read() waits for that op, and rethrows its failure if it failed.
#include <boost/hana/fwd/tuple.hpp>
#include <boost/yap/algorithm_fwd.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../engine/context.hpp"
#include "../engine/engine.hpp"
#include "device.hpp"
#include "dtype.hpp"
#include "shape.hpp"
#include "storage.hpp"

namespace hybra {

template <class E>
concept yap_expression = boost::yap::is_expr<std::remove_cvref_t<E>>::value;

class Symbol;  // graph/symbol.hpp
namespace autograd {
struct Entry;  // ops/tape.hpp
}

// Whether an expression has a Symbol leaf: such an expression describes a
// graph, not values, and never becomes a Tensor.
namespace detail {
template <class T>
struct contains_symbol : std::is_same<T, Symbol> {};
template <template <boost::yap::expr_kind, class> class Expr, boost::yap::expr_kind Kind, class... Ts>
struct contains_symbol<Expr<Kind, boost::hana::tuple<Ts...>>>
    : std::disjunction<contains_symbol<std::remove_cvref_t<Ts>>...> {};
}  // namespace detail
template <class T>
inline constexpr bool contains_symbol_v = detail::contains_symbol<std::remove_cvref_t<T>>::value;
template <class E>
concept tensor_expression = yap_expression<E> && !contains_symbol_v<E>;

class Tensor {
 public:
  Tensor() = default;

  // An uninitialised tensor of the given shape. Explicit: a Shape printed or
  // passed where a Tensor goes would otherwise become one, of garbage values.
  explicit Tensor(const Shape& shape, DType dtype = DType::float32, Device device = cpu()) : shape_(shape), dtype_(dtype) {
    auto n = static_cast<std::size_t>(checked_numel(shape, "Tensor"));
    strides_ = contiguous_strides(shape);
    if (n > std::numeric_limits<std::size_t>::max() / size_of(dtype))
      fail<OutOfMemory>("Tensor: shape ", to_string(shape), " of ", name(dtype), " exceeds the address space");
    try {
      storage_ = std::make_shared<Storage>(n * size_of(dtype), device);
    } catch (const OutOfMemory& e) {
      fail<OutOfMemory>(e.what(), " for a tensor of shape ", to_string(shape), " and dtype ", name(dtype));
    }
  }

  // Evaluates a whole expression in one fused pass (expr/evaluate.hpp).
  template <tensor_expression E>
  Tensor(E&& e);  // NOLINT(google-explicit-constructor): `Tensor c = a * b + 2;`
  template <tensor_expression E>
  Tensor& operator=(E&& e);
  // Writes an expression's values into this tensor's existing storage
  // (broadcast to this shape, converted to this dtype). An expression must
  // be on this tensor's device; a plain Tensor may be on any (it is copied).
  template <class E>
  Tensor& assign(E&& e);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Strides& strides() const { return strides_; }
  std::int64_t offset() const { return offset_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  std::int64_t size() const { return checked_numel(shape_); }
  DType dtype() const { return dtype_; }
  Device device() const { return require("device").storage_->device(); }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  bool is_contiguous() const { return strides_ == contiguous_strides(shape_) || size() <= 1; }

  // Address of element 0 (the view's origin), for any layout. It does not
  // wait: it is for the code of engine ops, whose inputs are ready when they
  // run (or after an explicit wait_to_read/wait_to_write).
  void* raw_data() const {
    auto& s = require("raw_data");
    return static_cast<char*>(s.storage_->data()) + offset_ * static_cast<std::int64_t>(size_of(dtype_));
  }

  // Typed pointer to contiguous data; T must be this tensor's dtype. Waits
  // until no pending op reads or writes the storage, since the caller may
  // write through the pointer, at any later time: the storage keeps no
  // derived forms from then on (Storage::untrack).
  template <class T>
  T* data() const {
    static_assert(is_dtype_v<T>, "hybra::Tensor::data<T>: T must be float, double, std::int32_t, std::int64_t or std::uint8_t");
    if (dtype_of_v<T> != dtype_)
      fail<DTypeError>("data<", name(dtype_of_v<T>), ">: tensor has dtype ", name(dtype_));
    if (!is_contiguous())
      fail<ValueError>("data: tensor of shape ", to_string(shape_), " is a non-contiguous view; call contiguous() first");
    wait_to_write();
    storage_->untrack();
    return static_cast<T*>(raw_data());
  }

  // Values in row-major order, converted to T.
  template <class T>
  std::vector<T> to_vector() const;
  template <class T>
  T item() const {
    if (size() != 1) fail<ShapeError>("item: tensor of shape ", to_string(shape_), " has ", size(), " elements, not 1");
    return to_vector<T>()[0];
  }

  // Block until the pending ops writing this tensor's storage (and, for
  // wait_to_write, also reading it) are done, then rethrow the failure of the
  // op that last wrote it, if that op failed. Inside an engine op they return
  // at once: the op's inputs were ready before it started.
  void wait_to_read() const {
    if (!engine::inside_op()) engine::get().wait_to_read(require("wait_to_read").storage_->var());
  }
  void wait_to_write() const {
    if (!engine::inside_op()) engine::get().wait_to_write(require("wait_to_write").storage_->var());
  }

  Tensor copy() const;         // a contiguous deep copy
  Tensor contiguous() const;   // this, or a contiguous copy of a view
  Tensor astype(DType d) const;
  // This tensor on `device`: itself when it is already there, else a copy
  // queued on `device` (it overlaps with work queued on other devices).
  Tensor to(Device device) const;
  // Queues a copy of this tensor's values into dst, which must have the same
  // shape (its dtype may differ: values are converted) and may live on any device.
  void copy_to(const Tensor& dst) const;

  // Autograd (ops/tape.hpp, autograd/backward.hpp). attach_grad gives
  // this tensor a gradient buffer (grad_req "write", "add" or "null"), which
  // backward() of a result recorded from it fills. Copies of a Tensor share
  // its gradient, as they share its data.
  void attach_grad(std::string_view grad_req = "write");
  Tensor grad() const;
  // The gradient of everything recorded from this result with respect to
  // every tensor with attach_grad, given the head's own gradient (ones by
  // default).
  void backward() const;
  void backward(const Tensor& head_grad) const;
  // The same values, cut off from the recorded graph.
  Tensor detach() const {
    Tensor t = *this;
    t.autograd_.reset();
    return t;
  }
  const std::shared_ptr<autograd::Entry>& autograd_entry() const { return autograd_; }
  void set_autograd_entry(std::shared_ptr<autograd::Entry> entry) { autograd_ = std::move(entry); }

  // A contiguous tensor over part of an existing storage, starting
  // byte_offset bytes in (a multiple of the dtype's size): how a planned
  // graph places its intermediate values in one workspace (jit/plan.hpp).
  static Tensor from_storage(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype,
                             std::size_t byte_offset) {
    const auto n = static_cast<std::size_t>(checked_numel(shape, "from_storage"));
    if (!storage || byte_offset % size_of(dtype) != 0 || byte_offset > storage->bytes() ||
        n > (storage->bytes() - byte_offset) / size_of(dtype))
      fail<ValueError>("from_storage: ", to_string(shape), ' ', name(dtype), " at byte ", byte_offset,
                       " does not fit a storage of ", storage ? storage->bytes() : 0, " bytes");
    Tensor t;
    t.storage_ = std::move(storage);
    t.shape_ = shape;
    t.strides_ = contiguous_strides(shape);
    t.offset_ = static_cast<std::int64_t>(byte_offset / size_of(dtype));
    t.dtype_ = dtype;
    return t;
  }

  // A view sharing this tensor's storage (used by reshape, transpose, slice).
  Tensor view(const Shape& shape, const Strides& strides, std::int64_t offset) const {
    require("view");
    Tensor t = detach();
    t.shape_ = shape;
    t.strides_ = strides;
    t.offset_ = offset;
    return t;
  }

  const Tensor& require(const char* what) const {
    if (!storage_) fail<ValueError>(what, ": the tensor is empty (default-constructed or moved-from)");
    return *this;
  }

 private:
  std::shared_ptr<Storage> storage_;
  Shape shape_;
  Strides strides_;
  std::int64_t offset_ = 0;
  DType dtype_ = DType::float32;
  std::shared_ptr<autograd::Entry> autograd_;
};

// The operands of one op must live on one device: copies between devices
// are explicit (to(device)), never implied by an op.
inline void require_same_device(std::string_view op, const Tensor& a, const Tensor& b) {
  if (a.device() != b.device())
    fail<DeviceError>(op, ": operands live on ", a.device(), " and ", b.device(), "; copy one with to(device) first");
}

}  // namespace hybra
