#pragma once
// The asynchronous dependency engine (MXNet's ThreadedEnginePerDevice).
//
//   engine::Var a, b, c;
//   engine::get().push("add", [=] { ... }, {a, b}, {c}, cpu(0));  // returns at once
//   engine::get().wait_to_read(c);                                // c's writes are done
//
// An op runs on a worker of its device once every earlier-pushed op that
// writes a var it reads or writes, or reads a var it writes, has finished;
// ops without such a conflict run concurrently. Each var keeps the queue of
// ops waiting for it and each op counts its ungranted vars, so there is no
// global lock and no global graph.
//
// Errors: an exception thrown by an op is stored on every var it writes. Ops
// that read a failed var skip their closure and fail the same way; a wait on a
// failed var rethrows; waitall() rethrows the earliest-pushed failure no
// wait has delivered. A var listed in writes but not in reads is overwritten whole, so
// an op that succeeds clears the var's failure; an op that updates a var in
// place or only in part must list it in both.
//
// Brief ops: an op pushed as OpLength::brief (a few microseconds of work,
// about what handing it to a worker costs: length_of_work) runs on the
// pushing thread before push returns when nothing it depends on is pending,
// no GPU work on its vars is to be waited for, and only one CPU device is in
// use (with several, each op stays on its device so they work side by side).
// It is ordered, fails and is waited for like any other op. It starts no
// thread team for its loops (context.hpp, may_start_team); a sleeping worker
// is woken to help with them instead (helping.hpp). hybra's own kernels say how
// long they are (push.hpp, push_kernel), a plan call too (jit/plan.hpp).
//
// GPU ops: cuda(i) has one host thread, which runs each op: the op queues
// its kernels and copies on the GPU's stream and counts as done. The fence
// that ends its work is kept on the vars it used; an op on another device
// waits for it first (a GPU on its stream, a CPU op on the host), and so do
// wait_to_read and waitall (engine/gpu_work.hpp, which backend/cuda/gpu.hpp
// implements). An error the device reports is thrown by each wait for that
// fence: a CPU op that waited fails with it, a wait or waitall rethrows it.
//
// HYBRA_ENGINE_TYPE=NaiveEngine runs every op on the pushing thread before
// push returns (for debugging; the results and errors are the same).
#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include "../core/device.hpp"
#include "../core/error.hpp"
#include "device_queue.hpp"
#include "gpu_work.hpp"
#include "op.hpp"
#include "helping.hpp"
#include "sync.hpp"
#include "var.hpp"

namespace hybra::engine {

enum class EngineType { threaded, naive };

struct Options {
  EngineType type = EngineType::threaded;
  // Cores shared out among the CPU devices in use; 0 means every core.
  int cpu_threads = 0;
  // Worker threads per CPU device: more than one lets independent ops on
  // the same device run side by side, each with its share of the threads.
  int cpu_workers = 1;

  // The defaults, with the type taken from HYBRA_ENGINE_TYPE (NaiveEngine or
  // ThreadedEnginePerDevice; unset means threaded).
  static Options from_env() {
    Options o;
    if (const char* v = std::getenv("HYBRA_ENGINE_TYPE")) {
      std::string_view t(v);
      if (t == "NaiveEngine")
        o.type = EngineType::naive;
      else if (!t.empty() && t != "ThreadedEnginePerDevice" && t != "ThreadedEngine")
        fail<ValueError>("engine: HYBRA_ENGINE_TYPE=", t,
                         " is not an engine type; use NaiveEngine or ThreadedEnginePerDevice");
    }
    return o;
  }
};

// What a pusher knows of how long its op runs (see "Brief ops" above).
enum class OpLength { unknown, brief };

// The one rule by which eager ops (push.hpp) and plan calls (jit/plan.hpp)
// are judged brief: the bytes their operands and results hold, and their
// products' multiply-adds. The chapter's batch-1 MLP (656 KiB of weights,
// 164k multiply-adds) is of that size, and handing such a call to a worker
// and waiting for it costs half as long as the call (docs/benchmarks.md,
// "Figures behind constants of the code"); for an eager mean over 400 KiB,
// more than the mean itself ("Small eager ops on the calling thread").
inline constexpr std::int64_t brief_bytes = std::int64_t{1} << 20;
inline constexpr std::int64_t brief_multiply_adds = std::int64_t{1} << 20;
inline OpLength length_of_work(std::int64_t bytes, std::int64_t multiply_adds) {
  return bytes <= brief_bytes && multiply_adds <= brief_multiply_adds ? OpLength::brief : OpLength::unknown;
}

class Engine {
 public:
  explicit Engine(Options options = Options::from_env())
      : naive_(options.type == EngineType::naive),
        cpu_threads_(options.cpu_threads > 0 ? options.cpu_threads : detail::hardware_threads()),
        cpu_workers_(std::max(1, options.cpu_workers)) {}
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Runs the pending work, stops the workers and reports on stderr any
  // failure that nothing observed (a destructor cannot throw it).
  ~Engine() {
    if (drains_gpus_at_exit_)
      if (GpuWork* gpus = gpu_work()) gpus->drain_at_exit(nullptr);
    drain_and_stop();
    std::lock_guard g(failures_mutex_);
    for (auto& f : unobserved_) {
      if (f->observed.load()) continue;
      try {
        std::rethrow_exception(f->error);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "hybra engine: an op failure was never waited for: %s\n", e.what());
      }
    }
  }

