#pragma once
// One GPU as hybra uses it: its primary context, the stream its engine ops
// run on, its memory (memory.hpp), the kernels loaded into it, and copies
// between it and the host (through pinned staging buffers) or another GPU.
//
// The engine runs each op of cuda(i) on one host thread of its own (the
// "worker" of the device): the op queues its kernels and copies on the
// stream and counts as done at once, so the worker goes on to the next op
// while the GPU still runs this one. Where the op's work ends on the stream
// is marked by a Fence (an event recorded after it), which the engine keeps
// on every var the op used: an op on the same GPU needs nothing more (the
// stream runs work in order), an op on another GPU makes its own stream wait
// for the fence, and the host (a CPU op, wait_to_read, waitall) blocks on it.
// A device-side error is reported by the first such wait, naming the op
// whose work the fence ends. With synchronous ops (HYBRA_CUDA_SYNC=1) the
// worker waits for the stream after each op instead, so such an error fails
// the very op that caused it (run_op). Bad input a kernel finds is raised
// by the first wait after it too (bad_input.hpp). The engine reaches all this through
// its own interface (engine/gpu_work.hpp), which the end of this file
// implements.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../../core/device.hpp"
#include "../../engine/gpu_work.hpp"
#include "bad_input.hpp"
#include "driver.hpp"
#include "memory.hpp"

namespace hybra::backend::cuda {

class Fence;
using engine::FencePtr;

class Gpu {
 public:
  static constexpr std::size_t staging_bytes = std::size_t{4} << 20;  // each of the two pinned buffers
  static constexpr unsigned threads_per_block = 256;

  Gpu(const Driver& cu, int id, const GpuInfo& info) : cu_(cu), id_(id), info_(info) {
    CUdevice device = 0;
    cu_.check(cu_.cuDeviceGet(&device, id), "cuDeviceGet");
    cu_.check(cu_.cuDevicePrimaryCtxRetain(&context_, device), "cuDevicePrimaryCtxRetain");
    bind();
    cu_.check(cu_.cuStreamCreate(&stream_, constant::stream_non_blocking), "cuStreamCreate");
    memory_ = std::make_unique<CachingAllocator>(cu_, context_, stream_, hybra::cuda(id));
  }
  Gpu(const Gpu&) = delete;
  Gpu& operator=(const Gpu&) = delete;

  Device device() const { return hybra::cuda(id_); }
  const GpuInfo& info() const { return info_; }
  CUcontext context() const { return context_; }
  CUstream stream() const { return stream_; }
  CachingAllocator& memory() { return *memory_; }
  const Driver& driver() const { return cu_; }

  // The architecture NVRTC compiles this GPU's kernels for, as compute_90.
  std::string arch() const { return "compute_" + std::to_string(info_.major) + std::to_string(info_.minor); }

  // Makes this GPU's context the calling thread's.
  void bind() const { cu_.check(cu_.cuCtxSetCurrent(context_), "cuCtxSetCurrent"); }

  // Kernel `name` of a PTX program; each program is loaded into this GPU
  // once. Kernel names are unique to their code (expr/cuda_elementwise.hpp names
  // them by a hash).
  CUfunction function(const std::string& ptx, const std::string& name) {
    std::lock_guard g(modules_mutex_);
    if (auto it = functions_.find(name); it != functions_.end()) return it->second;
    CUmodule& module = modules_[ptx];
    if (!module) {
      bind();
      const CUresult loaded = cu_.cuModuleLoadData(&module, ptx.c_str());
      if (loaded != constant::success) modules_.erase(ptx);
      cu_.check(loaded, "cuModuleLoadData (loading " + name + "'s PTX)");
    }
    CUfunction f = nullptr;
    cu_.check(cu_.cuModuleGetFunction(&f, module, name.c_str()), "cuModuleGetFunction(" + name + ")");
    functions_.emplace(name, f);
    return f;
  }

