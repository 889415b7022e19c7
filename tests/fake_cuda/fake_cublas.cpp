// A stand-in for cuBLAS and cuBLASLt (libcublas.so, libcublasLt.so: one
// library has both APIs), beside the stand-in driver (fake_driver.cpp), whose
// GPU memory is host memory: its products compute, on the host and
// column-major as cuBLAS does, queued on the stream through the stand-in
// driver (so a captured graph replays them), so the tests check that hybra
// hands row-major products, transposed views, batches and cuBLASLt's
// epilogues to cuBLAS right. It also refuses, as the real libraries may fail
// or compute wrongly, what their documentation rules out: a GEMM captured
// into a CUDA graph by a handle with no workspace of the caller's
// (cublasSetWorkspace), and a cuBLASLt matmul whose pointers are less
// aligned than the heuristic was promised (its MIN_ALIGNMENT preferences,
// default 256 bytes, and the bias pointer it saw).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "hybra/core/half.hpp"

void hybra_fake_cuda_on_stream(void* stream, std::function<void()> work);
extern "C" bool hybra_fake_cuda_capturing(void* stream);

namespace {

constexpr int success = 0, invalid_value = 7, not_supported = 15;

template <class T>
void gemm(int transa, int transb, int m, int n, int k, T alpha, const T* a, int lda, const T* b, int ldb, T beta, T* c,
          int ldc) {
  auto at = [&](int i, int p) { return transa ? a[p + static_cast<std::int64_t>(i) * lda] : a[i + static_cast<std::int64_t>(p) * lda]; };
  auto bt = [&](int p, int j) { return transb ? b[j + static_cast<std::int64_t>(p) * ldb] : b[p + static_cast<std::int64_t>(j) * ldb]; };
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      T sum = 0;
      for (int p = 0; p < k; ++p) sum += at(i, p) * bt(p, j);
      T& out = c[i + static_cast<std::int64_t>(j) * ldc];
      out = alpha * sum + (beta == T(0) ? T(0) : beta * out);
    }
}

std::atomic<long> gemms{0}, lt_matmuls{0}, misaligned{0};
// What cuBLAS's own exit handlers stand for: once they ran, a GEMM asked for
// is a use of a library that tore itself down, which a program must not do.
std::atomic<bool> torn_down{false};
std::atomic<int> math_mode{0}, last_compute{0};  // of the latest cublasSetMathMode and cublasLtMatmul

struct Handle {
  void* stream = nullptr;
  void* workspace = nullptr;  // the caller's (cublasSetWorkspace); cublasSetStream resets it, as cuBLAS does
};

template <class T>
int queue_gemm(void* handle, int transa, int transb, int m, int n, int k, const T* alpha, const T* a, int lda,
               const T* b, int ldb, const T* beta, T* c, int ldc) {
  if (m < 0 || n < 0 || k < 0 || ldc < m) return invalid_value;
  if (torn_down) {
    std::fprintf(stderr, "fake cuBLAS: a GEMM was asked for after cuBLAS's exit handlers ran\n");
    std::abort();
  }
  const Handle& h = *static_cast<Handle*>(handle);
  if (!h.workspace && hybra_fake_cuda_capturing(h.stream)) return not_supported;
  ++gemms;
  hybra_fake_cuda_on_stream(static_cast<Handle*>(handle)->stream,
                            [=, alpha = *alpha, beta = *beta] { gemm(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc); });
  return success;
}

// cuBLASLt's descriptors, as far as hybra sets them.
struct MatmulDesc {
  int compute = 0, transa = 0, transb = 0;
  std::uint32_t epilogue = 1;
  const void* bias = nullptr;
};
struct Layout {
  int type;
  std::uint64_t rows, cols;
  std::int64_t ld;
};
struct Algo {
  std::uint64_t data[8];
};
struct Preference {
  std::uint32_t alignment[4] = {256, 256, 256, 256};  // A, B, C, D: cuBLASLt's defaults
};
// The largest power of two up to 256 that p is a multiple of (256 for null).
std::uint64_t alignment_of(const void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  return v == 0 ? 256 : std::min<std::uint64_t>(256, v & (~v + 1));
}
struct HeuristicResult {
  Algo algo;
  std::size_t workspace;
  int state;
  float waves;
  int reserved[4];
};
constexpr std::uint32_t epilogue_relu = 2, epilogue_bias = 4;

template <class T>
void lt_matmul(const MatmulDesc& d, const Layout& la, const Layout& lb, const Layout& ld, T alpha, const T* a,
               const T* b, T beta, T* out) {
  const int m = static_cast<int>(ld.rows), n = static_cast<int>(ld.cols);
  const int k = static_cast<int>(d.transa ? la.rows : la.cols);
  gemm(d.transa, d.transb, m, n, k, alpha, a, static_cast<int>(la.ld), b, static_cast<int>(lb.ld), beta, out,
       static_cast<int>(ld.ld));
  const T* bias = static_cast<const T*>(d.bias);
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      T& v = out[i + static_cast<std::int64_t>(j) * ld.ld];
      if (d.epilogue & epilogue_bias) v += bias[i];
      if (d.epilogue & epilogue_relu) v = std::max(v, T(0));
    }
}