  // Queues fn() to run on `device` after the earlier ops it conflicts with
  // (see the top of this file); returns at once (a brief op may have run by
  // then). fn's captures live until it has run. Vars listed in both reads and
  // writes are read and written.
  template <class F>
  void push(std::string_view name, F&& fn, Vars reads, Vars writes, Device device = cpu(),
            OpLength length = OpLength::unknown) {
    static_assert(std::is_invocable_v<std::decay_t<F>&>,
                  "hybra::engine::Engine::push: the op must be callable with no arguments");
    detail::OpRecord* op = make_op(name, reads, writes, device);
    try {
      op->fn.emplace(std::forward<F>(fn));
    } catch (...) {
      discard(op);
      throw;
    }
    submit(op, length);
  }

  // Blocks until every pending write to v is done (wait_to_write: every
  // pending read and write), then rethrows v's failure if it has one.
  void wait_to_read(const Var& v) { wait_for(v, false, "wait_to_read"); }
  void wait_to_write(const Var& v) { wait_for(v, true, "wait_to_write"); }

  // Blocks until every pushed op has finished, then rethrows the failure of
  // the earliest-pushed failed op that no wait has delivered (each failure is
  // delivered once; the next waitall delivers the next).
  void waitall() {
    refuse_inside_op("waitall");
    wait_idle();
    const std::exception_ptr device_error = wait_for_gpus();
    detail::FailurePtr first;
    {
      std::lock_guard g(failures_mutex_);
      std::erase_if(unobserved_, [](const detail::FailurePtr& f) { return f->observed.load(); });
      auto it = std::min_element(unobserved_.begin(), unobserved_.end(),
                                 [](const detail::FailurePtr& a, const detail::FailurePtr& b) { return a->seq < b->seq; });
      if (it != unobserved_.end()) {
        first = std::move(*it);
        unobserved_.erase(it);
      }
    }
    if (first) rethrow(*first);
    if (device_error) std::rethrow_exception(device_error);
  }

  // Finishes the pending work (ops it runs may still push) and stops the
  // workers; later pushes throw. Waits keep working.
  void shutdown() {
    refuse_inside_op("shutdown");
    drain_and_stop();
  }

  // Makes this engine finish its ops and its GPUs' queued work at exit
  // before the CUDA libraries tear down (backend/cuda/library.hpp,
  // exit_drain): the process's engine does, as its destructor may run after
  // theirs.
  void finish_gpu_work_at_exit() {
    GpuWork* gpus = gpu_work();
    if (!gpus) return;
    drains_gpus_at_exit_ = true;
    static Engine* engine = this;
    gpus->drain_at_exit([] {
      if (detail::context.op) return;  // exit called inside an op: waiting would wait for that op itself
      engine->wait_idle();
      (void)engine->wait_for_gpus();  // a device error at exit: reported by ~Engine if no wait saw it
    });
  }

  EngineType type() const { return naive_.load() ? EngineType::naive : EngineType::threaded; }

