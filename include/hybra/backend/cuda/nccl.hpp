#pragma once
// NCCL, loaded at run time (library.hpp): collectives between GPUs, on their
// streams. parallel/allreduce.hpp sums one tensor per GPU with it (all the
// GPUs of one process), and parallel/mpi.hpp sums a GPU tensor over
// processes with it.
//
// The library is libnccl.so.2 (where cuda_library_candidates looks), or the file $HYBRA_NCCL names (the tests point it
// at a stand-in, tests/fake_cuda). HYBRA_NCCL=0 turns NCCL off: GPUs are
// then summed by copies and kernels.
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../../core/dtype.hpp"
#include "gpu.hpp"

namespace hybra::backend::cuda {

namespace handle {
struct ncclComm;
}
using ncclComm_t = handle::ncclComm*;
using ncclResult_t = int;
struct ncclUniqueId {
  char internal[128];
};

class Nccl {
 public:
  Nccl() : library_(open()) {
    if (!library_.loaded()) return;
    get_version = library_.function<decltype(get_version)>("ncclGetVersion");
    get_unique_id = library_.function<decltype(get_unique_id)>("ncclGetUniqueId");
    comm_init_rank = library_.function<decltype(comm_init_rank)>("ncclCommInitRank");
    comm_init_all = library_.function<decltype(comm_init_all)>("ncclCommInitAll");
    comm_destroy = library_.function<decltype(comm_destroy)>("ncclCommDestroy");
    all_reduce = library_.function<decltype(all_reduce)>("ncclAllReduce");
    group_start = library_.function<decltype(group_start)>("ncclGroupStart");
    group_end = library_.function<decltype(group_end)>("ncclGroupEnd");
    error_string_ = library_.function<decltype(error_string_)>("ncclGetErrorString");
  }

  bool loaded() const { return library_.loaded(); }
  const std::string& problem() const { return problem_.empty() ? library_.error() : problem_; }

  void check(ncclResult_t r, std::string_view call) const {
    if (r == 0) return;
    const char* text = error_string_ ? error_string_(r) : nullptr;
    fail<DeviceError>("NCCL: ", call, " failed: ", text ? text : "", " (ncclResult_t ", r, ")");
  }

  // NCCL's code for a dtype (ncclUint8, ncclInt32, ncclInt64, ncclFloat32, ncclFloat64, ncclFloat16,
  // ncclBfloat16).
  static int datatype(DType d) {
    switch (d) {
      case DType::uint8: return 1;
      case DType::int32: return 2;
      case DType::int64: return 4;
      case DType::float32: return 7;
      case DType::float64: return 8;
      case DType::float16: return 6;
      case DType::bfloat16: return 9;
    }
    fail<DTypeError>("NCCL: invalid dtype code ", static_cast<int>(d));
  }
  static constexpr int sum = 0;  // ncclSum

  ncclResult_t (*get_version)(int*) = nullptr;
  ncclResult_t (*get_unique_id)(ncclUniqueId*) = nullptr;
  ncclResult_t (*comm_init_rank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  ncclResult_t (*comm_init_all)(ncclComm_t*, int, const int*) = nullptr;
  ncclResult_t (*comm_destroy)(ncclComm_t) = nullptr;
  ncclResult_t (*all_reduce)(const void*, void*, std::size_t, int, int, ncclComm_t, CUstream) = nullptr;
  ncclResult_t (*group_start)() = nullptr;
  ncclResult_t (*group_end)() = nullptr;

 private:
  SharedLibrary open() {
    const char* file = std::getenv("HYBRA_NCCL");
    if (file && std::string_view(file) == "0") {
      problem_ = "NCCL is turned off (HYBRA_NCCL=0)";
      return {};
    }
    if (file && *file) return SharedLibrary({file});
    return SharedLibrary(cuda_library_candidates({"libnccl.so.2"}));
  }

  std::string problem_;
  SharedLibrary library_;
  const char* (*error_string_)(ncclResult_t) = nullptr;
};

// Never destroyed, like the driver: communicators live for the process.
inline const Nccl& nccl_library() {
  static const Nccl& library = *new Nccl;
  return library;
}

// Whether collectives between GPUs go through NCCL: it loads, and is not
// turned off.
inline bool nccl_available() { return nccl_library().loaded(); }

inline const Nccl& nccl() {
  const Nccl& library = nccl_library();
  if (!library.loaded()) fail<DeviceError>("NCCL could not be loaded: ", library.problem());
  return library;
}

// One communicator per GPU of `gpus` (distinct ids), made at first use by
// ncclCommInitAll and kept for the process.
inline const std::vector<ncclComm_t>& nccl_communicators(std::span<const int> gpus) {
  static std::mutex& mutex = *new std::mutex;
  static auto& made = *new std::map<std::vector<int>, std::vector<ncclComm_t>>;
  const Nccl& n = nccl();
  std::lock_guard g(mutex);
  std::vector<int> key(gpus.begin(), gpus.end());
  auto it = made.find(key);
  if (it == made.end()) {
    std::vector<ncclComm_t> comms(key.size());
    n.check(n.comm_init_all(comms.data(), static_cast<int>(key.size()), key.data()), "ncclCommInitAll");
    finish_gpu_work_first();
    it = made.emplace(std::move(key), std::move(comms)).first;
  }
  return it->second;
}

// Sums count elements of `dtype` in place across the GPUs, at buffers[k] on
// gpus[k], queued on each GPU's stream as one NCCL group; then waits for
// every stream but that of gpus[0] (whose engine op waits for its own).
inline void nccl_allreduce(std::span<const int> gpus, std::span<void* const> buffers, std::size_t count, DType dtype,
                           std::string_view what) {
  const Nccl& n = nccl();
  const auto& comms = nccl_communicators(gpus);
  n.check(n.group_start(), "ncclGroupStart");
  for (std::size_t k = 0; k < gpus.size(); ++k) {
    Gpu& g = gpu(gpus[k]);
    const ncclResult_t r =
        n.all_reduce(buffers[k], buffers[k], count, Nccl::datatype(dtype), Nccl::sum, comms[k], g.stream());
    if (r != 0) {
      n.group_end();
      n.check(r, "ncclAllReduce");
    }
  }
  n.check(n.group_end(), "ncclGroupEnd");
  for (std::size_t k = 1; k < gpus.size(); ++k) gpu(gpus[k]).synchronize(hybra::detail::concat("of op '", what, "'"));
}

}  // namespace hybra::backend::cuda
