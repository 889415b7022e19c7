#pragma once
// cuBLASLt, loaded at run time (library.hpp): fully_connected's product,
// y = x w^T + b, with the bias (and a ReLU, when a captured graph applies
// one next) added by the GEMM kernel's epilogue instead of separate kernels
// over y. What cuBLASLt needs for one shape (descriptors, the algorithm its
// heuristic picks) is made once per GPU, dtype, shape and epilogue, and kept.
//
// The library is libcublasLt.so.13 or .12 (where cuda_library_candidates
// looks), or the file $HYBRA_CUBLASLT names (the tests
// point it at the stand-in cuBLAS, tests/fake_cuda, which has both APIs).
#include <array>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>
#include <tuple>

#include "../../core/dtype.hpp"
#include "cublas.hpp"

namespace hybra::backend::cuda {

namespace handle {
struct cublasLtContext;
struct cublasLtMatmulDescOpaque;
struct cublasLtMatrixLayoutOpaque;
struct cublasLtMatmulPreferenceOpaque;
}  // namespace handle
using cublasLtHandle_t = handle::cublasLtContext*;
using cublasLtMatmulDesc_t = handle::cublasLtMatmulDescOpaque*;
using cublasLtMatrixLayout_t = handle::cublasLtMatrixLayoutOpaque*;
using cublasLtMatmulPreference_t = handle::cublasLtMatmulPreferenceOpaque*;
// As cublasLt.h lays them out.
struct cublasLtMatmulAlgo_t {
  std::uint64_t data[8];
};
struct cublasLtMatmulHeuristicResult_t {
  cublasLtMatmulAlgo_t algo;
  std::size_t workspaceSize;
  int state;
  float wavesCount;
  int reserved[4];
};

// The values of cublasLt.h's and library_types.h's enums that hybra uses.
namespace lt {
inline constexpr int compute_32f = 68, compute_32f_fast_tf32 = 77, compute_64f = 70, r_32f = 0, r_64f = 1, r_16f = 2,
                     r_16bf = 14;
inline constexpr int desc_transa = 3, desc_transb = 4, desc_epilogue = 7, desc_bias_pointer = 8;
inline constexpr int pref_max_workspace_bytes = 1, pref_min_alignment_a_bytes = 5;  // then B, C, D
inline constexpr int op_n = 0, op_t = 1;
}  // namespace lt

// What the GEMM's epilogue adds to x w^T (cuBLASLt's values).
enum class Epilogue : std::uint32_t { none = 1, relu = 2, bias = 4, relu_bias = 6 };

class CublasLt : public BlasLibrary {
 public:
  CublasLt()
      : BlasLibrary("cuBLASLt", "HYBRA_CUBLASLT",
                    {"libcublasLt.so.13", "libcublasLt.so.12"},
                    "cublasLtGetStatusName", "cublasLtGetStatusString") {
    if (!loaded()) return;
    load(create, "cublasLtCreate");
    load(desc_create, "cublasLtMatmulDescCreate");
    load(desc_destroy, "cublasLtMatmulDescDestroy");
    load(desc_set, "cublasLtMatmulDescSetAttribute");
    load(layout_create, "cublasLtMatrixLayoutCreate");
    load(layout_destroy, "cublasLtMatrixLayoutDestroy");
    load(preference_create, "cublasLtMatmulPreferenceCreate");
    load(preference_destroy, "cublasLtMatmulPreferenceDestroy");
    load(preference_set, "cublasLtMatmulPreferenceSetAttribute");
    load(heuristic, "cublasLtMatmulAlgoGetHeuristic");
    load(matmul, "cublasLtMatmul");
  }

  int (*create)(cublasLtHandle_t*) = nullptr;
  int (*desc_create)(cublasLtMatmulDesc_t*, int, int) = nullptr;
  int (*desc_destroy)(cublasLtMatmulDesc_t) = nullptr;
  int (*desc_set)(cublasLtMatmulDesc_t, int, const void*, std::size_t) = nullptr;
  int (*layout_create)(cublasLtMatrixLayout_t*, int, std::uint64_t, std::uint64_t, std::int64_t) = nullptr;
  int (*layout_destroy)(cublasLtMatrixLayout_t) = nullptr;
  int (*preference_create)(cublasLtMatmulPreference_t*) = nullptr;
  int (*preference_destroy)(cublasLtMatmulPreference_t) = nullptr;
  int (*preference_set)(cublasLtMatmulPreference_t, int, const void*, std::size_t) = nullptr;
  int (*heuristic)(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                   cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int,
                   cublasLtMatmulHeuristicResult_t*, int*) = nullptr;
  int (*matmul)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void*, const void*, cublasLtMatrixLayout_t, const void*,
                cublasLtMatrixLayout_t, const void*, const void*, cublasLtMatrixLayout_t, void*, cublasLtMatrixLayout_t,
                const cublasLtMatmulAlgo_t*, void*, std::size_t, CUstream) = nullptr;
};