  // The threads an op on CPU device d gets for its own loops and BLAS calls:
  // the cores split evenly among the CPU devices that have had ops (d
  // included), the remainder going to the lowest-numbered, at least one each.
  int device_threads(Device d) const {
    if (d.kind != DeviceKind::cpu || d.id < 0 || d.id >= max_cpu_devices)
      fail<DeviceError>("engine: device_threads(", d, "): the engine has cpu(0) to cpu(", max_cpu_devices - 1, ")");
    std::uint64_t used = used_cpu_devices_.load(std::memory_order_relaxed) | (std::uint64_t{1} << d.id);
    int n = std::popcount(used);
    int rank = std::popcount(used & ((std::uint64_t{1} << d.id) - 1));
    return std::max(1, cpu_threads_ / n + (rank < cpu_threads_ % n ? 1 : 0));
  }

  // Switches between threaded and naive execution once the pending work is
  // done, and starts afresh: no CPU device counts as used (device_threads,
  // brief ops) until it has an op again.
  void set_type(EngineType t) {
    refuse_inside_op("set_type");
    wait_idle();
    naive_.store(t == EngineType::naive);
    used_cpu_devices_.store(0, std::memory_order_relaxed);
  }

 private:
  enum State { running, draining, stopped };

  detail::OpRecord* make_op(std::string_view name, Vars reads, Vars writes, Device device) {
    if (device.kind == DeviceKind::cuda) {
      if (device.id >= max_gpu_devices)
        fail<DeviceError>("engine: op '", name, "' pushed to ", device, "; the engine runs cuda(0) to cuda(",
                          max_gpu_devices - 1, ")");
      try {
        GpuWork* gpus = gpu_work();
        if (!gpus) fail<DeviceError>("this program has no GPU backend (backend/cuda/gpu.hpp)");
        gpus->require(device.id);
      } catch (const DeviceError& e) {
        fail<DeviceError>("engine: op '", name, "' pushed to ", device, ": ", e.what());
      }
    } else if (device.kind != DeviceKind::cpu || device.id < 0 || device.id >= max_cpu_devices) {
      fail<DeviceError>("engine: op '", name, "' pushed to ", device, "; the engine has cpu(0) to cpu(",
                        max_cpu_devices - 1, ") and the GPUs");
    }
    detail::OpRecord* op = pool_.acquire();
    try {
      op->name.assign(name);
      op->device = device;
      add_deps(op, reads, writes, name);
    } catch (...) {
      discard(op);
      throw;
    }
    return op;
  }

  // One Dep per distinct var; a var in both lists is one read-write Dep.
  static void add_deps(detail::OpRecord* op, Vars reads, Vars writes, std::string_view name) {
    for (Vars list : {reads, writes})
      for (const Var& v : list)
        if (!v.s_) fail<ValueError>("engine: op '", name, "' was given an empty (moved-from) var");
    op->reserve_deps(reads.size() + writes.size());
    auto find = [op](detail::VarState* s) -> detail::Dep* {
      for (auto& d : op->deps())
        if (d.var == s) return &d;
      return nullptr;
    };
    for (const Var& v : writes)
      if (!find(v.s_)) op->add_dep({.var = v.s_, .op = op, .write = true});
    for (const Var& v : reads) {
      if (detail::Dep* d = find(v.s_))
        d->read = true;
      else
        op->add_dep({.var = v.s_, .op = op, .read = true});
    }
    for (auto& d : op->deps()) d.var->retain();
  }

  // Pushes a built op: counts it, resolves its device and appends its Deps.
  void submit(detail::OpRecord* op, OpLength length) {
    op->seq = pushed_.fetch_add(1, std::memory_order_seq_cst);
    try {
      // Pairs with drain_and_stop: either shutdown waits for this op or this
      // push sees the shutdown. Ops running during the drain may still push.
      State s = state_.load(std::memory_order_seq_cst);
      if (s != running && !(s == draining && detail::context.engine == this))
        fail("engine: op '", op->name, "' pushed after the engine was shut down");
      if (!naive_.load(std::memory_order_relaxed)) op->queue = device_queue(op->device);
      if (op->device.kind == DeviceKind::cpu) mark_used(op->device.id);
    } catch (...) {
      discard(op);
      op_done();
      throw;
    }
    start(op, length);
  }