  // The blocks of threads_per_block threads an elementwise kernel over n
  // elements is launched with: a grid-stride loop, so at least one, and at
  // most enough to fill a GPU of `multiprocessors` SMs.
  static unsigned elementwise_blocks(std::int64_t n, int multiprocessors) {
    const std::int64_t cap = std::max(1, multiprocessors) * std::int64_t{32};
    return static_cast<unsigned>(std::clamp<std::int64_t>((n + threads_per_block - 1) / threads_per_block, 1, cap));
  }

  // Launches an elementwise kernel over n elements on the stream.
  void launch(CUfunction f, std::int64_t n, void** args, std::string_view what) {
    if (n <= 0) return;
    launch_grid(f, elementwise_blocks(n, info_.multiprocessors), threads_per_block, args, what);
  }

  // Launches a kernel of `blocks` blocks of `threads` threads on the stream.
  void launch_grid(CUfunction f, unsigned blocks, unsigned threads, void** args, std::string_view what) {
    cu_.check(cu_.cuLaunchKernel(f, blocks, 1, 1, threads, 1, 1, 0, stream_, args, nullptr),
              hybra::detail::concat("cuLaunchKernel (", what, ")"));
  }

  // Waits for everything queued on the stream. A failure here is an error a
  // kernel or copy of `what` raised on the device after its launch.
  void synchronize(std::string_view what) {
    CUresult r = cu_.cuStreamSynchronize(stream_);
    if (r != constant::success)
      fail<DeviceError>("CUDA: the work ", what, " queued on ", device(), " failed on the device: ", cu_.describe(r));
    if (bad_input_found()) {
      if (const std::exception_ptr bad = take_bad_input(hybra::detail::concat("the work ", what)))
        std::rethrow_exception(bad);
    }
  }

  // The report this GPU's kernels write bad input into (bad_input.hpp),
  // made at first use and kept for the process's life: launches and CUDA
  // graphs hold its address.
  BadInputReport* bad_input_report() {
    std::call_once(report_made_, [this] {
      bind();
      void* p = nullptr;
      cu_.check(cu_.cuMemHostAlloc(&p, sizeof(BadInputReport), constant::host_alloc_mapped),
                "cuMemHostAlloc (the bad input report)");
      report_.store(new (p) BadInputReport, std::memory_order_release);
    });
    return report_.load(std::memory_order_acquire);
  }

  // Whether a kernel has written the report since it was last taken. Its
  // `op` word is read and cleared atomically: threads waiting on fences of
  // this GPU may look at once.
  bool bad_input_found() const {
    BadInputReport* r = report_.load(std::memory_order_acquire);
    return r && std::atomic_ref<std::uint32_t>(r->op).load(std::memory_order_acquire) != 0;
  }

  // The error of what this GPU's kernels reported since the last call, if
  // any, raised at a wait for `waited_for`; the report is
  // cleared for the next finder. Call it only after waiting for the GPU.
  std::exception_ptr take_bad_input(std::string_view waited_for) {
    BadInputReport* r = report_.load(std::memory_order_acquire);
    if (!r) return nullptr;
    std::lock_guard g(report_mutex_);
    std::atomic_ref<std::uint32_t> op(r->op);
    if (op.load(std::memory_order_acquire) == 0) return nullptr;
    const BadInputReport found = *r;
    op.store(0, std::memory_order_release);
    return bad_input_error(found, device(), waited_for);
  }

  // Marks the end of the work queued on the stream so far, as the work of
  // engine op `op`.
  FencePtr fence_after(std::string_view op);

  // Makes the stream wait (on the GPU, not the host) for another GPU's work
  // up to f.
  void wait_on_stream(const Fence& f);

