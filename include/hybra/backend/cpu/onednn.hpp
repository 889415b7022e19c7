#pragma once
// oneDNN (Debian's libdnnl 2.6), the library MXNet and PyTorch run their CPU
// convolutions on: built in where CMake finds it (HYBRA_WITH_ONEDNN, the
// option HYBRA_ONEDNN), and called only for the shapes where it measured
// faster than hybra's own kernels. Every caller keeps its own kernel for the
// other shapes and for builds without oneDNN. This file is the plumbing its
// callers share: one engine, a stream per thread, the thread count, a cache
// of primitives, buffers per thread, weights kept in oneDNN's layout with
// their storage, and its errors as hybra's.
//
// Threads: oneDNN's OpenMP runtime sizes a primitive's work split for the
// calling thread's OpenMP thread count when it creates the primitive, and
// runs it on that many. ThreadCount sets that count to the op's share of the
// cores (available_threads) around a call, and callers key their cached
// primitives by it.
//
// nvcc's front end fails on oneDNN's C++ header, so translation units nvcc
// compiles leave it out (HYBRA_ONEDNN_CALLS stays undefined there) and run
// hybra's own convolution kernels. (A program that links such units with
// g++-compiled ones may then run either kernel for a float32 convolution:
// both are right, but their roundings differ.)
#if defined(HYBRA_WITH_ONEDNN) && !defined(__CUDACC__)
#define HYBRA_ONEDNN_CALLS 1
#ifndef _OPENMP
#error "hybra calls oneDNN only with OpenMP (HYBRA_OPENMP): oneDNN's runtime here is libgomp"
#endif
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string_view>
#include <utility>

#include "../../core/error.hpp"
#include "../../core/setting.hpp"
#include "../../core/storage.hpp"
#include "host_memory.hpp"
#include "threads.hpp"

namespace hybra::backend::cpu::onednn {

// HYBRA_ONEDNN in the environment, read once: 0 turns oneDNN off, so every
// op runs on hybra's own kernels; `always` gives oneDNN every shape it can
// take, where it did not measure faster; 1 (or unset) is each caller's rule.
// The other two are for comparing the two (the tables behind each rule), or
// ruling one out.
enum class Use { off, where_faster, always };
inline Use parse_use(std::string_view value) {
  return parse_setting<Use>("oneDNN", "HYBRA_ONEDNN", value,
                            {{"1", Use::where_faster}, {"0", Use::off}, {"always", Use::always}});
}
inline Use use() {
  static const Use setting = [] {
    const char* value = std::getenv("HYBRA_ONEDNN");
    return parse_use(value ? value : "");
  }();
  return setting;
}
inline bool enabled() { return use() != Use::off; }

// Whether oneDNN runs its AVX-512 kernels on this CPU (DNNL_MAX_CPU_ISA can
// lower what it finds). Below AVX-512 its NHWC convolutions run slower than
// its blocked ones (ops/conv_onednn.hpp).
inline bool avx512() {
  static const bool wide = [] {
    using isa = dnnl::cpu_isa;
    switch (dnnl::get_effective_cpu_isa()) {
      case isa::sse41:
      case isa::avx:
      case isa::avx2:
      case isa::avx2_vnni: return false;
      default: return true;
    }
  }();
  return wide;
}

inline dnnl::engine& engine() {
  static dnnl::engine cpu(dnnl::engine::kind::cpu, 0);
  return cpu;
}

// oneDNN's CPU stream runs primitives on the thread that executes them; one
// per thread keeps the engine's threads from sharing one.
inline dnnl::stream& stream() {
  thread_local dnnl::stream in_order(engine());
  return in_order;
}

// Sets the calling thread's OpenMP thread count, which oneDNN reads, for a
// scope.
class ThreadCount {
 public:
  explicit ThreadCount(int threads) : saved_(omp_get_max_threads()), region_(begin_parallel_region(threads)) {
    omp_set_num_threads(threads);
  }
  ~ThreadCount() { omp_set_num_threads(saved_); }
  ThreadCount(const ThreadCount&) = delete;
  ThreadCount& operator=(const ThreadCount&) = delete;

 private:
  int saved_;
  engine::detail::ParallelRegion region_;
};

// Primitives by key, created once (a primitive descriptor's creation walks
// oneDNN's implementations and generates code: far more than a call costs).
// Entries live as long as the program, like the kernel cache of the GPU.
template <class Key, class Value>
class Cache {
 public:
  template <class Make>
  const Value& get(const Key& key, Make&& make) {
    std::lock_guard lock(mutex_);
    auto found = entries_.find(key);
    if (found == entries_.end()) found = entries_.emplace(key, std::make_unique<Value>(make())).first;
    return *found->second;
  }