  void start(detail::OpRecord* op, OpLength length) noexcept {
    op->engine = this;
    op->unmet.store(op->n_deps + 1, std::memory_order_relaxed);
    int granted = 1;
    for (auto& d : op->deps()) granted += d.var->append(&d);
    if (op->unmet.fetch_sub(granted, std::memory_order_acq_rel) != granted) return;
    // Inside an op, push_op runs its closure directly; the engine's own
    // push from an op is left to a worker, as the pusher may run on for long.
    // So is an op that must wait for a GPU's work first: the wait would hold
    // the pusher.
    if (length == OpLength::brief && op->queue && op->device.kind == DeviceKind::cpu && !detail::context.op &&
        std::has_single_bit(used_cpu_devices_.load(std::memory_order_relaxed)) && !waits_for_gpu(op)) {
      detail::DeviceQueue* queue = op->queue;
      execute(op, /*on_pusher=*/true);
      queue->wake_helper();
    } else {
      dispatch(op);
    }
  }

  void dispatch(detail::OpRecord* op) noexcept {
    if (op->queue)
      op->queue->enqueue(op);
    else
      execute(op);  // naive
  }

  // on_pusher: a brief op run by the thread that pushed it, which starts no
  // thread team (context.hpp, may_start_team).
  void execute(detail::OpRecord* op, bool on_pusher = false) noexcept {
    detail::FailurePtr failure;
    for (auto& d : op->deps())
      if (d.read && d.failure) {
        failure = d.failure;
        break;
      }
    if (!failure) {
      detail::ContextScope scope(this, op, op_threads(op), !on_pusher);
      try {
        const std::vector<FencePtr> after = gpu_work_before(op);
        if (op->device.kind == DeviceKind::cuda) {
          const int gpu = op->device.id;
          FencePtr fence = gpu_work()->run(gpu, op->name, after, op->fn);
          for (auto& d : op->deps()) d.var->add_fence({gpu, fence}, d.write);
          std::lock_guard g(fences_mutex_);
          last_fences_[static_cast<std::size_t>(gpu)] = std::move(fence);
        } else {
          for (const auto& f : after) f->wait();
          if (!after.empty())
            for (auto& d : op->deps())
              if (d.write) d.var->clear_fences();  // done, and this op alone uses the var
          op->fn();
        }
      } catch (...) {
        failure = record_failure(*op);
      }
    }
    op->fn.reset();
    finish(op, std::move(failure));
  }

  static bool waits_for_gpu(detail::OpRecord* op) noexcept {
    for (const auto& d : op->deps())
      if (d.var->fenced.load(std::memory_order_acquire)) return true;
    return false;
  }

  // The fences of GPU work on op's vars that op must wait for: none for most
  // CPU ops (no GPU has touched their vars).
  static std::vector<FencePtr> gpu_work_before(detail::OpRecord* op) {
    std::vector<FencePtr> after;
    for (const auto& d : op->deps())
      if (d.var->fenced.load(std::memory_order_acquire))
        for (auto& f : d.var->gpu_fences()) after.push_back(std::move(f.fence));
    return after;
  }

  // Blocks until the work queued on every GPU so far is done; returns the
  // error of the first that failed on the device, if one did.
  std::exception_ptr wait_for_gpus() {
    std::array<FencePtr, max_gpu_devices> last;
    {
      std::lock_guard g(fences_mutex_);
      last.swap(last_fences_);
    }
    std::exception_ptr error;
    for (const auto& f : last) {
      if (!f) continue;
      try {
        f->wait();
      } catch (...) {
        if (!error) error = std::current_exception();
      }
    }
    return error;
  }

  // Ends op's accesses, leaving `failure` on the vars it wrote, starts the ops
  // that were waiting only for them, wakes the waits whose turn has come, and
  // releases op's record. Everything the op held is let go before it counts
  // as finished: a waitall() that returns leaves no failure in a worker's hands.
  // Each var is let go before its waits are woken, so that a woken thread
  // dropping the last handle to a tensor frees its var on its own thread (a
  // free here would move the allocator's lines to this one).
  void finish(detail::OpRecord* op, detail::FailurePtr failure) noexcept {
    for (auto& d : op->deps()) {
      detail::Dep* t = d.var->finish(&d, failure);
      d.var->release();
      while (t) {
        detail::Dep* next = t->next;  // read first: a woken waiter may reuse its Dep
        if (t->waiter)
          t->waiter->signal();
        else if (t->op->unmet.fetch_sub(1, std::memory_order_acq_rel) == 1)
          t->op->engine->dispatch(t->op);
        t = next;
      }
    }
    failure.reset();
    for (auto& d : op->deps()) d.failure.reset();
    op->n_deps = 0;
    op->queue = nullptr;
    if (auto* returns = detail::worker_slot.returns; returns && &returns->pool() == &pool_)
      returns->add(op);
    else
      pool_.recycle(op);
    op_done();
  }