  // Copies between host memory and this GPU, queued on the stream, through
  // two pinned buffers in turn: one is filled (or emptied) by the CPU while
  // the other is being transferred.
  void copy_from_host(CUdeviceptr dst, const void* src, std::size_t bytes) {
    std::lock_guard g(staging_mutex_);
    prepare_staging();
    const auto* from = static_cast<const char*>(src);
    for (std::size_t done = 0, k = 0; done < bytes; done += staging_bytes, ++k) {
      const std::size_t n = std::min(staging_bytes, bytes - done);
      Staging& s = staging_[k % 2];
      if (s.pending) cu_.check(cu_.cuEventSynchronize(s.event), "cuEventSynchronize");
      std::memcpy(s.buffer, from + done, n);
      cu_.check(cu_.cuMemcpyHtoDAsync(dst + done, s.buffer, n, stream_), "cuMemcpyHtoDAsync");
      cu_.check(cu_.cuEventRecord(s.event, stream_), "cuEventRecord");
      s.pending = true;
    }
  }

  void copy_to_host(void* dst, CUdeviceptr src, std::size_t bytes) {
    std::lock_guard g(staging_mutex_);
    prepare_staging();
    auto* to = static_cast<char*>(dst);
    const std::size_t chunks = (bytes + staging_bytes - 1) / staging_bytes;
    auto issue = [&](std::size_t k) {
      Staging& s = staging_[k % 2];
      const std::size_t at = k * staging_bytes, n = std::min(staging_bytes, bytes - at);
      cu_.check(cu_.cuMemcpyDtoHAsync(s.buffer, src + at, n, stream_), "cuMemcpyDtoHAsync");
      cu_.check(cu_.cuEventRecord(s.event, stream_), "cuEventRecord");
      s.pending = true;
    };
    if (chunks > 0) issue(0);
    for (std::size_t k = 0; k < chunks; ++k) {
      if (k + 1 < chunks) issue(k + 1);
      Staging& s = staging_[k % 2];
      cu_.check(cu_.cuEventSynchronize(s.event), "cuEventSynchronize");
      s.pending = false;
      const std::size_t at = k * staging_bytes;
      std::memcpy(to + at, s.buffer, std::min(staging_bytes, bytes - at));
    }
  }

  // Sets `count` elements of `width` bytes (1, 2 or 4) to `pattern`, on the stream.
  void fill(CUdeviceptr dst, unsigned pattern, int width, std::size_t count) {
    if (width == 1)
      cu_.check(cu_.cuMemsetD8Async(dst, static_cast<unsigned char>(pattern), count, stream_), "cuMemsetD8Async");
    else if (width == 2)
      cu_.check(cu_.cuMemsetD16Async(dst, static_cast<unsigned short>(pattern), count, stream_), "cuMemsetD16Async");
    else
      cu_.check(cu_.cuMemsetD32Async(dst, pattern, count, stream_), "cuMemsetD32Async");
  }

  // Within this GPU, or from another (directly where the two can reach each
  // other's memory, else the driver stages it through the host).
  void copy_from(CUdeviceptr dst, const Gpu& source, CUdeviceptr src, std::size_t bytes) {
    if (bytes == 0) return;
    if (&source == this) {
      cu_.check(cu_.cuMemcpyDtoDAsync(dst, src, bytes, stream_), "cuMemcpyDtoDAsync");
      return;
    }
    enable_peer_access(source);
    cu_.check(cu_.cuMemcpyPeerAsync(dst, context_, src, source.context_, bytes, stream_), "cuMemcpyPeerAsync");
  }

 private:
  struct Staging {
    void* buffer = nullptr;
    CUevent event = nullptr;
    bool pending = false;  // a transfer through it may still run
  };

  void prepare_staging() {
    if (staging_[0].buffer) return;
    bind();
    for (Staging& s : staging_) {
      cu_.check(cu_.cuMemHostAlloc(&s.buffer, staging_bytes, 0), "cuMemHostAlloc (pinned staging)");
      cu_.check(cu_.cuEventCreate(&s.event, constant::event_disable_timing), "cuEventCreate");
    }
  }

  friend class Fence;

  void recycle(CUevent e) noexcept {
    std::lock_guard g(events_mutex_);
    free_events_.push_back(e);
  }

