// hybra across processes (include/hybra/parallel/mpi.hpp), run by ctest as
// `mpirun -np 2 test_mpi` (label `mpi`); any number of processes >= 2 works.
// Process r contributes values scaled by r + 1, so every sum is known. Exits
// with 1 if any check failed on this process, which fails the mpirun.
#include <hybra/eager.hpp>
#include <hybra/parallel/mpi.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string_view>
#include <thread>
#include <vector>

using namespace hybra;

namespace {

int failures = 0;
int my_rank = 0;

void check(bool ok, const char* what, int line) {
  if (ok) return;
  ++failures;
  std::cerr << "test_mpi.cpp:" << line << ": rank " << my_rank << ": check failed: " << what << '\n';
}
#define CHECK(...) check((__VA_ARGS__), #__VA_ARGS__, __LINE__)

template <class E>
void check_throws(auto&& fn, const std::string& message, int line) {
  try {
    fn();
  } catch (const E& e) {
    if (std::string(e.what()).find(message) != std::string::npos) return;
    std::cerr << "test_mpi.cpp:" << line << ": rank " << my_rank << ": wrong message: " << e.what() << '\n';
    ++failures;
    return;
  }
  std::cerr << "test_mpi.cpp:" << line << ": rank " << my_rank << ": nothing thrown, expected: " << message << '\n';
  ++failures;
}
#define CHECK_THROWS(E, message, ...) check_throws<E>([&] { __VA_ARGS__; }, message, __LINE__)

// Element i of process r's contribution: (i % 7 + 1) * (r + 1).
Tensor contribution(int rank, std::int64_t n, DType dtype, Device device) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<double>((i % 7 + 1) * (rank + 1));
  return array(v, {n}, device).astype(dtype);
}

// The sum of every process's contribution, wrapped as the dtype wraps.
std::vector<double> expected_sum(int processes, std::int64_t n, DType dtype) {
  const double ranks = processes * (processes + 1) / 2.0;  // (r + 1) summed over r
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    double s = static_cast<double>(i % 7 + 1) * ranks;
    v[static_cast<std::size_t>(i)] = dtype == DType::uint8 ? std::fmod(s, 256.0) : s;
  }
  return v;
}

void test_allreduce_every_dtype(const mpi::Communicator& world) {
  for (DType dtype : {DType::float32, DType::float64, DType::int32, DType::int64, DType::uint8}) {
    Tensor t = contribution(world.rank(), 1000, dtype, cpu(0));
    world.allreduce(t);
    CHECK(t.dtype() == dtype);
    CHECK(t.to_vector<double>() == expected_sum(world.size(), 1000, dtype));
  }
}

void test_allreduce_views_and_devices(const mpi::Communicator& world) {
  Tensor on_cpu1 = contribution(world.rank(), 64, DType::float32, cpu(1));
  world.allreduce(on_cpu1);
  CHECK(on_cpu1.device() == cpu(1));
  CHECK(on_cpu1.to_vector<double>() == expected_sum(world.size(), 64, DType::float32));

  // A transposed view goes through a contiguous copy and back.
  Tensor matrix = full({3, 4}, world.rank() + 1, DType::int32);
  world.allreduce(transpose(matrix));
  CHECK(matrix.to_vector<int>() == std::vector<int>(12, world.size() * (world.size() + 1) / 2));

  Tensor empty = zeros({0, 5});
  world.allreduce(empty);
  CHECK(empty.size() == 0);
}

void test_allreduce_many(const mpi::Communicator& world) {
  std::vector<Tensor> grads{contribution(world.rank(), 10, DType::float32, cpu(0)),
                            contribution(world.rank(), 3, DType::int64, cpu(1)),
                            contribution(world.rank(), 100000, DType::float64, cpu(0))};
  world.allreduce(grads);
  CHECK(grads[0].to_vector<double>() == expected_sum(world.size(), 10, DType::float32));
  CHECK(grads[1].to_vector<double>() == expected_sum(world.size(), 3, DType::int64));
  CHECK(grads[2].to_vector<double>() == expected_sum(world.size(), 100000, DType::float64));
}

// A tensor filled with `value` by an op that first sleeps, on cpu(1); or at
// once, on cpu(0).
Tensor filled(float value, bool late) {
  if (!late) return full({16}, value);
  Tensor t({16}, DType::float32, cpu(1));
  push_op("late fill", {}, {t}, [t, value] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    float* p = static_cast<float*>(t.raw_data());
    std::fill(p, p + t.size(), value);
  });
  return t;
}