  void op_done() noexcept {
    std::int64_t done = completed_.fetch_add(1, std::memory_order_seq_cst) + 1;
    // Reads pushed_ (the pushers' line) only when someone waits for idle.
    if (idle_waiters_.load(std::memory_order_seq_cst) > 0 && done == pushed_.load(std::memory_order_seq_cst)) {
      std::lock_guard g(idle_mutex_);
      idle_cv_.notify_all();
    }
  }

  // Every push is counted before its op can finish, so completed_ <= pushed_
  // at all times, and reading completed_ first then an equal pushed_ proves
  // an instant with nothing pending. seq_cst: drain_and_stop's state_ store,
  // then these loads, pairs with submit's pushed_ increment, then its state_
  // load.
  bool idle() const noexcept {
    std::int64_t done = completed_.load(std::memory_order_seq_cst);
    return done == pushed_.load(std::memory_order_seq_cst);
  }

  void wait_idle() {
    if (detail::spin_helping_until([&] { return idle(); })) return;
    idle_waiters_.fetch_add(1, std::memory_order_seq_cst);
    {
      std::unique_lock l(idle_mutex_);
      idle_cv_.wait(l, [&] { return idle(); });
    }
    idle_waiters_.fetch_sub(1, std::memory_order_relaxed);
  }

  void wait_for(const Var& v, bool write, const char* what) {
    refuse_inside_op(what);
    // The caller's handle keeps the var alive until this returns.
    detail::VarState* s = v.state(what);
    detail::Waiter& w = detail::thread_waiter;
    detail::FailurePtr failure;
    bool queued;
    {
      std::lock_guard g(s->lock);
      queued = !s->free_for(write);
      if (queued) {
        w.reset();
        w.dep = {.var = s, .waiter = &w, .write = write};
        s->enqueue(&w.dep);
      } else {
        failure = s->failure;
      }
    }
    if (queued) {
      w.wait();
      failure = std::move(w.dep.failure);
    }
    if (write) s->writes.fetch_add(1, std::memory_order_acq_rel);
    if (failure) rethrow(*failure);
    if (s->fenced.load(std::memory_order_acquire))
      for (const auto& f : s->gpu_fences()) f.fence->wait();
  }

  [[noreturn]] static void rethrow(detail::Failure& f) {
    f.observed.store(true);
    std::rethrow_exception(f.error);
  }

  // Wraps the exception in flight in one of the same hybra::Error class whose
  // message names the op and its device, and keeps it for waitall().
  detail::FailurePtr record_failure(const detail::OpRecord& op) noexcept {
    auto f = std::make_shared<detail::Failure>();
    f->seq = op.seq;
    std::string where = hybra::detail::concat("engine op '", op.name, "' on ", op.device, " failed: ");
    try {
      throw;
    } catch (const ShapeError& e) {
      f->error = std::make_exception_ptr(ShapeError(where + e.what()));
    } catch (const DTypeError& e) {
      f->error = std::make_exception_ptr(DTypeError(where + e.what()));
    } catch (const DeviceError& e) {
      f->error = std::make_exception_ptr(DeviceError(where + e.what()));
    } catch (const AxisError& e) {
      f->error = std::make_exception_ptr(AxisError(where + e.what()));
    } catch (const OutOfMemory& e) {
      f->error = std::make_exception_ptr(OutOfMemory(where + e.what()));
    } catch (const ValueError& e) {
      f->error = std::make_exception_ptr(ValueError(where + e.what()));
    } catch (const IndexError& e) {
      f->error = std::make_exception_ptr(IndexError(where + e.what()));
    } catch (const std::bad_alloc&) {
      f->error = std::make_exception_ptr(OutOfMemory(where + "out of memory"));
    } catch (const std::exception& e) {
      f->error = std::make_exception_ptr(Error(where + e.what()));
    } catch (...) {
      f->error = std::make_exception_ptr(Error(where + "an exception that is not a std::exception"));
    }
    std::lock_guard g(failures_mutex_);
    std::erase_if(unobserved_, [](const detail::FailurePtr& u) { return u->observed.load(); });
    unobserved_.push_back(f);
    return f;
  }