  void enable_peer_access(const Gpu& source) {
    std::lock_guard g(peers_mutex_);
    if (peers_checked_ & (std::uint64_t{1} << source.id_)) return;
    peers_checked_ |= std::uint64_t{1} << source.id_;
    int can = 0;
    if (cu_.cuDeviceCanAccessPeer(&can, id_, source.id_) == constant::success && can) {
      bind();
      cu_.cuCtxEnablePeerAccess(source.context_, 0);  // already enabled is fine
    }
  }

  const Driver& cu_;
  int id_;
  GpuInfo info_;
  CUcontext context_ = nullptr;
  CUstream stream_ = nullptr;
  std::unique_ptr<CachingAllocator> memory_;
  std::mutex modules_mutex_;
  std::unordered_map<std::string, CUmodule> modules_;  // by PTX
  std::unordered_map<std::string, CUfunction> functions_;
  std::mutex staging_mutex_;
  std::array<Staging, 2> staging_{};
  std::mutex peers_mutex_;
  std::uint64_t peers_checked_ = 0;
  std::mutex events_mutex_;
  std::vector<CUevent> free_events_;  // of fences that are gone
  std::once_flag report_made_;
  std::atomic<BadInputReport*> report_{nullptr};
  std::mutex report_mutex_;
};

// The point on a GPU's stream where the work of one engine op ends. Shared
// by the vars the op used; its event goes back to the GPU when the last
// holder lets go. wait() blocks the calling thread until the work is done;
// when the device reports an error instead, that wait and every later one
// throws the same DeviceError, naming the op.
class Fence final : public engine::Fence {
 public:
  Fence(Gpu& gpu, CUevent event, std::string op) : gpu_(gpu), event_(event), op_(std::move(op)) {}
  Fence(const Fence&) = delete;
  Fence& operator=(const Fence&) = delete;
  ~Fence() override { gpu_.recycle(event_); }

  int gpu() const override { return gpu_.id_; }
  CUevent event() const { return event_; }

  void wait() const override {
    std::lock_guard g(mutex_);
    if (!done_) {
      gpu_.bind();
      const CUresult r = gpu_.cu_.cuEventSynchronize(event_);
      done_ = true;
      if (r != constant::success)
        error_ = std::make_exception_ptr(DeviceError(hybra::detail::concat(
            "CUDA: the work queued on ", gpu_.device(), " up to the end of op '", op_,
            "' failed on the device: ", gpu_.cu_.describe(r),
            " (GPU ops run asynchronously, so an earlier op on it may be the cause; with HYBRA_CUDA_SYNC=1 each "
            "op waits for its work and the one that failed reports it)")));
      else if (gpu_.bad_input_found())
        error_ = gpu_.take_bad_input(hybra::detail::concat("the work up to the end of op '", op_, "'"));
    }
    if (error_) std::rethrow_exception(error_);
  }

