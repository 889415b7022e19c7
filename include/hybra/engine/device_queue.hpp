#pragma once
// One device's queue of ready ops and the host threads that run them. A
// cpu(i) device has one or more workers, which compute its ops. A cuda(i)
// device has one, the host thread of its stream: it runs each op, which
// queues the op's kernels and copies on the stream and counts as done
// (backend/cuda/gpu.hpp, run_op).
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "context.hpp"
#include "op.hpp"
#include "helping.hpp"
#include "sync.hpp"

namespace hybra::engine::detail {

class DeviceQueue;

// The worker this thread is, the op it will run next without going through
// the queue (see DeviceQueue::enqueue), and the records it is giving back.
struct WorkerSlot {
  const DeviceQueue* device = nullptr;
  OpRecord* next = nullptr;
  RecordPool::Batch* returns = nullptr;
};
inline thread_local WorkerSlot worker_slot;

class DeviceQueue {
 public:
  using Execute = void (*)(OpRecord*) noexcept;

  DeviceQueue(Execute execute, RecordPool& pool, int workers) : execute_(execute), pool_(pool) {
    try {
      for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { run(); });
    } catch (...) {
      stop();
      throw;
    }
  }
  DeviceQueue(const DeviceQueue&) = delete;
  DeviceQueue& operator=(const DeviceQueue&) = delete;
  ~DeviceQueue() { stop(); }

  // Queues a ready op. An op made ready as one of this device's own workers
  // finishes an op, when nothing else is queued, is kept for that worker to
  // run next: a chain of dependent ops then runs back to back without queue
  // traffic, and with the queue empty nothing waits longer for it. An op
  // pushed from inside a running op is queued: its pusher may run on for
  // long, or wait for it, while another worker could start it now.
  void enqueue(OpRecord* op) noexcept {
    WorkerSlot& slot = worker_slot;
    if (slot.device == this && !slot.next && !context.op && queued_.load(std::memory_order_relaxed) == 0) {
      slot.next = op;
      return;
    }
    op->next = nullptr;
    {
      std::lock_guard g(lock_);
      (tail_ ? tail_->next : head_) = op;
      tail_ = op;
      queued_.fetch_add(1, std::memory_order_seq_cst);
    }
    // Sequentially consistent with wait_for_work's sleepers_ increment and
    // queued_ check: either this sees the sleeper or the sleeper sees the op.
    if (sleepers_.load(std::memory_order_seq_cst) > 0) wake(false);
  }

  // Runs what is queued, then ends the workers.
  void stop() noexcept {
    stopping_.store(true, std::memory_order_seq_cst);
    wake(true);
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }

  int workers() const { return static_cast<int>(threads_.size()); }

  // Wakes a sleeping worker, if there is one, to spin for a while with
  // nothing queued: while the pushing thread runs brief ops itself (see
  // Engine::push), the worker takes the chunks they post (helping.hpp).
  void wake_helper() noexcept {
    if (sleepers_.load(std::memory_order_relaxed) == 0) return;
    std::lock_guard g(sleep_mutex_);
    helper_wanted_ = true;
    wake_cv_.notify_one();
  }

 private:
  void run() noexcept {
    RecordPool::Batch returns(pool_);
    worker_slot = {this, nullptr, &returns};
    for (;;) {
      OpRecord* op = std::exchange(worker_slot.next, nullptr);
      if (!op) op = wait_for_work();
      if (!op) break;
      execute_(op);
    }
    worker_slot = {};
  }

  OpRecord* try_pop() noexcept {
    if (queued_.load(std::memory_order_relaxed) == 0) return nullptr;
    std::lock_guard g(lock_);
    OpRecord* op = head_;
    if (!op) return nullptr;
    head_ = op->next;
    if (!head_) tail_ = nullptr;
    queued_.fetch_sub(1, std::memory_order_relaxed);
    return op;
  }

  // The next op, or null once stopping with nothing left.
  OpRecord* wait_for_work() noexcept {
    for (;;) {
      OpRecord* op = nullptr;
      spin_helping_until([&] { return (op = try_pop()) || stopping_.load(std::memory_order_relaxed); });
      if (op || (op = try_pop())) return op;
      if (stopping_.load(std::memory_order_acquire)) return nullptr;
      worker_slot.returns->flush();  // an idle worker holds no records
      // A condition variable, not std::atomic::wait: libstdc++ 12's notify
      // skips the futex wake unless it sees its own waiter count (a separate
      // variable) non-zero, and nothing in the standard orders that load
      // after a release increment of the value waited on, so a wake could be
      // lost. The waker takes sleep_mutex_, which a sleeper holds from its
      // sleepers_ increment until it is inside wait(): no wake falls between
      // the check and the sleep.
      std::unique_lock l(sleep_mutex_);
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      while (queued_.load(std::memory_order_seq_cst) == 0 && !stopping_.load(std::memory_order_seq_cst) &&
             !helper_wanted_)
        wake_cv_.wait(l);
      helper_wanted_ = false;
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
    }
  }

  void wake(bool all) noexcept {
    std::lock_guard g(sleep_mutex_);
    if (all)
      wake_cv_.notify_all();
    else
      wake_cv_.notify_one();
  }

  Execute execute_;
  RecordPool& pool_;
  SpinLock lock_;
  OpRecord* head_ = nullptr;  // ready ops, in the order they became ready
  OpRecord* tail_ = nullptr;
  std::atomic<int> queued_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stopping_{false};
  std::mutex sleep_mutex_;
  std::condition_variable wake_cv_;
  bool helper_wanted_ = false;  // guarded by sleep_mutex_
  std::vector<std::thread> threads_;
};

}  // namespace hybra::engine::detail
