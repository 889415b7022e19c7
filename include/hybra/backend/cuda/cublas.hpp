#pragma once
// cuBLAS, loaded at run time (library.hpp): the matrix products of GPU
// tensors. cuBLAS is column-major; hybra's matrices are row-major, so a
// product C = A B is asked of cuBLAS as C^T = B^T A^T, which reads the same
// memory with no copy (gemm below takes row-major operands).
//
// The library is libcublas.so.13 or .12 (where cuda_library_candidates
// looks), or the file $HYBRA_CUBLAS names (the tests point it at a stand-in,
// tests/fake_cuda).
#include <array>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>

#include "gpu.hpp"

namespace hybra::backend::cuda {

namespace handle {
struct cublasContext;
}
using cublasHandle_t = handle::cublasContext*;
using cublasStatus_t = int;

// A library of the cuBLAS family, loaded at run time: the file $<env>
// names, else the first of its usual names that loads; its status codes
// become exceptions naming the library and the call (OutOfMemory for
// CUBLAS_STATUS_ALLOC_FAILED).
class BlasLibrary {
 public:
  bool loaded() const { return library_.loaded(); }
  const std::string& problem() const { return library_.error(); }

  void check(int s, std::string_view call) const {
    if (s == 0) return;
    const char *name = status_name_(s), *text = status_string_(s);
    const auto message = hybra::detail::concat(what_, ": ", call, " failed: ", name ? name : "", " (", s, "): ", text ? text : "");
    if (s == 3) fail<OutOfMemory>(message);  // CUBLAS_STATUS_ALLOC_FAILED
    fail<DeviceError>(message);
  }

 protected:
  BlasLibrary(std::string_view what, const char* env, std::initializer_list<const char*> names, const char* status_name,
              const char* status_string)
      : what_(what), library_(open(env, names)) {
    if (!library_.loaded()) return;
    load(status_name_, status_name);
    load(status_string_, status_string);
  }
  template <class F>
  void load(F& f, const char* symbol) {
    f = library_.function<F>(symbol);
  }

 private:
  static SharedLibrary open(const char* env, std::initializer_list<const char*> names) {
    if (const char* file = std::getenv(env); file && *file) return SharedLibrary({file});
    return SharedLibrary(cuda_library_candidates(names));
  }

  std::string_view what_;
  SharedLibrary library_;
  const char* (*status_name_)(int) = nullptr;
  const char* (*status_string_)(int) = nullptr;
};

class Cublas : public BlasLibrary {
 public:
  Cublas()
      : BlasLibrary("cuBLAS", "HYBRA_CUBLAS", {"libcublas.so.13", "libcublas.so.12"},
                    "cublasGetStatusName", "cublasGetStatusString") {
    if (!loaded()) return;
    load(create, "cublasCreate_v2");
    load(set_stream, "cublasSetStream_v2");
    load(set_workspace, "cublasSetWorkspace_v2");
    load(set_math_mode, "cublasSetMathMode");
    load(sgemm, "cublasSgemm_v2");
    load(dgemm, "cublasDgemm_v2");
  }

