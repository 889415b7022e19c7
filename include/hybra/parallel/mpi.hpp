#pragma once
// hybra across processes, over MPI: one process per machine (or per socket),
// each training a copy of the model on its own devices, their gradients
// summed by allreduce. Not included by hybra.hpp: a program that includes it
// links the CMake target hybra::mpi (hybra::hybra plus MPI, and
// HYBRA_WITH_MPI=1 for code that uses MPI only when it is there).
//
//   hybra::mpi::Environment env(argc, argv);   // MPI_Init_thread ... MPI_Finalize
//   hybra::mpi::Communicator world;            // MPI_COMM_WORLD's processes
//   world.allreduce(grad);                     // queued: sums grad over the processes
//
// Every MPI call hybra makes on a communicator is an engine op that writes
// one process-wide token (detail::sequence()). Ops writing one var run in the order they were
// queued, so the collectives run one at a time and in the program's order,
// which is the same on every process: what MPI requires, though the engine
// is free to reorder ops on unrelated tensors. They run on the engine's
// workers, so MPI must provide MPI_THREAD_SERIALIZED (one call at a time,
// from any thread) or more. A collective also waits for the tensor's pending
// writes, so it overlaps with work queued on other tensors, as a local
// allreduce (parallel/allreduce.hpp) does.
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <span>
#include <string_view>
#include <utility>

#include "../backend/cuda/nccl.hpp"
#include "../expr/evaluate.hpp"

namespace hybra::mpi {

namespace detail {

// An MPI error code as a hybra::Error naming the call and MPI's own words.
inline void check(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    fail("mpi: ", call, " failed with MPI error code ", code);
  fail("mpi: ", call, " failed: ", std::string_view(text, static_cast<std::size_t>(length)));
}

// The token every MPI op writes (see the top of this file).
inline const Tensor& sequence() {
  static const Tensor token(Shape{}, DType::uint8, cpu());
  return token;
}

// Queues fn as the next MPI op and waits for it, rethrowing its failure.
template <class F>
void run_now(const char* name, F fn) {
  push_op(name, {}, {sequence()}, std::move(fn));
  sequence().wait_to_write();
}

inline MPI_Datatype datatype(DType d) {
  switch (d) {
    case DType::float32: return MPI_FLOAT;
    case DType::float64: return MPI_DOUBLE;
    case DType::int32: return MPI_INT32_T;
    case DType::int64: return MPI_INT64_T;
    case DType::uint8: return MPI_UINT8_T;
    case DType::float16:
    case DType::bfloat16: return MPI_UINT16_T;  // moved as bits; sums go through float32
  }
  fail<DTypeError>("mpi: invalid dtype code ", static_cast<int>(d));
}

// Calls call(pointer, count) over t's contiguous elements in pieces of at
// most INT_MAX, MPI's largest count.
template <class Call>
void in_pieces(const Tensor& t, Call call) {
  char* p = static_cast<char*>(t.raw_data());
  const std::int64_t n = t.size();
  for (std::int64_t done = 0; done < n;) {
    const int count = static_cast<int>(std::min<std::int64_t>(n - done, INT_MAX));
    call(p + done * static_cast<std::int64_t>(size_of(t.dtype())), count);
    done += count;
  }
}

inline const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown thread level";
}

}  // namespace detail

// MPI for the life of the object: MPI_Init_thread asking for
// MPI_THREAD_MULTIPLE (so the program's own MPI calls may run beside
// hybra's), accepting MPI_THREAD_SERIALIZED; MPI_Finalize, after hybra's
// queued MPI ops, on destruction. Where MPI was already initialised (by the
// program or another library) it only checks the thread level and leaves
// finalising to whoever initialised. Create it first and destroy it last: in
// main, before any Communicator.
class Environment {
 public:
  Environment() : Environment(nullptr, nullptr) {}
  Environment(int& argc, char**& argv) : Environment(&argc, &argv) {}
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;

  ~Environment() {
    if (!owner_) return;
    // Leaving because of an exception: the other processes may be waiting
    // in a collective this one will never join, and MPI_Finalize would wait
    // for them forever. Exiting without it lets the exception be reported
    // and the launcher end the job.
    if (std::uncaught_exceptions() > uncaught_at_start_) return;
    try {
      // Nothing may call MPI after MPI_Finalize: let the queued MPI ops run first.
      detail::run_now("mpi::Environment: finish queued MPI ops", [] {});
    } catch (const Error&) {
      // The engine was shut down, which ran every queued op.
    }
    MPI_Finalize();  // on the thread that initialised MPI, as MPI requires
  }