 private:
  std::mutex mutex_;
  std::map<Key, std::unique_ptr<Value>> entries_;
};

// Primitives made with this attribute take their scratchpad from the caller.
// oneDNN's own scratchpad is shared by the primitives one thread made, so a
// cached primitive run on another thread (another device's worker, a loop's
// team) would write it while its maker runs a second one: wrong results,
// without an error. Callers give each call the running thread's buffer.
inline dnnl::primitive_attr scratchpad_from_caller() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// The calling thread's buffer `slot` (0 to 3, each caller's to assign) as
// memory of `layout`, kept from call to call: a buffer allocated per call
// costs its page faults on every call (a ResNet layer's activations are
// megabytes). It is as large as the largest layout the thread has needed
// in that slot.
inline dnnl::memory thread_buffer(int slot, const dnnl::memory::desc& layout) {
  struct Buffer {
    std::unique_ptr<void, decltype(&std::free)> bytes{nullptr, &std::free};
    std::size_t size = 0;
  };
  thread_local std::array<Buffer, 4> buffers;
  Buffer& b = buffers.at(static_cast<std::size_t>(slot));
  if (const std::size_t need = layout.get_size(); need > b.size) {
    b.bytes.reset();
    b.size = 0;
    b.bytes.reset(std::aligned_alloc(64, (need + 63) / 64 * 64));
    if (!b.bytes) throw std::bad_alloc();
    b.size = need;
  }
  return {layout, engine(), b.bytes.get()};
}

// Host memory of its own for a layout, from HostMemory: a training step
// writes its weights, so each step derives their blocked copies again, and
// memory fresh from malloc would fault in and zero a page at every 4 KiB of
// each copy first (docs/benchmarks.md, "Weights' blocked copies in kept
// memory").
class OwnMemory {
 public:
  explicit OwnMemory(const dnnl::memory::desc& layout)
      : block_(HostMemory::instance().allocate(rounded(layout.get_size()))) {
    if (!block_.pointer) throw std::bad_alloc();
    memory_ = dnnl::memory(layout, engine(), block_.pointer);
  }
  ~OwnMemory() { HostMemory::instance().release(block_.pointer, block_.bytes); }
  OwnMemory(const OwnMemory&) = delete;
  OwnMemory& operator=(const OwnMemory&) = delete;
  const dnnl::memory& memory() const { return memory_; }

 private:
  static std::size_t rounded(std::size_t bytes) {
    constexpr std::size_t a = HostMemory::alignment;
    return (std::max<std::size_t>(bytes, 1) + a - 1) / a * a;
  }
  HostMemory::Block block_;
  dnnl::memory memory_;
};

// Weights in the layout `desc` that a primitive reads, derived from plain
// weights at `offset` bytes into their storage.
struct KeptWeights {
  KeptWeights(std::ptrdiff_t at, const dnnl::memory::desc& layout) : offset(at), desc(layout), blocked(layout) {}
  std::ptrdiff_t offset;
  dnnl::memory::desc desc;
  OwnMemory blocked;
};

// `data` as a memory of `want`'s layout: itself, or a reordered copy in the
// thread's buffer `slot`.
inline dnnl::memory in_layout(const dnnl::memory::desc& want, dnnl::memory data, int slot) {
  if (want == data.get_desc()) return data;
  dnnl::memory copy = thread_buffer(slot, want);
  dnnl::reorder(data, copy).execute(stream(), data, copy);
  return copy;
}

// Weights as a primitive reads them, and the copy that holds their memory
// (null where `memory` is the plain weights): the caller keeps this while
// the primitive runs, as the storage may drop its copy at any time (a write,
// a pointer handed out, another layout kept in its place).
struct WeightsInLayout {
  dnnl::memory memory;
  std::shared_ptr<const KeptWeights> copy;
};

// `plain` (whose data is w, in `storage`) in the layout `want`: the copy
// kept with the storage while its bytes stay unchanged
// (core/derived_forms.hpp), or, where there is no storage to keep it with,
// `plain` itself, for the caller to reorder per call (in_layout).
inline WeightsInLayout kept_weights(const dnnl::memory::desc& want, const dnnl::memory& plain, const void* w,
                                    Storage* storage) {
  if (!storage || want == plain.get_desc()) return {plain, nullptr};
  const std::ptrdiff_t offset = static_cast<const char*>(w) - static_cast<const char*>(storage->data());
  auto kept = storage->derived<KeptWeights>(
      [&](const KeptWeights& f) { return f.offset == offset && f.desc == want; },
      [&] {
        auto made = std::make_shared<KeptWeights>(offset, want);
        dnnl::memory from = plain, to = made->blocked.memory();
        dnnl::reorder(from, to).execute(stream(), from, to);
        stream().wait();
        return made;
      });
  return {kept->blocked.memory(), std::move(kept)};
}

// Runs `call`, rethrowing oneDNN's errors (and a failed allocation) as
// hybra's, named by op.
template <class Call>
decltype(auto) guarded(std::string_view op, Call&& call) {
  try {
    return call();
  } catch (const std::bad_alloc&) {
    fail<OutOfMemory>(op, ": out of memory for oneDNN's operands");
  } catch (const dnnl::error& e) {
    if (e.status == dnnl_out_of_memory) fail<OutOfMemory>(op, ": out of memory in oneDNN");
    fail<Error>(op, ": oneDNN failed: ", e.what());
  }
}

// Runs part(s) for s in [0, parts) over the op's threads, each part on one
// thread and one oneDNN thread: a work split fixed by the caller's cut, not
// by the thread count, so that results do not depend on it. `cost` is one
// part's work (parallel_for's). A part's error is rethrown on the calling
// thread, the first one only; the parts after it are skipped.
template <class Part>
void for_each_part(std::string_view op, std::int64_t parts, std::int64_t cost, Part&& part) {
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  parallel_for(parts, cost, [&](std::int64_t first, std::int64_t last) {
    ThreadCount one(1);
    for (std::int64_t s = first; s < last && !failed.load(std::memory_order_relaxed); ++s) {
      try {
        guarded(op, [&] { part(s); });
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!failed.exchange(true)) error = std::current_exception();
      }
    }
  });
  if (error) std::rethrow_exception(error);
}

}  // namespace hybra::backend::cpu::onednn

#endif
