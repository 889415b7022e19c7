#pragma once
// Data parallelism, step two: after backward each device holds the gradient
// of its own part of the batch; allreduce sums them so that every device
// holds the whole batch's gradient and every copy of the model takes the same
// update. broadcast makes the copies equal to begin with.
//
// Both only queue engine ops (copies with to()/copy_to(), sums with
// assign()) and return: the allreduce of one parameter starts as soon as its
// gradients are written and overlaps with the rest of backward and with the
// allreduces of the other parameters. Between GPUs the sum is NCCL's.
// parallel/mpi.hpp does the same across processes.
#include <cstddef>
#include <span>
#include <vector>

#include "../backend/cuda/nccl.hpp"
#include "../expr/evaluate.hpp"
#include "../expr/expression.hpp"

namespace hybra {

namespace detail {

// The tensors of a collective: one per device, of one shape and dtype, each
// with storage of its own (two views of one storage would be summed into
// themselves).
inline void check_collective(std::span<const Tensor> tensors, const char* op) {
  for (const Tensor& t : tensors) t.require(op);
  for (std::size_t k = 1; k < tensors.size(); ++k) {
    const Tensor& first = tensors.front();
    const Tensor& t = tensors[k];
    if (t.shape() != first.shape())
      fail<ShapeError>(op, ": tensor ", k, " has shape ", to_string(t.shape()), " but tensor 0 has shape ",
                       to_string(first.shape()));
    if (t.dtype() != first.dtype())
      fail<DTypeError>(op, ": tensor ", k, " has dtype ", name(t.dtype()), " but tensor 0 has dtype ",
                       name(first.dtype()));
    for (std::size_t j = 0; j < k; ++j)
      if (tensors[j].storage() == t.storage())
        fail<ValueError>(op, ": tensors ", j, " and ", k, " (shape ", to_string(t.shape()), ", on ", tensors[j].device(),
                         " and ", t.device(), ") share one storage; each needs its own");
  }
}

// Whether NCCL sums these tensors: two or more, each contiguous on a GPU of
// its own, and NCCL loads (backend/cuda/nccl.hpp).
inline bool nccl_sums(std::span<const Tensor> tensors) {
  if (tensors.size() < 2) return false;
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    if (tensors[k].device().kind != DeviceKind::cuda || !tensors[k].is_contiguous()) return false;
    for (std::size_t j = 0; j < k; ++j)
      if (tensors[j].device() == tensors[k].device()) return false;
  }
  return backend::cuda::nccl_available();
}

// The tensors summed in place by one NCCL group over their GPUs: one engine
// op, queued on the first tensor's GPU, that writes all of them.
inline void push_nccl_allreduce(std::span<Tensor> per_device) {
  std::vector<Tensor> tensors(per_device.begin(), per_device.end());
  push_op_on(tensors.front().device(), "allreduce (NCCL)", {}, tensors, [tensors] {
    std::vector<int> gpus;
    std::vector<void*> buffers;
    for (const Tensor& t : tensors) {
      gpus.push_back(t.device().id);
      buffers.push_back(t.raw_data());
    }
    backend::cuda::nccl_allreduce(gpus, buffers, static_cast<std::size_t>(tensors.front().size()),
                                  tensors.front().dtype(), "allreduce (NCCL)");
  });
}

}  // namespace detail

// Sums the tensors in place: afterwards each holds the elementwise sum of
// all of them (in its own dtype's arithmetic). They are typically one
// parameter's gradients on each device; all must have one shape and dtype.
// Tensors on distinct GPUs (contiguous, as gradients are) are summed by
// NCCL, one group call over their streams. Otherwise a pairwise tree: at
// each level a tensor adds in a copy of its partner's, made on its own
// device, so the pairs of a level work side by side; then the root's sum is
// copied back to the others, each copy on its destination device. Queued on
// the engine; nothing waits.
inline void allreduce(std::span<Tensor> per_device) {
  detail::check_collective(per_device, "allreduce");
  if (detail::nccl_sums(per_device)) return detail::push_nccl_allreduce(per_device);
  const std::size_t n = per_device.size();
  for (std::size_t stride = 1; stride < n; stride *= 2)
    for (std::size_t i = 0; i + stride < n; i += 2 * stride) {
      Tensor& sum = per_device[i];
      sum.assign(sum + per_device[i + stride].to(sum.device()));
    }
  for (std::size_t k = 1; k < n; ++k) per_device[0].copy_to(per_device[k]);
}

// Copies the root's values into every other tensor (one shape and dtype, as
// for allreduce), each copy queued on its destination device: how the copies
// of a model on several devices start from the same weights.
inline void broadcast(std::span<Tensor> per_device, std::size_t root = 0) {
  detail::check_collective(per_device, "broadcast");
  if (root >= per_device.size())
    fail<ValueError>("broadcast: root ", root, " is out of range for ", per_device.size(), " tensors");
  for (std::size_t k = 0; k < per_device.size(); ++k)
    if (k != root) per_device[root].copy_to(per_device[k]);
}

}  // namespace hybra
