#pragma once
// Tensor ops on the engine: every eager op validates its operands and
// allocates its result on the calling thread (so shape, dtype, device and
// out-of-memory errors are thrown by the call itself), then pushes the
// computation, which reads the operands' storages and writes the result's.
// The closure holds Tensor copies, so the storages it touches live until it
// has run however early the caller drops its handles.
#include <boost/container/small_vector.hpp>
#include <functional>
#include <initializer_list>
#include <ranges>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "../core/tensor.hpp"
#include "context.hpp"
#include "engine.hpp"

namespace hybra {

// The tensors an op reads or writes: a braced list of tensors, a vector of
// them, or a list of pointers; viewed for the duration of the call.
class TensorRefs {
 public:
  TensorRefs(std::initializer_list<std::reference_wrapper<const Tensor>> ts) {
    for (const Tensor& t : ts) refs_.push_back(&t);
  }
  TensorRefs(const std::vector<Tensor>& ts) {  // NOLINT(google-explicit-constructor)
    for (const Tensor& t : ts) refs_.push_back(&t);
  }
  template <std::ranges::input_range R>
    requires std::same_as<std::ranges::range_value_t<R>, const Tensor*>
  TensorRefs(const R& ts) : refs_(std::ranges::begin(ts), std::ranges::end(ts)) {}  // NOLINT

  auto begin() const { return refs_.begin(); }
  auto end() const { return refs_.end(); }
  bool empty() const { return refs_.empty(); }
  const Tensor& front() const { return *refs_.front(); }

 private:
  boost::container::small_vector<const Tensor*, 8> refs_;
};

namespace detail {

// Whether writing t overwrites everything its storage holds, so that the
// write does not depend on (or inherit the failure of) the earlier value.
inline bool covers_storage(const Tensor& t) {
  return t.offset() == 0 && t.is_contiguous() &&
         static_cast<std::size_t>(t.size()) * size_of(t.dtype()) == t.storage()->bytes();
}

// What push_op_on does before it queues its closure, kept out of the
// template: an op costs its closure's type only the call that stores it.
enum class PushAction { queue, run_now, drop };
inline PushAction prepare_push(std::string_view name, const TensorRefs& reads, const TensorRefs& writes,
                               boost::container::small_vector<engine::Var, 8>& read_vars,
                               boost::container::small_vector<engine::Var, 8>& write_vars) {
  if (writes.empty()) fail<ValueError>("push_op: op '", name, "' writes no tensor");
  for (const TensorRefs* list : {&reads, &writes})
    for (const Tensor* t : *list)
      if (!t->defined()) fail<ValueError>(name, ": the tensor is empty (default-constructed or moved-from)");
  if (writes.front().device() == meta()) return PushAction::drop;  // shape inference only: no values to compute
  if (engine::inside_op()) {
    // The enclosing op holds these vars; the write is still counted (engine::Var::writes).
    for (const Tensor* t : writes) t->storage()->var().count_write();
    return PushAction::run_now;
  }
  for (const Tensor* t : reads) read_vars.push_back(t->storage()->var());
  for (const Tensor* t : writes) {
    write_vars.push_back(t->storage()->var());
    if (!covers_storage(*t)) read_vars.push_back(t->storage()->var());
  }
  return PushAction::queue;
}

// push_op's device: that of writes.front(), after refusing GPU operands.
inline Device host_op_device(std::string_view name, const TensorRefs& reads, const TensorRefs& writes) {
  for (const TensorRefs* list : {&reads, &writes})
    for (const Tensor* t : *list)
      if (t->defined() && t->device().kind == DeviceKind::cuda)
        fail<DeviceError>(name, ": this op has no CUDA kernel yet, and an operand lives on ", t->device(),
                          "; copy it with to(cpu()) (docs/cuda.md lists what runs on a GPU)");
  return !writes.empty() && writes.front().defined() ? writes.front().device() : cpu();
}

// How long a kernel on these operands runs, by engine::length_of_work: the
// bytes they hold and, for a product, its multiply-adds.
inline engine::OpLength kernel_length(const TensorRefs& reads, const TensorRefs& writes, std::int64_t multiply_adds) {
  std::int64_t bytes = 0;
  for (const TensorRefs* list : {&reads, &writes})
    for (const Tensor* t : *list)
      if (t->defined()) bytes += t->size() * static_cast<std::int64_t>(size_of(t->dtype()));
  return engine::length_of_work(bytes, multiply_adds);
}

}  // namespace detail

// Queues fn() on `device` after every earlier op that writes what it reads,
// or reads or writes what it writes; returns at once. fn must capture by
// value what it uses (Tensor copies keep storage alive). Writes to part of a
// storage (a view) are ordered as read-modify-writes. Called from inside an
// engine op, fn runs at once: the enclosing op's inputs are ready and
// whatever it created since is complete. An op writing a meta tensor is
// dropped: it has nothing to compute. A brief op may run before push_op
// returns (engine.hpp, "Brief ops"). fn runs where the device's ops run: a
// GPU op queues its work on the GPU's stream (backend/cuda/gpu.hpp).
template <class F>
void push_op_on(Device device, std::string_view name, TensorRefs reads, TensorRefs writes, F&& fn,
                engine::OpLength length = engine::OpLength::unknown) {
  boost::container::small_vector<engine::Var, 8> read_vars, write_vars;
  switch (detail::prepare_push(name, reads, writes, read_vars, write_vars)) {
    case detail::PushAction::drop:
      return;
    case detail::PushAction::run_now:
      fn();
      return;
    case detail::PushAction::queue:
      engine::get().push(name, std::forward<F>(fn), std::span<const engine::Var>(read_vars.data(), read_vars.size()),
                         std::span<const engine::Var>(write_vars.data(), write_vars.size()), device, length);
  }
}

// push_op_on the device of writes.front(), for an op whose kernel runs on
// the host: a GPU tensor among its operands is refused with an error that
// names the op (its CUDA kernel does not exist yet, docs/cuda.md).
template <class F>
void push_op(std::string_view name, TensorRefs reads, TensorRefs writes, F&& fn,
             engine::OpLength length = engine::OpLength::unknown) {
  const Device device = detail::host_op_device(name, reads, writes);
  push_op_on(device, name, reads, writes, std::forward<F>(fn), length);  // which checks the lists
}

// push_op for one of hybra's host kernels: it computes on its operands and
// waits on nothing else (no other thread, process or file), so its size tells
// its time. A small one (detail::kernel_length; a product passes its
// multiply-adds) is brief: it runs on the calling thread when nothing it
// needs is pending, as a hand-off to a worker and back would cost more than
// it. An op of the user's stays on the workers unless it says it is brief.
template <class F>
void push_kernel(std::string_view name, TensorRefs reads, TensorRefs writes, F&& fn, std::int64_t multiply_adds = 0) {
  const engine::OpLength length = detail::kernel_length(reads, writes, multiply_adds);
  push_op(name, std::move(reads), std::move(writes), std::forward<F>(fn), length);
}

// Blocks until every queued op has finished, then rethrows the earliest
// failure that no wait has reported yet.
inline void waitall() { engine::get().waitall(); }

}  // namespace hybra