// A product of 16-bit floats H: widened to float, computed, rounded into d.
template <class H>
void lt_matmul_16(const MatmulDesc& d, const Layout& la, const Layout& lb, const Layout& ld, float alpha, const void* a,
                  const void* b, float beta, void* out) {
  const auto widen = [](const void* p, std::uint64_t n) {
    std::vector<float> v(n);
    for (std::uint64_t i = 0; i < n && p; ++i) v[i] = static_cast<float>(static_cast<const H*>(p)[i]);
    return v;
  };
  const auto elements = [](const Layout& l) { return static_cast<std::uint64_t>(l.ld) * l.cols; };
  const std::vector<float> wa = widen(a, elements(la)), wb = widen(b, elements(lb)), bias = widen(d.bias, ld.rows);
  std::vector<float> wd = beta != 0 ? widen(out, elements(ld)) : std::vector<float>(elements(ld));
  MatmulDesc wide = d;
  wide.bias = d.bias ? bias.data() : nullptr;
  lt_matmul(wide, la, lb, ld, alpha, wa.data(), wb.data(), beta, wd.data());
  for (std::uint64_t i = 0; i < wd.size(); ++i) static_cast<H*>(out)[i] = H(wd[i]);
}

}  // namespace

extern "C" {
int cublasCreate_v2(void** handle) {
  *handle = new Handle;
  std::atexit([] { torn_down = true; });
  return success;
}
int cublasSetMathMode(void*, int mode) {
  math_mode = mode;
  return success;
}
int cublasSetStream_v2(void* handle, void* stream) {
  static_cast<Handle*>(handle)->stream = stream;
  static_cast<Handle*>(handle)->workspace = nullptr;
  return success;
}
int cublasSetWorkspace_v2(void* handle, void* workspace, std::size_t bytes) {
  if (!workspace || bytes == 0 || reinterpret_cast<std::uintptr_t>(workspace) % 256) return invalid_value;
  static_cast<Handle*>(handle)->workspace = workspace;
  return success;
}
int cublasSgemm_v2(void* h, int transa, int transb, int m, int n, int k, const float* alpha, const float* a, int lda,
                   const float* b, int ldb, const float* beta, float* c, int ldc) {
  return queue_gemm(h, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
int cublasDgemm_v2(void* h, int transa, int transb, int m, int n, int k, const double* alpha, const double* a, int lda,
                   const double* b, int ldb, const double* beta, double* c, int ldc) {
  return queue_gemm(h, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
const char* cublasGetStatusName(int s) {
  return s == success ? "CUBLAS_STATUS_SUCCESS" : s == not_supported ? "CUBLAS_STATUS_NOT_SUPPORTED" : "CUBLAS_STATUS_INVALID_VALUE";
}
const char* cublasGetStatusString(int s) {
  return s == success ? "success" : s == not_supported ? "the functionality requested is not supported"
                                                       : "an invalid numeric value was used as an argument";
}

int cublasLtCreate(void** handle) {
  *handle = new Handle;
  return success;
}
int cublasLtMatmulDescCreate(void** desc, int compute, int) {
  *desc = new MatmulDesc{compute};
  return success;
}
int cublasLtMatmulDescDestroy(void* desc) {
  delete static_cast<MatmulDesc*>(desc);
  return success;
}
int cublasLtMatmulDescSetAttribute(void* desc, int attribute, const void* value, std::size_t bytes) {
  auto& d = *static_cast<MatmulDesc*>(desc);
  switch (attribute) {
    case 3: if (bytes != sizeof(int)) return invalid_value; d.transa = *static_cast<const int*>(value); return success;
    case 4: if (bytes != sizeof(int)) return invalid_value; d.transb = *static_cast<const int*>(value); return success;
    case 7: if (bytes != 4) return invalid_value; d.epilogue = *static_cast<const std::uint32_t*>(value); return success;
    case 8: if (bytes != sizeof(void*)) return invalid_value; d.bias = *static_cast<const void* const*>(value); return success;
  }
  return invalid_value;
}
int cublasLtMatrixLayoutCreate(void** layout, int type, std::uint64_t rows, std::uint64_t cols, std::int64_t ld) {
  if (ld < static_cast<std::int64_t>(rows)) return invalid_value;
  *layout = new Layout{type, rows, cols, ld};
  return success;
}
int cublasLtMatrixLayoutDestroy(void* layout) {
  delete static_cast<Layout*>(layout);
  return success;
}
int cublasLtMatmulPreferenceCreate(void** preference) {
  *preference = new Preference;
  return success;
}
int cublasLtMatmulPreferenceDestroy(void* preference) {
  delete static_cast<Preference*>(preference);
  return success;
}
int cublasLtMatmulPreferenceSetAttribute(void* preference, int attribute, const void* value, std::size_t bytes) {
  auto& p = *static_cast<Preference*>(preference);
  if (attribute == 1 && bytes == 8) return success;  // MAX_WORKSPACE_BYTES
  if (attribute >= 5 && attribute <= 8 && bytes == 4) {  // MIN_ALIGNMENT_{A,B,C,D}_BYTES
    p.alignment[attribute - 5] = *static_cast<const std::uint32_t*>(value);
    return success;
  }
  return invalid_value;
}
// The algorithm it picks needs the alignments it was promised: the
// preferences' for A, B, C and D, and the bias pointer's as the descriptor
// held it (a null one promises nothing less than 256).
int cublasLtMatmulAlgoGetHeuristic(void*, void* desc, void*, void*, void*, void*, void* preference, int requested,
                                   HeuristicResult* results, int* found) {
  if (requested < 1) return invalid_value;
  const auto& p = *static_cast<Preference*>(preference);
  results[0] = HeuristicResult{};
  for (int i = 0; i < 4; ++i) results[0].algo.data[i] = p.alignment[i];
  results[0].algo.data[4] = alignment_of(static_cast<MatmulDesc*>(desc)->bias);
  *found = 1;
  return success;
}
int cublasLtMatmul(void* handle, void* desc, const void* alpha, const void* a, void* a_layout, const void* b,
                   void* b_layout, const void* beta, const void* c, void*, void* d, void* d_layout, const void* algo,
                   void*, std::size_t, void* stream) {
  const auto& md = *static_cast<MatmulDesc*>(desc);
  const auto* promised = static_cast<const Algo*>(algo)->data;
  const void* pointers[] = {a, b, c, d, md.bias};
  for (int i = 0; i < 5; ++i)
    if (alignment_of(pointers[i]) < promised[i]) {
      ++misaligned;
      return not_supported;
    }
  const auto &la = *static_cast<Layout*>(a_layout), &lb = *static_cast<Layout*>(b_layout),
             &ld = *static_cast<Layout*>(d_layout);
  if (c != d || ((md.epilogue & epilogue_bias) && !md.bias)) return invalid_value;
  const std::uint64_t k_a = md.transa ? la.rows : la.cols, k_b = md.transb ? lb.cols : lb.rows;
  if (k_a != k_b || (md.transa ? la.cols : la.rows) != ld.rows || (md.transb ? lb.rows : lb.cols) != ld.cols)
    return invalid_value;
  ++lt_matmuls;
  (void)handle;
  last_compute = md.compute;
  if (la.type == 2 || la.type == 14)  // CUDA_R_16F, CUDA_R_16BF: computed in float here
    hybra_fake_cuda_on_stream(stream, [=, alpha = *static_cast<const float*>(alpha), beta = *static_cast<const float*>(beta)] {
      if (la.type == 2) lt_matmul_16<hybra::float16_t>(md, la, lb, ld, alpha, a, b, beta, d);
      else lt_matmul_16<hybra::bfloat16_t>(md, la, lb, ld, alpha, a, b, beta, d);
    });
  else if (md.compute == 68 || md.compute == 77)  // CUBLAS_COMPUTE_32F, or its FAST_TF32 (computed in float here)
    hybra_fake_cuda_on_stream(stream, [=, alpha = *static_cast<const float*>(alpha), beta = *static_cast<const float*>(beta)] {
      lt_matmul(md, la, lb, ld, alpha, static_cast<const float*>(a), static_cast<const float*>(b), beta, static_cast<float*>(d));
    });
  else
    hybra_fake_cuda_on_stream(stream, [=, alpha = *static_cast<const double*>(alpha), beta = *static_cast<const double*>(beta)] {
      lt_matmul(md, la, lb, ld, alpha, static_cast<const double*>(a), static_cast<const double*>(b), beta, static_cast<double*>(d));
    });
  return success;
}
const char* cublasLtGetStatusName(int s) { return cublasGetStatusName(s); }
const char* cublasLtGetStatusString(int s) { return cublasGetStatusString(s); }

// Test hooks.
long hybra_fake_cublas_gemms() { return gemms.load(); }
long hybra_fake_cublas_lt_matmuls() { return lt_matmuls.load(); }
long hybra_fake_cublas_misaligned() { return misaligned.load(); }
int hybra_fake_cublas_math_mode() { return math_mode.load(); }
int hybra_fake_cublas_last_compute() { return last_compute.load(); }
}
