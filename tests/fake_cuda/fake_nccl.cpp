// A stand-in for NCCL (libnccl.so.2) beside the stand-in driver
// (fake_driver.cpp), whose GPU memory is host memory: the communicators of
// one ncclCommInitAll sum their buffers on the host when the group that
// queued an allreduce on every one of them ends. It checks what real NCCL
// needs and would hang without: one process's GPUs reduce inside one group.
// Built with HYBRA_FAKE_NCCL_MPI (as libhybra_fake_nccl_mpi.so, for the MPI
// tests), a communicator of ncclCommInitRank spans processes, and its
// allreduce is MPI_Allreduce over MPI_COMM_WORLD on that (host) memory;
// otherwise only one rank is stood in for. The buffers are summed once the
// work queued before the allreduce on each communicator's stream has run.
#ifdef HYBRA_FAKE_NCCL_MPI
#include <mpi.h>
#endif

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

extern "C" void hybra_fake_cuda_drain(void* stream);

namespace {

constexpr int success = 0, invalid_argument = 4, invalid_usage = 5;

struct Pending {
  const void* send;
  void* receive;
  std::size_t count;
  int datatype;
  void* stream;
};

struct Clique;
struct Comm {
  Clique* clique;  // null: a communicator across processes (HYBRA_FAKE_NCCL_MPI)
  int rank;
};
struct Clique {
  std::vector<Comm> comms;
  std::vector<Pending> pending;  // by rank; count 0: none queued
  std::vector<bool> queued;
};

std::mutex mutex;
int group_depth = 0;
std::vector<Clique*> in_group;
std::map<std::string, long> calls;

template <class T>
void sum_into(Clique& c) {
  const std::size_t n = c.pending.front().count;
  std::vector<T> total(n, T(0));
  for (const Pending& p : c.pending)
    for (std::size_t i = 0; i < n; ++i) total[i] += static_cast<const T*>(p.send)[i];
  for (const Pending& p : c.pending) std::memcpy(p.receive, total.data(), n * sizeof(T));
}

int reduce(Clique& c) {
  for (bool q : c.queued)
    if (!q) return invalid_usage;  // a member of the clique has not joined: NCCL would wait forever
  for (const Pending& p : c.pending)
    if (p.count != c.pending.front().count || p.datatype != c.pending.front().datatype) return invalid_argument;
  for (const Pending& p : c.pending) hybra_fake_cuda_drain(p.stream);
  switch (c.pending.front().datatype) {
    case 1: sum_into<std::uint8_t>(c); break;
    case 2: sum_into<std::int32_t>(c); break;
    case 4: sum_into<std::int64_t>(c); break;
    case 7: sum_into<float>(c); break;
    case 8: sum_into<double>(c); break;
    default: return invalid_argument;
  }
  c.queued.assign(c.queued.size(), false);
  return success;
}

}  // namespace

extern "C" {

int ncclGetVersion(int* version) {
  *version = 22800;
  return success;
}

const char* ncclGetErrorString(int result) {
  switch (result) {
    case success: return "no error";
    case invalid_argument: return "invalid argument (stand-in)";
    case invalid_usage: return "invalid usage (stand-in): a collective some member of the clique did not join";
  }
  return "unknown result (stand-in)";
}

int ncclGetUniqueId(void* id) {
  std::memset(id, 0, 128);
  return success;
}

int ncclCommInitRank(void** comm, int nranks, const void*, int rank) {
  std::lock_guard g(mutex);
  ++calls["ncclCommInitRank"];
#ifdef HYBRA_FAKE_NCCL_MPI
  if (nranks > 1) {
    *comm = new Comm{nullptr, rank};
    return success;
  }
#endif
  if (nranks != 1 || rank != 0) return invalid_usage;
  auto* clique = new Clique{{Comm{nullptr, 0}}, {Pending{}}, {false}};
  clique->comms[0].clique = clique;
  *comm = &clique->comms[0];
  return success;
}

int ncclCommInitAll(void** comms, int ndev, const int*) {
  std::lock_guard g(mutex);
  ++calls["ncclCommInitAll"];
  auto* clique = new Clique;
  clique->comms.resize(static_cast<std::size_t>(ndev));
  clique->pending.resize(static_cast<std::size_t>(ndev));
  clique->queued.assign(static_cast<std::size_t>(ndev), false);
  for (int k = 0; k < ndev; ++k) {
    clique->comms[static_cast<std::size_t>(k)] = Comm{clique, k};
    comms[k] = &clique->comms[static_cast<std::size_t>(k)];
  }
  return success;
}

// Communicators of one rank (and those across processes) are freed; a
// clique of ncclCommInitAll lives as long as the process, as hybra keeps it.
int ncclCommDestroy(void* comm) {
  std::lock_guard g(mutex);
  ++calls["ncclCommDestroy"];
  auto* c = static_cast<Comm*>(comm);
  if (!c->clique) delete c;
  else if (c->clique->comms.size() == 1) delete c->clique;
  return success;
}

int ncclGroupStart() {
  std::lock_guard g(mutex);
  ++calls["ncclGroupStart"];
  ++group_depth;
  return success;
}

int ncclAllReduce(const void* send, void* receive, std::size_t count, int datatype, int op, void* comm, void* stream) {
  std::lock_guard g(mutex);
  ++calls["ncclAllReduce"];
  if (op != 0) return invalid_argument;  // hybra only sums
  Comm& c = *static_cast<Comm*>(comm);
#ifdef HYBRA_FAKE_NCCL_MPI
  if (!c.clique) {
    const MPI_Datatype type = datatype == 1   ? MPI_UINT8_T
                              : datatype == 2 ? MPI_INT32_T
                              : datatype == 4 ? MPI_INT64_T
                              : datatype == 7 ? MPI_FLOAT
                                              : MPI_DOUBLE;
    hybra_fake_cuda_drain(stream);
    return MPI_Allreduce(send == receive ? MPI_IN_PLACE : send, receive, static_cast<int>(count), type, MPI_SUM,
                         MPI_COMM_WORLD) == MPI_SUCCESS
               ? success
               : invalid_argument;
  }
#endif
  Clique& clique = *c.clique;
  clique.pending[static_cast<std::size_t>(c.rank)] = Pending{send, receive, count, datatype, stream};
  clique.queued[static_cast<std::size_t>(c.rank)] = true;
  if (group_depth == 0) return clique.comms.size() == 1 ? reduce(clique) : invalid_usage;
  in_group.push_back(&clique);
  return success;
}

int ncclGroupEnd() {
  std::lock_guard g(mutex);
  ++calls["ncclGroupEnd"];
  if (group_depth == 0) return invalid_usage;
  if (--group_depth > 0) return success;
  int result = success;
  std::vector<Clique*> done;
  for (Clique* c : in_group) {
    bool seen = false;
    for (Clique* d : done) seen = seen || d == c;
    if (seen) continue;
    done.push_back(c);
    if (int r = reduce(*c); r != success) result = r;
  }
  in_group.clear();
  return result;
}

// Test hook: how many times `call` was made.
long hybra_fake_nccl_calls(const char* call) {
  std::lock_guard g(mutex);
  return calls[call];
}

}  // extern "C"