  // The thread level MPI provides (MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE).
  int thread_level() const { return thread_level_; }

 private:
  Environment(int* argc, char*** argv) {
    int finalized = 0, initialized = 0;
    detail::check(MPI_Finalized(&finalized), "MPI_Finalized");
    if (finalized) fail("mpi::Environment: MPI was finalised already and cannot be initialised again");
    detail::check(MPI_Initialized(&initialized), "MPI_Initialized");
    if (initialized) {
      detail::check(MPI_Query_thread(&thread_level_), "MPI_Query_thread");
    } else {
      detail::check(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &thread_level_), "MPI_Init_thread");
      owner_ = true;
    }
    if (thread_level_ < MPI_THREAD_SERIALIZED) {
      if (owner_) MPI_Finalize();
      fail("mpi::Environment: MPI provides ", detail::thread_level_name(thread_level_),
           ", but hybra calls MPI from its engine's threads and needs MPI_THREAD_SERIALIZED or "
           "MPI_THREAD_MULTIPLE");
    }
  }

  bool owner_ = false;
  int thread_level_ = MPI_THREAD_SINGLE;
  int uncaught_at_start_ = std::uncaught_exceptions();
};

// A group of processes that sum and share tensors: a duplicate of `base`
// (MPI_COMM_WORLD by default), so hybra's messages never match the
// program's own on `base`, with MPI_ERRORS_RETURN so that every MPI error
// becomes an exception naming the call. Constructing and destroying it are
// collective: every process of `base` does both, in the same order relative
// to its other collectives.
//
// allreduce and broadcast are queued (see the top of this file): the call
// returns at once and the tensor is a future, like any op's result. An op
// failure on one process (the tensor's own computation failed) skips its
// collective there while the others wait in theirs; that process sees the
// failure at its next sync point and must end, which ends the job
// (mpirun stops every process when one exits with an error).
class Communicator {
 public:
  explicit Communicator(MPI_Comm base = MPI_COMM_WORLD) {
    int initialized = 0;
    detail::check(MPI_Initialized(&initialized), "MPI_Initialized");
    if (!initialized) fail("mpi::Communicator: MPI is not initialised; create an mpi::Environment first");
    detail::run_now("MPI_Comm_dup", [this, base] {
      detail::check(MPI_Comm_dup(base, &comm_), "MPI_Comm_dup");
      detail::check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
      detail::check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
      detail::check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    });
  }
  Communicator(Communicator&& other) noexcept
      : comm_(std::exchange(other.comm_, MPI_COMM_NULL)),
        nccl_comms_(std::move(other.nccl_comms_)),
        rank_(other.rank_),
        size_(other.size_) {}
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  Communicator& operator=(Communicator&&) = delete;

  // Queues the communicator's release (and its NCCL communicators') after
  // its pending collectives.
  ~Communicator() {
    if (comm_ == MPI_COMM_NULL) return;
    try {
      for (const auto& [id, nccl_comm] : nccl_comms_)
        push_op("ncclCommDestroy", {}, {detail::sequence()}, [nccl_comm] {
          const auto& n = backend::cuda::nccl();
          n.check(n.comm_destroy(nccl_comm), "ncclCommDestroy");
        });
      push_op("MPI_Comm_free", {}, {detail::sequence()}, [comm = comm_]() mutable {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) detail::check(MPI_Comm_free(&comm), "MPI_Comm_free");
      });
    } catch (const Error&) {
      // The engine was shut down: the handle is left to MPI_Finalize.
    }
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm handle() const { return comm_; }

  // Waits until every process has reached its barrier and this process's
  // queued collectives have run.
  void barrier() const {
    require_open("barrier");
    detail::run_now("MPI_Barrier", [comm = comm_] { detail::check(MPI_Barrier(comm), "MPI_Barrier"); });
  }

