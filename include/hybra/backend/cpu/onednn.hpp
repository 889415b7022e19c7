#pragma once
// oneDNN (Debian's libdnnl 2.6), the library MXNet and PyTorch run their CPU
// convolutions on: built in where CMake finds it (HYBRA_WITH_ONEDNN, the
// option HYBRA_ONEDNN), and called only for the shapes where it measured
// faster than hybra's own kernels. Every caller keeps its own kernel for the
// other shapes and for builds without oneDNN. This file is the plumbing its
// callers share: one engine, a stream per thread, the thread count, a cache
// of primitives, and its errors as hybra's.
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

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string_view>
#include <utility>

#include "../../core/error.hpp"
#include "threads.hpp"

namespace hybra::backend::cpu::onednn {

// HYBRA_ONEDNN in the environment, read once: 0 turns oneDNN off, so every
// op runs on hybra's own kernels; `always` gives oneDNN every shape it can
// take, where it did not measure faster; 1 (or unset) is each caller's rule.
// The other two are for comparing the two (the tables behind each rule), or
// ruling one out.
enum class Use { off, where_faster, always };
inline Use parse_use(std::string_view value) {
  if (value.empty() || value == "1") return Use::where_faster;
  if (value == "0") return Use::off;
  if (value == "always") return Use::always;
  fail<ValueError>("oneDNN: HYBRA_ONEDNN=", value, " is not a setting; use 0, 1 or always");
}
inline Use use() {
  static const Use setting = [] {
    const char* value = std::getenv("HYBRA_ONEDNN");
    return parse_use(value ? value : "");
  }();
  return setting;
}
inline bool enabled() { return use() != Use::off; }

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
  explicit ThreadCount(int threads) : saved_(omp_get_max_threads()) { omp_set_num_threads(threads); }
  ~ThreadCount() { omp_set_num_threads(saved_); }
  ThreadCount(const ThreadCount&) = delete;
  ThreadCount& operator=(const ThreadCount&) = delete;

 private:
  int saved_;
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

}  // namespace hybra::backend::cpu::onednn

#endif
