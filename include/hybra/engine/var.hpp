#pragma once
// Engine variables: each names one piece of mutable state (later, one
// Storage) and keeps the queue of ops waiting to use it, MXNet style. An op
// holds one Dep per var; a var grants access to the Deps at the front of its
// queue (any number of readers, or one writer) and the op runs once all of
// its Deps are granted. A thread blocked in a wait queues a Dep too.
//
// A GPU op counts as done once its work is queued on its GPU's stream; the
// var keeps, for each GPU, the fence that ends the latest such work that
// used it (engine/gpu_work.hpp), for whatever runs elsewhere to wait for.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "gpu_work.hpp"
#include "helping.hpp"
#include "sync.hpp"

namespace hybra::engine {

class Engine;

namespace detail {

struct OpRecord;
class Waiter;

// An exception raised inside an op, shared by every var it poisoned. It is
// observed once some wait rethrows it; waitall() reports only unobserved ones.
struct Failure {
  std::exception_ptr error;
  std::int64_t seq = 0;  // the failed op's place in push order
  std::atomic<bool> observed{false};
};
using FailurePtr = std::shared_ptr<Failure>;

struct VarState;

// The fence that ends the latest work on GPU `gpu` that used a var.
struct GpuFence {
  int gpu = 0;
  FencePtr fence;
};
using GpuFences = std::vector<GpuFence>;

struct Dep {
  VarState* var = nullptr;
  OpRecord* op = nullptr;
  Dep* next = nullptr;  // the var's queue while waiting; the grant list once granted
  Waiter* waiter = nullptr;  // instead of op, for a wait
  // The var's failure when the Dep was granted. It cannot change while the
  // access lasts, so the op reads it here rather than from the var.
  FailurePtr failure{};
  bool write = false;
  bool read = false;  // the op consumes the var's value: it fails when the var has failed
};

// A thread blocked in wait_to_read/wait_to_write. Its Dep waits in the var's
// queue like an op's, but when its turn comes the var hands it the var's
// failure (in dep.failure) and passes on without granting it any access, so
// the woken thread need not touch the var again. A waiter may be reused, or
// its thread may exit, as soon as wait() returns: the signalling thread marks
// a sleeping waiter signalled only while holding the waiter's mutex, which the
// waiter must reacquire before it can see the mark, so the signaller is done
// with the waiter by then. (Marking it first and locking after would let a
// spurious wake-up return early and leave the signaller locking a mutex that
// may no longer exist.)
class Waiter {
 public:
  // On one cache line: what the signalling thread writes and the waiting
  // thread spins on.
  alignas(64) Dep dep{};

  void reset() noexcept { state_.store(idle, std::memory_order_relaxed); }

  void signal() noexcept {
    int expected = idle;
    if (state_.compare_exchange_strong(expected, signalled, std::memory_order_release, std::memory_order_relaxed))
      return;
    std::lock_guard g(mutex_);
    state_.store(signalled, std::memory_order_relaxed);
    cv_.notify_one();
  }

  void wait() {
    if (spin_helping_until([&] { return state_.load(std::memory_order_acquire) == signalled; })) return;
    std::unique_lock l(mutex_);
    int expected = idle;
    if (!state_.compare_exchange_strong(expected, sleeping, std::memory_order_acquire)) return;
    cv_.wait(l, [&] { return state_.load(std::memory_order_relaxed) == signalled; });
  }

 private:
  enum : int { idle, sleeping, signalled };
  std::atomic<int> state_{idle};
  std::mutex mutex_;
  std::condition_variable cv_;
};

// One per thread: a thread waits for one var at a time.
inline thread_local Waiter thread_waiter;

struct VarState {
  std::atomic<int> refs{1};
  SpinLock lock;
  Dep* head = nullptr;  // ops and waits queued for this var, in push order
  Dep* tail = nullptr;
  int readers = 0;      // granted reads not yet finished
  bool writer = false;  // a granted write not yet finished
  // Under lock: set as a write finishes, copied into each Dep as it is
  // granted (ops read that copy, not this).
  FailurePtr failure{};
  // Under lock: at most one per GPU. fenced: whether it may hold any (read
  // without the lock, so that a var no GPU op has used costs a CPU op nothing).
  GpuFences fences;
  std::atomic<bool> fenced{false};
  // Writes counted so far (Var::writes).
  std::atomic<std::uint64_t> writes{0};

  GpuFences gpu_fences() {
    std::lock_guard g(lock);
    return fences;
  }