  cublasStatus_t (*create)(cublasHandle_t*) = nullptr;
  cublasStatus_t (*set_stream)(cublasHandle_t, CUstream) = nullptr;
  cublasStatus_t (*set_workspace)(cublasHandle_t, void*, std::size_t) = nullptr;
  cublasStatus_t (*set_math_mode)(cublasHandle_t, int) = nullptr;
  cublasStatus_t (*sgemm)(cublasHandle_t, int, int, int, int, int, const float*, const float*, int, const float*, int,
                          const float*, float*, int) = nullptr;
  cublasStatus_t (*dgemm)(cublasHandle_t, int, int, int, int, int, const double*, const double*, int, const double*,
                          int, const double*, double*, int) = nullptr;
};

// Whether float32 products on a GPU may round their inputs to TF32 (10
// mantissa bits) for the tensor cores, accumulating in float32: several
// times the throughput, about 1e-3 relative error. Off unless
// HYBRA_CUDA_TF32=1 at start or set_tf32(true), so that a product matches
// float32 arithmetic as on the CPU (PyTorch's default for matmul too).
// Read as each product is queued; a CUDA graph replays its products in the
// mode they were recorded in.
inline Switch& tf32_switch() {
  static Switch s("HYBRA_CUDA_TF32");
  return s;
}
inline bool tf32() { return tf32_switch().on(); }
inline void set_tf32(bool on) { tf32_switch().set(on); }

// Never destroyed, like the driver (driver.hpp).
inline const Cublas& cublas() {
  static const Cublas& library = *new Cublas;
  if (!library.loaded()) fail<DeviceError>("cuBLAS could not be loaded: ", library.problem());
  return library;
}

namespace detail {
// The workspace each GPU's cuBLAS handle gets from hybra: what NVIDIA asks
// for on Hopper. Without a workspace of the caller's, cuBLAS takes one from
// a pool of its own, which a GEMM captured into a CUDA graph may not do.
inline constexpr std::size_t cublas_workspace_bytes = std::size_t{32} << 20;

// Each GPU's cuBLAS handle, made on first use on its stream with its
// workspace (set after the stream: cublasSetStream resets it); kept for the
// process's life, like the GPUs.
inline cublasHandle_t cublas_handle(Gpu& gpu) {
  static std::mutex& mutex = *new std::mutex;
  static std::array<cublasHandle_t, max_gpu_devices> handles{};
  const Cublas& cb = cublas();
  const int id = gpu.device().id;
  std::lock_guard g(mutex);
  if (!handles[static_cast<std::size_t>(id)]) {
    gpu.bind();
    cublasHandle_t h = nullptr;
    cb.check(cb.create(&h), "cublasCreate");
    finish_gpu_work_first();
    cb.check(cb.set_stream(h, gpu.stream()), "cublasSetStream");
    const CUdeviceptr workspace = gpu.memory().allocate(cublas_workspace_bytes);
    cb.check(cb.set_workspace(h, reinterpret_cast<void*>(workspace), cublas_workspace_bytes), "cublasSetWorkspace");
    handles[static_cast<std::size_t>(id)] = h;
  }
  return handles[static_cast<std::size_t>(id)];
}
}  // namespace detail

// C (M x N, row-major, row stride ldc) = alpha A B + beta C on the GPU's
// stream, where A is M x K and B is K x N, each row-major with row stride
// ld, or, when trans_*, stored column-major with column stride ld (a
// transposed view). T is float or double.
template <class T>
void gemm(Gpu& gpu, bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, T alpha,
          const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "hybra: cuBLAS products are float or double");
  for (std::int64_t v : {M, N, K, lda, ldb, ldc})
    if (v > INT_MAX)
      fail<ShapeError>("cuBLAS: a product of ", M, " x ", K, " by ", K, " x ", N,
                       " has a dimension over 2^31 - 1, which cuBLAS does not take");
  const Cublas& cb = cublas();
  cublasHandle_t h = detail::cublas_handle(gpu);
  const int op_a = trans_a ? 1 : 0, op_b = trans_b ? 1 : 0;  // CUBLAS_OP_T : CUBLAS_OP_N
  auto i = [](std::int64_t v) { return static_cast<int>(v); };
  // Column-major C^T (N x M) = B^T (N x K) A^T (K x M): a row-major matrix is
  // its own transpose read column-major, so the operands swap and keep their ops.
  if constexpr (std::is_same_v<T, float>) {
    constexpr int default_math = 0, tf32_tensor_op_math = 3;  // cublasMath_t
    cb.check(cb.set_math_mode(h, tf32() ? tf32_tensor_op_math : default_math), "cublasSetMathMode");
    cb.check(cb.sgemm(h, op_b, op_a, i(N), i(M), i(K), &alpha, b, i(ldb), a, i(lda), &beta, c, i(ldc)), "cublasSgemm");
  } else {
    cb.check(cb.dgemm(h, op_b, op_a, i(N), i(M), i(K), &alpha, b, i(ldb), a, i(lda), &beta, c, i(ldc)), "cublasDgemm");
  }
}

}  // namespace hybra::backend::cuda