// Never destroyed, like the driver (driver.hpp).
inline const CublasLt& cublaslt() {
  static const CublasLt& library = *new CublasLt;
  if (!library.loaded()) fail<DeviceError>("cuBLASLt could not be loaded: ", library.problem());
  return library;
}

// fully_connected's product on a GPU: y (M x N) = x (M x K) w^T (w: N x K)
// with the epilogue's bias (length N) and ReLU, all row-major. cuBLASLt is
// column-major, so it computes y^T (N x M) = w x^T: w read as a column-major
// K x N matrix transposed, x as a column-major K x M one, and the bias runs
// along y^T's rows, which is what cuBLASLt's bias epilogue adds.
class DenseMatmul {
 public:
  // Each GPU's workspace for the kernels cuBLASLt picks (split-K ones need
  // it). One buffer that never moves: captured graphs keep its address.
  static constexpr std::size_t workspace_bytes = std::size_t{8} << 20;

  DenseMatmul(Gpu& gpu, DType dtype, std::int64_t M, std::int64_t N, std::int64_t K, Epilogue epilogue, bool tf32)
      : lt_(cublaslt()),
        gpu_(gpu),
        handle_(lt_handle(gpu)),
        workspace_(workspace(gpu)),
        single_(dtype != DType::float64),
        dims_{M, N, K},
        dtype_(dtype) {
    if (!is_floating(dtype))
      fail<DTypeError>("fully_connected: ", name(dtype), " products are not done on a GPU (float32, float64, float16 "
                       "and bfloat16 are)");
    // The 16-bit floats on tensor cores, accumulating and scaling in float32.
    const int type = dtype == DType::float32   ? lt::r_32f
                     : dtype == DType::float64 ? lt::r_64f
                     : dtype == DType::float16 ? lt::r_16f
                                               : lt::r_16bf;
    const int compute = dtype == DType::float64                ? lt::compute_64f
                        : dtype == DType::float32 && tf32 ? lt::compute_32f_fast_tf32
                                                          : lt::compute_32f;
    lt_.check(lt_.desc_create(&desc_, compute, dtype == DType::float64 ? lt::r_64f : lt::r_32f),
              "cublasLtMatmulDescCreate");
    const int transa = lt::op_t, transb = lt::op_n;
    const auto ep = static_cast<std::uint32_t>(epilogue);
    lt_.check(lt_.desc_set(desc_, lt::desc_transa, &transa, sizeof transa), "cublasLtMatmulDescSetAttribute");
    lt_.check(lt_.desc_set(desc_, lt::desc_transb, &transb, sizeof transb), "cublasLtMatmulDescSetAttribute");
    lt_.check(lt_.desc_set(desc_, lt::desc_epilogue, &ep, sizeof ep), "cublasLtMatmulDescSetAttribute");
    auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
    lt_.check(lt_.layout_create(&w_, type, u(K), u(N), K), "cublasLtMatrixLayoutCreate");
    lt_.check(lt_.layout_create(&x_, type, u(K), u(M), K), "cublasLtMatrixLayoutCreate");
    lt_.check(lt_.layout_create(&y_, type, u(N), u(M), N), "cublasLtMatrixLayoutCreate");
  }
  DenseMatmul(const DenseMatmul&) = delete;
  DenseMatmul& operator=(const DenseMatmul&) = delete;
  ~DenseMatmul() {
    for (auto layout : {w_, x_, y_})
      if (layout) lt_.layout_destroy(layout);
    if (desc_) lt_.desc_destroy(desc_);
  }

  // Queues the product on the GPU's stream; bias may be null when the
  // epilogue has none. Pointers to T (the dtype it was made for).
  void run(const void* x, const void* w, const void* bias, void* y) const {
    std::lock_guard g(mutex_);  // the bias is an attribute of the shared descriptor
    const auto& algorithm = algorithm_for(alignment_of({x, w, bias, y}));
    lt_.check(lt_.desc_set(desc_, lt::desc_bias_pointer, &bias, sizeof bias), "cublasLtMatmulDescSetAttribute");
    const double one = 1, zero = 0;
    const float one_f = 1, zero_f = 0;
    const void* alpha = single_ ? static_cast<const void*>(&one_f) : &one;
    const void* beta = single_ ? static_cast<const void*>(&zero_f) : &zero;
    lt_.check(lt_.matmul(handle_, desc_, alpha, w, w_, x, x_, beta, y, y_, y, y_, &algorithm.algo, workspace_,
                         workspace_bytes, gpu_.stream()),
              "cublasLtMatmul");
  }