  // After an op on a GPU that used the var: f ends its work. A write waited
  // for every other GPU's work on the var before it ran (nothing else used
  // the var meanwhile), so its fence is the only one left. The fences let
  // go of are destroyed after the lock is released.
  void add_fence(GpuFence f, bool write) {
    GpuFences dropped;
    std::lock_guard g(lock);
    fenced.store(true, std::memory_order_relaxed);
    if (write) dropped.swap(fences);
    for (GpuFence& held : fences)
      if (held.gpu == f.gpu) {
        std::swap(held.fence, f.fence);
        return;
      }
    fences.push_back(std::move(f));
  }

  void clear_fences() {
    GpuFences dropped;
    std::lock_guard g(lock);
    dropped.swap(fences);
    fenced.store(false, std::memory_order_relaxed);
  }

  void retain() noexcept { refs.fetch_add(1, std::memory_order_relaxed); }
  void release() noexcept {
    if (refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  // True when nothing that conflicts with a new read (write) is pending.
  bool free_for(bool write) const noexcept { return !head && !writer && (!write || readers == 0); }

  // Queues d, or grants it at once (true) when the queue is empty and the
  // access is compatible with the running ones.
  bool append(Dep* d) noexcept {
    std::lock_guard g(lock);
    if (free_for(d->write)) {
      grant(d);
      return true;
    }
    enqueue(d);
    return false;
  }

  // With lock held.
  void enqueue(Dep* d) noexcept {
    d->next = nullptr;
    (tail ? tail->next : head) = d;
    tail = d;
  }

  // Ends d's access, leaving `result` as the var's failure if d wrote it, and
  // returns the Deps whose turn this brings, chained through next: granted
  // op Deps, and wait Deps handed the var's failure.
  Dep* finish(const Dep* d, const FailurePtr& result) noexcept {
    std::lock_guard g(lock);
    if (d->write) {
      if (failure != result) failure = result;
      writer = false;
    } else {
      --readers;
    }
    Dep* turn = nullptr;
    Dep** link = &turn;
    while (head && free_for_front()) {
      Dep* front = head;
      head = front->next;
      if (!head) tail = nullptr;
      front->next = nullptr;
      *link = front;
      link = &front->next;
      if (front->waiter) {
        front->failure = failure;
        continue;
      }
      grant(front);
      if (front->write) break;
    }
    return turn;
  }

 private:
  // Called with no write running (finish ended it, or the loop stops at one).
  bool free_for_front() const noexcept { return !head->write || readers == 0; }
  void grant(Dep* d) noexcept {
    if (d->write) {
      writer = true;
      writes.fetch_add(1, std::memory_order_relaxed);
    } else {
      ++readers;
    }
    if (d->failure != failure) d->failure = failure;
  }
};

}  // namespace detail

// A handle naming one piece of mutable state. Copies name the same state;
// the state lives until the last handle and the last op using it are gone.
class Var {
 public:
  Var() : s_(new detail::VarState) {}
  Var(const Var& o) noexcept : s_(o.s_) {
    if (s_) s_->retain();
  }
  Var(Var&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  Var& operator=(Var o) noexcept {
    std::swap(s_, o.s_);
    return *this;
  }
  ~Var() {
    if (s_) s_->release();
  }

  friend bool operator==(const Var& a, const Var& b) noexcept { return a.s_ == b.s_; }

  // The fences of the latest GPU work that used the var, one per GPU.
  detail::GpuFences gpu_fences() const { return state("gpu_fences")->gpu_fences(); }

  // How many times the var's state may have been written: every write an op
  // was granted, every wait_to_write (its caller may write next), and every
  // write of an op run inside another op (count_write). Whoever reads the
  // state and finds the count unchanged since an earlier read knows the
  // bytes are the same, as long as nothing writes them unseen (a pointer
  // kept past its op: Tensor::data<T>).
  std::uint64_t writes() const { return state("writes")->writes.load(std::memory_order_acquire); }
  void count_write() const { state("count_write")->writes.fetch_add(1, std::memory_order_acq_rel); }

 private:
  friend class Engine;
  detail::VarState* state(const char* what) const {
    if (!s_) fail<ValueError>(what, ": the engine var is empty (moved-from)");
    return s_;
  }
  detail::VarState* s_;
};

// The vars an op reads or writes: a braced list, a vector or a span of Vars,
// viewed for the duration of the call they are passed to.
class Vars {
 public:
  Vars() = default;
  Vars(std::initializer_list<Var> vars) : vars_(std::data(vars), vars.size()) {}
  Vars(std::span<const Var> vars) : vars_(vars) {}
  Vars(const std::vector<Var>& vars) : vars_(vars) {}

  const Var* begin() const { return vars_.data(); }
  const Var* end() const { return vars_.data() + vars_.size(); }
  std::size_t size() const { return vars_.size(); }

 private:
  std::span<const Var> vars_;
};

}  // namespace hybra::engine
