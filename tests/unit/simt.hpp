#pragma once
// Runs kernels/ device code on the CPU, so that tests check what the GPU's
// reductions and softmax compute on machines without a GPU: a block's
// threads are std::threads that meet at a barrier for __syncthreads,
// __shared__ arrays are function statics (one block runs at a time), and the
// blocks of a launch run one after another.
//
// Include it before any kernels/ file and in a translation unit of its own:
// it defines CUDA's keywords as macros.
#include <atomic>
#include <barrier>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <latch>
#include <math.h>
#include <mutex>
#include <thread>
#include <vector>

struct simt_dim3 {
  unsigned x = 1, y = 1, z = 1;
};
inline thread_local simt_dim3 threadIdx, blockIdx;
inline simt_dim3 blockDim, gridDim;

namespace simt {
inline std::barrier<>* block_barrier = nullptr;

// The threads that play a block's, kept from launch to launch (thousands of
// launches would otherwise spend their time starting threads).
class Team {
 public:
  static Team& get() {
    static Team team;
    return team;
  }

  template <class Kernel>
  void launch(unsigned blocks, unsigned threads, Kernel& kernel) {
    std::unique_lock lock(mutex_);
    while (workers_.size() < threads)
      workers_.emplace_back([this, t = static_cast<unsigned>(workers_.size())] { work(t); });
    blockDim = {threads};
    gridDim = {blocks};
    std::barrier<> barrier(threads);
    std::latch done(threads);
    block_barrier = &barrier;
    job_ = [&, blocks](unsigned t) {
      threadIdx = {t};
      for (unsigned b = 0; b < blocks; ++b) {
        blockIdx = {b};
        kernel();
        barrier.arrive_and_wait();  // the block's __shared__ statics are the next block's
      }
      done.count_down();
    };
    active_ = threads;
    ++generation_;
    lock.unlock();
    wake_.notify_all();
    done.wait();
  }

  ~Team() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& w : workers_) w.join();
  }

 private:
  void work(unsigned t) {
    std::uint64_t seen = 0;
    for (;;) {
      std::function<void(unsigned)> job;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        if (t >= active_) continue;
        job = job_;
      }
      job(t);
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::thread> workers_;
  std::function<void(unsigned)> job_;
  unsigned active_ = 0;
  std::uint64_t generation_ = 0;
  bool stop_ = false;
};

// kernel() on `blocks` blocks of `threads` threads, as a launch would run it.
template <class Kernel>
void launch(unsigned blocks, unsigned threads, Kernel kernel) {
  Team::get().launch(blocks, threads, kernel);
}
}  // namespace simt

#define __device__
#define __shared__ static
#define __syncthreads() simt::block_barrier->arrive_and_wait()
// The kernels' warps make the same turns as their block (reduce.cuh), so a
// warp's barrier can be the block's.
#define __syncwarp() simt::block_barrier->arrive_and_wait()

// CUDA's atomics, on the simulated threads' shared memory.
template <class T>
T atomicAdd(T* address, T value) {
  return std::atomic_ref<T>(*address).fetch_add(value);
}
inline unsigned int atomicCAS(unsigned int* address, unsigned int compare, unsigned int value) {
  std::atomic_ref<unsigned int>(*address).compare_exchange_strong(compare, value);
  return compare;
}
