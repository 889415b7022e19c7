#pragma once
// What the engine asks of the GPUs, as an interface of its own, so that the
// engine sits below the backends that run the work (backend/cuda/gpu.hpp
// implements it and registers itself when it is included, as every program
// that can hold a GPU tensor does).
//
// A GPU op counts as done once its work is queued on the GPU's stream; a
// Fence marks where that work ends. The engine keeps fences on the vars the
// op used (engine/var.hpp), waits for them before a CPU op or a host wait,
// and hands them to the next GPU op that depends on them.
#include <atomic>
#include <memory>
#include <span>
#include <string_view>

#include "../core/error.hpp"
#include "task.hpp"

namespace hybra::engine {

class Fence {
 public:
  virtual ~Fence() = default;
  // The cuda(i) whose stream the work was queued on.
  virtual int gpu() const = 0;
  // Blocks until the work is done; throws DeviceError, naming the op, when the
  // device reported an error instead (this wait and every later one).
  virtual void wait() const = 0;
};
using FencePtr = std::shared_ptr<const Fence>;

class GpuWork {
 public:
  virtual ~GpuWork() = default;
  // Throws DeviceError saying why ops cannot run on cuda(id).
  virtual void require(int id) = 0;
  // Runs an op on the calling thread: its GPU's stream first waits for the
  // fences in `after` that other GPUs hold, then `fn` queues the op's work on
  // it. Returns the fence that ends that work.
  virtual FencePtr run(int id, std::string_view op, std::span<const FencePtr> after, detail::Task& fn) = 0;
  // Has `drain` run at exit before the GPU libraries tear down, or nothing
  // (null): what the process's engine must finish while they still work.
  virtual void drain_at_exit(void (*drain)()) = 0;
};

inline std::atomic<GpuWork*>& gpu_work_slot() {
  static std::atomic<GpuWork*> slot{nullptr};
  return slot;
}

// The registered GPU side; null in a program without it (whose pushes to a
// GPU fail, naming the op).
inline GpuWork* gpu_work() { return gpu_work_slot().load(std::memory_order_acquire); }

}  // namespace hybra::engine