 private:
  // The largest power of two, up to 256, that every non-null pointer is a
  // multiple of: cuBLASLt's heuristic assumes 256 unless told less, and an
  // algorithm picked for aligned operands may not run on others (a view's
  // offset, a plan's buffer).
  static std::uint32_t alignment_of(std::initializer_list<const void*> pointers) {
    std::uintptr_t bits = 256;
    for (const void* p : pointers) bits |= reinterpret_cast<std::uintptr_t>(p);
    return static_cast<std::uint32_t>(bits & (~bits + 1));
  }

  // The heuristic's algorithm for operands of this alignment, asked once:
  // the preferences promise it for x, w and y, and a stand-in bias pointer
  // of that alignment promises it for the bias (the heuristic reads the
  // pointer's value, not what it points at).
  const cublasLtMatmulHeuristicResult_t& algorithm_for(std::uint32_t alignment) const {
    if (auto it = algorithms_.find(alignment); it != algorithms_.end()) return it->second;
    cublasLtMatmulPreference_t preference = nullptr;
    lt_.check(lt_.preference_create(&preference), "cublasLtMatmulPreferenceCreate");
    const std::uint64_t most = workspace_bytes;
    const void* bias_like = reinterpret_cast<const void*>(static_cast<std::uintptr_t>(alignment));
    cublasLtMatmulHeuristicResult_t algorithm{};
    int found = 0, status = lt_.preference_set(preference, lt::pref_max_workspace_bytes, &most, sizeof most);
    for (int operand = 0; operand < 4 && status == 0; ++operand)
      status = lt_.preference_set(preference, lt::pref_min_alignment_a_bytes + operand, &alignment, sizeof alignment);
    if (status == 0) status = lt_.desc_set(desc_, lt::desc_bias_pointer, &bias_like, sizeof bias_like);
    if (status == 0) status = lt_.heuristic(handle_, desc_, w_, x_, y_, y_, preference, 1, &algorithm, &found);
    lt_.preference_destroy(preference);
    lt_.check(status, "cublasLtMatmulAlgoGetHeuristic");
    if (found == 0)
      fail<DeviceError>("fully_connected: cuBLASLt has no algorithm for ", dims_[0], " x ", dims_[2], " times (",
                        dims_[1], " x ", dims_[2], ")^T in ", name(dtype_), " on ", gpu_.device(), " with operands ",
                        alignment, "-byte aligned");
    return algorithms_.emplace(alignment, algorithm).first->second;
  }

 private:
  // Each GPU's handle and workspace, made on first use and kept for the
  // process's life, like the GPUs.
  static cublasLtHandle_t lt_handle(Gpu& gpu) {
    static std::mutex& mutex = *new std::mutex;
    static std::array<cublasLtHandle_t, max_gpu_devices> handles{};
    std::lock_guard g(mutex);
    auto& h = handles[static_cast<std::size_t>(gpu.device().id)];
    if (!h) {
      gpu.bind();
      cublaslt().check(cublaslt().create(&h), "cublasLtCreate");
      finish_gpu_work_first();
    }
    return h;
  }
  static void* workspace(Gpu& gpu) {
    static std::mutex& mutex = *new std::mutex;
    static std::array<CUdeviceptr, max_gpu_devices> buffers{};
    std::lock_guard g(mutex);
    auto& b = buffers[static_cast<std::size_t>(gpu.device().id)];
    if (!b) b = gpu.memory().allocate(workspace_bytes);
    return reinterpret_cast<void*>(b);
  }

  const CublasLt& lt_;
  Gpu& gpu_;
  cublasLtHandle_t handle_;
  void* workspace_;
  bool single_;  // alpha and beta are floats (every dtype but float64)
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t w_ = nullptr, x_ = nullptr, y_ = nullptr;
  std::array<std::int64_t, 3> dims_{};  // M, N, K
  DType dtype_;
  mutable std::map<std::uint32_t, cublasLtMatmulHeuristicResult_t> algorithms_;  // by alignment_of the operands
  mutable std::mutex mutex_;
};

// The DenseMatmul of a GPU, dtype, shape and epilogue, in the current TF32
// mode (float32: cublas.hpp, tf32), made on first use and kept (never
// destroyed: queued ops may use it at exit).
inline const DenseMatmul& dense_matmul(Gpu& gpu, DType dtype, std::int64_t M, std::int64_t N, std::int64_t K,
                                       Epilogue epilogue) {
  using Key = std::tuple<int, DType, std::int64_t, std::int64_t, std::int64_t, Epilogue, bool>;
  static std::mutex& mutex = *new std::mutex;
  static auto& made = *new std::map<Key, std::unique_ptr<DenseMatmul>>;
  const bool fast = dtype == DType::float32 && tf32();
  const Key key{gpu.device().id, dtype, M, N, K, epilogue, fast};
  std::lock_guard g(mutex);
  auto& m = made[key];
  if (!m) m = std::make_unique<DenseMatmul>(gpu, dtype, M, N, K, epilogue, fast);
  return *m;
}

}  // namespace hybra::backend::cuda