  void refuse_inside_op(const char* what) const {
    if (const auto* op = detail::context.op)
      fail(what, ": called inside engine op '", op->name,
           "'; an op cannot wait for the engine (it would wait for itself); "
           "list the var among the op's reads instead");
  }

  // A worker's share of its device's threads (naive ops run alone); a GPU
  // op's host thread does no parallel work of its own.
  int op_threads(const detail::OpRecord* op) const {
    if (op->device.kind == DeviceKind::cuda) return 1;
    int share = device_threads(op->device);
    return op->queue ? std::max(1, share / op->queue->workers()) : share;
  }

  void mark_used(int id) noexcept {
    std::uint64_t bit = std::uint64_t{1} << id;
    if (!(used_cpu_devices_.load(std::memory_order_relaxed) & bit)) used_cpu_devices_.fetch_or(bit);
  }

  // cpu(i)'s queue with its workers, or cuda(i)'s with the one thread of its stream.
  detail::DeviceQueue* device_queue(Device device) {
    auto& slot = device.kind == DeviceKind::cuda ? gpu_queues_[device.id] : cpu_queues_[device.id];
    if (auto* q = slot.load(std::memory_order_acquire)) return q;
    std::lock_guard g(devices_mutex_);
    if (auto* q = slot.load(std::memory_order_relaxed)) return q;
    auto* q = new detail::DeviceQueue([](detail::OpRecord* op) noexcept { op->engine->execute(op); }, pool_,
                                      device.kind == DeviceKind::cuda ? 1 : cpu_workers_);
    slot.store(q, std::memory_order_release);
    return q;
  }

  void drain_and_stop() noexcept {
    std::lock_guard g(shutdown_mutex_);
    if (state_.load() == stopped) return;
    state_.store(draining, std::memory_order_seq_cst);
    wait_idle();
    state_.store(stopped, std::memory_order_seq_cst);
    std::lock_guard d(devices_mutex_);
    for (auto& slot : cpu_queues_) delete slot.exchange(nullptr);
    for (auto& slot : gpu_queues_) delete slot.exchange(nullptr);
  }

  // Returns a record that never started.
  void discard(detail::OpRecord* op) noexcept {
    op->fn.reset();
    release_deps(op);
    pool_.recycle(op);
  }

  static void release_deps(detail::OpRecord* op) noexcept {
    for (auto& d : op->deps()) {
      d.failure.reset();
      d.var->release();
    }
    op->n_deps = 0;
  }

  std::atomic<bool> naive_;
  const int cpu_threads_;
  const int cpu_workers_;
  std::atomic<State> state_{running};
  // Ops pushed and ops finished, on separate cache lines: pushing threads
  // and workers each write only their own.
  alignas(64) std::atomic<std::int64_t> pushed_{0};
  alignas(64) std::atomic<std::int64_t> completed_{0};
  alignas(64) std::atomic<int> idle_waiters_{0};
  std::mutex idle_mutex_;
  std::condition_variable idle_cv_;
  std::mutex shutdown_mutex_;
  std::mutex devices_mutex_;
  std::array<std::atomic<detail::DeviceQueue*>, max_cpu_devices> cpu_queues_{};
  std::array<std::atomic<detail::DeviceQueue*>, max_gpu_devices> gpu_queues_{};
  std::atomic<std::uint64_t> used_cpu_devices_{0};  // bit i: cpu(i) has had an op
  detail::RecordPool pool_;
  std::mutex fences_mutex_;
  std::array<FencePtr, max_gpu_devices> last_fences_{};  // of the latest op on each GPU
  std::mutex failures_mutex_;
  std::vector<detail::FailurePtr> unobserved_;
  bool drains_gpus_at_exit_ = false;
};

// The process-wide engine, created on first use with Options::from_env().
inline Engine& get() {
  static Engine& engine = []() -> Engine& {
    static Engine e(Options::from_env());
    e.finish_gpu_work_at_exit();
    return e;
  }();
  return engine;
}

// Finishes the global engine's pending work and stops it; later pushes throw.
inline void shutdown() { get().shutdown(); }

}  // namespace hybra::engine