 private:
  Gpu& gpu_;
  CUevent event_;
  std::string op_;
  mutable std::mutex mutex_;
  mutable bool done_ = false;
  mutable std::exception_ptr error_;
};

inline FencePtr Gpu::fence_after(std::string_view op) {
  CUevent e = nullptr;
  {
    std::lock_guard g(events_mutex_);
    if (!free_events_.empty()) {
      e = free_events_.back();
      free_events_.pop_back();
    }
  }
  if (!e) cu_.check(cu_.cuEventCreate(&e, constant::event_disable_timing), "cuEventCreate");
  const CUresult r = cu_.cuEventRecord(e, stream_);
  if (r != constant::success) recycle(e);
  cu_.check(r, "cuEventRecord");
  return std::make_shared<const Fence>(*this, e, std::string(op));
}

inline void Gpu::wait_on_stream(const Fence& f) {
  cu_.check(cu_.cuStreamWaitEvent(stream_, f.event(), 0), "cuStreamWaitEvent");
}

namespace detail {
// Every GPU the driver sees, set up on first use and kept for the process's
// life (engine workers and tensors freed at exit may still use them).
inline std::vector<std::unique_ptr<Gpu>>* make_gpus() {
  const Driver& cu = driver();
  auto* gpus = new std::vector<std::unique_ptr<Gpu>>;
  const auto& infos = driver_status().gpus;
  for (int i = 0; i < static_cast<int>(infos.size()); ++i)
    gpus->push_back(std::make_unique<Gpu>(cu, i, infos[static_cast<std::size_t>(i)]));
  return gpus;
}
}  // namespace detail

// cuda(id)'s GPU; throws DeviceError saying why when there is none.
inline Gpu& gpu(int id) {
  const auto& status = driver_status();
  if (!status.problem.empty())
    fail<DeviceError>(hybra::cuda(id), " is not available: ", status.problem, "; use cpu(i) (docs/cuda.md)");
  if (id < 0 || id >= static_cast<int>(status.gpus.size()))
    fail<DeviceError>("there is no ", hybra::cuda(id), ": the CUDA driver sees ", status.gpus.size(), " GPU",
                      status.gpus.size() == 1 ? "" : "s", ", cuda(0) to cuda(", status.gpus.size() - 1, ")");
  static std::vector<std::unique_ptr<Gpu>>* const gpus = detail::make_gpus();
  return *(*gpus)[static_cast<std::size_t>(id)];
}

// A process-wide setting, on when the environment variable it is named by
// is 1 at first use, then switched by the program.
class Switch {
 public:
  explicit Switch(const char* variable) {
    const char* v = std::getenv(variable);
    on_.store(v && std::string_view(v) == "1");
  }
  bool on() const { return on_.load(std::memory_order_relaxed); }
  void set(bool on) { on_.store(on); }

 private:
  std::atomic<bool> on_;
};

// Whether each GPU op waits for its work before it counts as done (see the
// top of this file): HYBRA_CUDA_SYNC=1, or set_synchronous_ops.
inline Switch& synchronous_ops_switch() {
  static Switch s("HYBRA_CUDA_SYNC");
  return s;
}
inline bool synchronous_ops() { return synchronous_ops_switch().on(); }
inline void set_synchronous_ops(bool on) { synchronous_ops_switch().set(on); }

// Runs an engine op of cuda(id) on the calling thread: binds the GPU, makes
// its stream wait for the work of other GPUs that the op depends on (after),
// runs fn (which queues work on the stream) and returns the fence that ends
// it. With synchronous ops it first waits for the stream, so that whatever
// fails on the device fails this op.
template <class F>
FencePtr run_op(int id, std::string_view name, std::span<const FencePtr> after, F&& fn) {
  Gpu& g = gpu(id);
  g.bind();
  try {
    // Every fence a GPU op gets is one of these: the engine's fences are
    // made by fence_after alone.
    for (const FencePtr& f : after)
      if (f->gpu() != id) g.wait_on_stream(static_cast<const Fence&>(*f));
    std::forward<F>(fn)();
    if (synchronous_ops()) g.synchronize(hybra::detail::concat("of op '", name, "'"));
    return g.fence_after(name);
  } catch (...) {
    g.driver().cuStreamSynchronize(g.stream());  // what it queued must finish before its memory is reused
    throw;
  }
}

namespace detail {

class EngineGpuWork final : public engine::GpuWork {
 public:
  void require(int id) override { (void)gpu(id); }
  FencePtr run(int id, std::string_view op, std::span<const FencePtr> after, engine::detail::Task& fn) override {
    return run_op(id, op, after, fn);
  }
  void drain_at_exit(void (*drain)()) override { exit_drain().store(drain); }
};

// Registered during static initialisation, before any code of the program's
// own that a translation unit including this file defines after it; never
// destroyed, as the engine of the process may call it at exit.
inline const bool engine_gpu_work_registered = [] {
  static EngineGpuWork* const work = new EngineGpuWork;
  engine::gpu_work_slot().store(work, std::memory_order_release);
  return true;
}();

}  // namespace detail

}  // namespace hybra::backend::cuda