// Every process queues the allreduce of `first`, then of `second`. On rank 0
// the first comes late, elsewhere the second: run as soon as ready, rank 0
// would sum its second with the others' first (same count and type: MPI
// could not tell). They must run in the order queued.
void test_collectives_keep_their_order(const mpi::Communicator& world) {
  Tensor first = filled(1, world.rank() == 0);
  Tensor second = filled(100, world.rank() != 0);
  world.allreduce(first);
  world.allreduce(second);
  CHECK(first.to_vector<float>() == std::vector<float>(16, static_cast<float>(world.size())));
  CHECK(second.to_vector<float>() == std::vector<float>(16, 100.f * static_cast<float>(world.size())));
}

void test_broadcast(const mpi::Communicator& world) {
  for (int root : {0, world.size() - 1}) {
    Tensor weights = contribution(world.rank(), 50, DType::float64, cpu(0));
    world.broadcast(weights, root);
    CHECK(weights.to_vector<double>() == contribution(root, 50, DType::float64, cpu(0)).to_vector<double>());
  }
  Tensor w = zeros({2});
  CHECK_THROWS(ValueError, "mpi broadcast: root 7 is out of range for", world.broadcast(w, 7));
}

void test_errors() {
  CHECK_THROWS(Error, "mpi: MPI_Allreduce failed: MPI_ERR_COUNT", mpi::detail::check(MPI_ERR_COUNT, "MPI_Allreduce"));
  mpi::Communicator moved_from;
  mpi::Communicator owner(std::move(moved_from));
  Tensor t = zeros({2});
  CHECK_THROWS(ValueError, "mpi allreduce: the communicator was moved from", moved_from.allreduce(t));
  CHECK_THROWS(ValueError, "mpi broadcast: the communicator was moved from", moved_from.broadcast(t));
  owner.allreduce(t);
  CHECK(t.to_vector<float>() == std::vector<float>{0, 0});
}

// Run by ctest's mpi_gpu_nccl and mpi_gpu_staged, on the stand-in driver's
// GPUs (whose memory is host memory, so copies and sums compute): tensors on
// cuda(0) summed and broadcast across the processes, by NCCL unless
// HYBRA_NCCL=0 turns it off.
void test_gpu_tensors(const mpi::Communicator& world) {
  if (backend::cuda::driver_status().gpus.empty()) return;
  const char* nccl = std::getenv("HYBRA_NCCL");
  CHECK(backend::cuda::nccl_available() == !(nccl && std::string_view(nccl) == "0"));
  for (DType dtype : {DType::float32, DType::int64, DType::uint8}) {
    Tensor t = contribution(world.rank(), 1000, dtype, cpu()).to(cuda(0));
    world.allreduce(t);
    CHECK(t.device() == cuda(0));
    CHECK(t.to_vector<double>() == expected_sum(world.size(), 1000, dtype));
  }
  Tensor weights = contribution(world.rank(), 50, DType::float64, cpu()).to(cuda(0));
  world.broadcast(weights, 1);
  CHECK(weights.to_vector<double>() == contribution(1, 50, DType::float64, cpu()).to_vector<double>());
  if (world.rank() == 0)
    std::cout << "test_mpi: GPU tensors summed " << (backend::cuda::nccl_available() ? "by NCCL" : "through the host")
              << '\n';
}

}  // namespace

int main(int argc, char** argv) {
  mpi::Environment env(argc, argv);
  {
    mpi::Environment nested;  // MPI is initialised already: this one neither initialises nor finalises
    CHECK(nested.thread_level() == env.thread_level());
  }
  CHECK(env.thread_level() >= MPI_THREAD_SERIALIZED);
  mpi::Communicator world;
  my_rank = world.rank();
  if (world.size() < 2) {
    std::cerr << "test_mpi: run it with at least 2 processes (mpirun -np 2 test_mpi)\n";
    return 1;
  }
  test_allreduce_every_dtype(world);
  test_allreduce_views_and_devices(world);
  test_allreduce_many(world);
  test_collectives_keep_their_order(world);
  test_broadcast(world);
  test_errors();
  test_gpu_tensors(world);
  world.barrier();
  if (failures == 0 && world.rank() == 0) std::cout << "test_mpi: " << world.size() << " processes, all checks passed\n";
  return failures == 0 ? 0 : 1;
}
