// A stand-in for cuBLAS (libcublas.so), beside the stand-in driver
// (fake_driver.cpp), whose GPU memory is host memory: its GEMMs compute, on
// the host and column-major as cuBLAS does, so the tests check that hybra
// hands row-major products, transposed views and batches to cuBLAS right.
#include <atomic>
#include <cstdint>

namespace {

constexpr int success = 0, invalid_value = 7;

template <class T>
int gemm(int transa, int transb, int m, int n, int k, const T* alpha, const T* a, int lda, const T* b, int ldb,
         const T* beta, T* c, int ldc) {
  if (m < 0 || n < 0 || k < 0 || ldc < m) return invalid_value;
  auto at = [&](int i, int p) { return transa ? a[p + static_cast<std::int64_t>(i) * lda] : a[i + static_cast<std::int64_t>(p) * lda]; };
  auto bt = [&](int p, int j) { return transb ? b[j + static_cast<std::int64_t>(p) * ldb] : b[p + static_cast<std::int64_t>(j) * ldb]; };
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      T sum = 0;
      for (int p = 0; p < k; ++p) sum += at(i, p) * bt(p, j);
      T& out = c[i + static_cast<std::int64_t>(j) * ldc];
      out = *alpha * sum + (*beta == T(0) ? T(0) : *beta * out);
    }
  return success;
}

std::atomic<long> gemms{0};

}  // namespace

extern "C" {
int cublasCreate_v2(void** handle) {
  static int the_handle;
  *handle = &the_handle;
  return success;
}
int cublasSetStream_v2(void*, void*) { return success; }
int cublasSgemm_v2(void*, int transa, int transb, int m, int n, int k, const float* alpha, const float* a, int lda,
                   const float* b, int ldb, const float* beta, float* c, int ldc) {
  ++gemms;
  return gemm(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
int cublasDgemm_v2(void*, int transa, int transb, int m, int n, int k, const double* alpha, const double* a, int lda,
                   const double* b, int ldb, const double* beta, double* c, int ldc) {
  ++gemms;
  return gemm(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
const char* cublasGetStatusName(int s) { return s == success ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_INVALID_VALUE"; }
const char* cublasGetStatusString(int s) { return s == success ? "success" : "an invalid numeric value was used as an argument"; }

// Test hook.
long hybra_fake_cublas_gemms() { return gemms.load(); }
}
