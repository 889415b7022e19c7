#pragma once
// A CUDA graph: the kernels and copies that some code queues on a GPU's
// stream, recorded once (nothing runs while recording) and then replayed by
// one launch. Replaying skips the host's work per kernel (arguments, launch
// calls: a few microseconds each), which is most of a small model's time.
// A replay reads and writes the very addresses the recording saw, so what
// is recorded must use memory that outlives the graph.
#include <utility>

#include "gpu.hpp"

namespace hybra::backend::cuda {

class StreamGraph {
 public:
  StreamGraph() = default;
  StreamGraph(const StreamGraph&) = delete;
  StreamGraph& operator=(const StreamGraph&) = delete;
  StreamGraph(StreamGraph&& o) noexcept : gpu_(std::exchange(o.gpu_, nullptr)), exec_(std::exchange(o.exec_, nullptr)) {}
  StreamGraph& operator=(StreamGraph&& o) noexcept {
    std::swap(gpu_, o.gpu_);
    std::swap(exec_, o.exec_);
    return *this;
  }
  ~StreamGraph() {
    if (exec_) gpu_->driver().cuGraphExecDestroy(exec_);
  }

  // Records what record() queues on gpu's stream. Thread-local capture: the
  // calling thread may not allocate device memory or synchronise meanwhile
  // (the driver refuses), other threads are unaffected.
  template <class F>
  static StreamGraph capture(Gpu& gpu, F&& record) {
    const Driver& cu = gpu.driver();
    gpu.bind();
    cu.check(cu.cuStreamBeginCapture(gpu.stream(), constant::capture_mode_thread_local), "cuStreamBeginCapture");
    CUgraph graph = nullptr;
    try {
      std::forward<F>(record)();
    } catch (...) {
      if (cu.cuStreamEndCapture(gpu.stream(), &graph) == constant::success && graph) cu.cuGraphDestroy(graph);
      throw;
    }
    cu.check(cu.cuStreamEndCapture(gpu.stream(), &graph), "cuStreamEndCapture");
    StreamGraph g;
    g.gpu_ = &gpu;
    const CUresult made = cu.cuGraphInstantiateWithFlags(&g.exec_, graph, 0);
    cu.cuGraphDestroy(graph);  // the instantiated graph is a copy
    cu.check(made, "cuGraphInstantiateWithFlags");
    return g;
  }

  explicit operator bool() const { return exec_ != nullptr; }

  // Queues one replay on the stream.
  void launch() const {
    const Driver& cu = gpu_->driver();
    cu.check(cu.cuGraphLaunch(exec_, gpu_->stream()), "cuGraphLaunch");
  }

 private:
  Gpu* gpu_ = nullptr;
  CUgraphExec exec_ = nullptr;
};

}  // namespace hybra::backend::cuda