  // Sums t in place over the processes: afterwards every process's t holds
  // the elementwise sum of all of them. Every process passes a tensor of the
  // same shape and dtype. Queued; ordered after t's pending writes. A tensor
  // on a GPU is summed by NCCL, over one communicator per GPU id that every
  // process makes at its first allreduce on that id (so every process sums
  // on GPUs of the same ids); without NCCL it goes through the host.
  void allreduce(const Tensor& t) const {
    require_open("allreduce");
    if (t.require("allreduce").device().kind == DeviceKind::cuda) {
      if (backend::cuda::nccl_available()) return nccl_allreduce(t);
      const Tensor staged = t.to(cpu());
      allreduce(staged);
      return staged.copy_to(t);
    }
    if (is_half(t.dtype())) {  // MPI has no 16-bit float to sum
      const Tensor wide = t.astype(DType::float32);
      allreduce(wide);
      return wide.astype(t.dtype()).copy_to(t);
    }
    const Tensor buffer = contiguous_buffer(t, "allreduce");
    const MPI_Datatype type = detail::datatype(t.dtype());
    push_op("MPI_Allreduce", {buffer}, {buffer, detail::sequence()}, [comm = comm_, buffer, type] {
      detail::in_pieces(buffer, [&](void* p, int count) {
        detail::check(MPI_Allreduce(MPI_IN_PLACE, p, count, type, MPI_SUM, comm), "MPI_Allreduce");
      });
    });
    if (buffer.storage() != t.storage()) buffer.copy_to(t);
  }
  // Each tensor summed over the processes on its own, in the span's order:
  // one parameter's gradient after another.
  void allreduce(std::span<const Tensor> tensors) const {
    for (const Tensor& t : tensors) allreduce(t);
  }

  // Copies root's t into every other process's t (same shape and dtype
  // everywhere). Queued.
  void broadcast(const Tensor& t, int root = 0) const {
    require_open("broadcast");
    if (root < 0 || root >= size_)
      fail<ValueError>("mpi broadcast: root ", root, " is out of range for ", size_, " processes (tensor of shape ",
                       to_string(t.require("broadcast").shape()), ")");
    if (t.device().kind == DeviceKind::cuda) {  // through the host
      const Tensor staged = t.to(cpu());
      broadcast(staged, root);
      return staged.copy_to(t);
    }
    const Tensor buffer = contiguous_buffer(t, "broadcast");
    const MPI_Datatype type = detail::datatype(t.dtype());
    push_op("MPI_Bcast", {buffer}, {buffer, detail::sequence()}, [comm = comm_, buffer, type, root] {
      detail::in_pieces(buffer, [&](void* p, int count) {
        detail::check(MPI_Bcast(p, count, type, root, comm), "MPI_Bcast");
      });
    });
    if (buffer.storage() != t.storage()) buffer.copy_to(t);
  }

 private:
  void require_open(const char* op) const {
    if (comm_ == MPI_COMM_NULL) fail<ValueError>("mpi ", op, ": the communicator was moved from");
  }

  // MPI reads and writes contiguous memory: a strided view goes through a
  // contiguous copy, copied back after the collective.
  static Tensor contiguous_buffer(const Tensor& t, const char* op) { return t.require(op).contiguous(); }

  // This process's NCCL communicator on GPU `id`, made collectively at the
  // first call for that id: rank 0's NCCL id reaches the others by MPI_Bcast,
  // then every process joins with ncclCommInitRank, in the MPI order.
  backend::cuda::ncclComm_t nccl_communicator(int id) const {
    std::lock_guard g(nccl_mutex_);
    if (auto it = nccl_comms_.find(id); it != nccl_comms_.end()) return it->second;
    backend::cuda::ncclComm_t made = nullptr;
    detail::run_now("ncclCommInitRank", [&] {
      const auto& n = backend::cuda::nccl();
      backend::cuda::ncclUniqueId unique{};
      if (rank_ == 0) n.check(n.get_unique_id(&unique), "ncclGetUniqueId");
      detail::check(MPI_Bcast(&unique, sizeof unique, MPI_BYTE, 0, comm_), "MPI_Bcast (the NCCL id)");
      backend::cuda::gpu(id).bind();
      n.check(n.comm_init_rank(&made, size_, unique, rank_), "ncclCommInitRank");
    });
    return nccl_comms_.emplace(id, made).first->second;
  }

  void nccl_allreduce(const Tensor& t) const {
    const Tensor buffer = contiguous_buffer(t, "allreduce");
    const backend::cuda::ncclComm_t comm = nccl_communicator(t.device().id);
    push_op_on(t.device(), "ncclAllReduce", {buffer}, {buffer, detail::sequence()}, [buffer, comm] {
      const auto& n = backend::cuda::nccl();
      n.check(n.all_reduce(buffer.raw_data(), buffer.raw_data(), static_cast<std::size_t>(buffer.size()),
                           backend::cuda::Nccl::datatype(buffer.dtype()), backend::cuda::Nccl::sum, comm,
                           backend::cuda::gpu(buffer.device().id).stream()),
              "ncclAllReduce");
    });
    if (buffer.storage() != t.storage()) buffer.copy_to(t);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  mutable std::mutex nccl_mutex_;
  // By GPU id; destroyed, after the collectives queued on them, with the communicator.
  mutable std::map<int, backend::cuda::ncclComm_t> nccl_comms_;
  int rank_ = 0;
  int size_ = 0;
};

}  // namespace hybra::mpi
