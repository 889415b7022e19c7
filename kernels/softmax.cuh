#pragma once
// softmax and log_softmax on a GPU along the middle axis of a contiguous
// (O, R, I) block, computed as include/hybra/ops/softmax.hpp does on the
// CPU: the maximum is subtracted before exp, the exp sums accumulate in
// double, and log_softmax is x - max - log(sum), never log(softmax).
// include/hybra/backend/cuda/reduce.hpp launches them; tests run them on the
// CPU (tests/unit/simt.hpp).
#include "reduce.cuh"

namespace hybra::kernels {

__device__ inline float exp_of(float x) { return ::expf(x); }
__device__ inline double exp_of(double x) { return ::exp(x); }

template <bool Log, class T>
__device__ T normalised(T x, T max, double sum) {
  if constexpr (Log) return (x - max) - static_cast<T>(::log(sum));
  else return exp_of(x - max) * static_cast<T>(1 / sum);
}

// softmax_rows for rows of at most warp_row_limit: a warp per row, the
// block's warps taking consecutive rows (blockDim.x a multiple of 32), every
// warp making the same number of turns (see reduce_rows_by_warp).
template <bool Log, class T>
__device__ void softmax_rows_by_warp(const T* x, T* y, long long O, long long R) {
  const long long warps = blockDim.x / 32;
  const unsigned lane = threadIdx.x % 32, active = R < 32 ? static_cast<unsigned>(R) : 32;
  for (long long first = blockIdx.x * warps; first < O; first += gridDim.x * warps) {
    const long long o = first + threadIdx.x / 32;
    const bool mine = o < O;
    const T* row = x + (mine ? o : 0) * R;
    T m = 0;
    if (mine && lane < active) {
      m = row[lane];
      for (long long r = lane + 32; r < R; r += 32) m = reduce_extreme<T, true>::combine(m, row[r]);
    }
    m = warp_combine<reduce_extreme<T, true>>(m, mine ? active : 0);
    double s = 0;
    if (mine)
      for (long long r = lane; r < R; r += 32) s += exp_of(row[r] - m);
    s = warp_combine<reduce_sum<double>>(s, mine ? 32 : 0);
    if (mine)
      for (long long r = lane; r < R; r += 32) y[o * R + r] = normalised<Log>(row[r], m, s);
  }
}

// I == 1: one row of R per block (grid stride over the O rows), or per warp
// where rows are short (softmax_rows_by_warp).
template <bool Log, class T>
__device__ void softmax_rows(const T* x, T* y, long long O, long long R) {
  if (R <= warp_row_limit) return softmax_rows_by_warp<Log>(x, y, O, R);
  __shared__ T maxima[max_block_threads];
  __shared__ double sums[max_block_threads];
  const unsigned t = threadIdx.x;
  const unsigned active = R < blockDim.x ? static_cast<unsigned>(R) : blockDim.x;
  for (long long o = blockIdx.x; o < O; o += gridDim.x) {
    const T* row = x + o * R;
    if (t < active) {
      T m = row[t];
      for (long long r = t + blockDim.x; r < R; r += blockDim.x) m = reduce_extreme<T, true>::combine(m, row[r]);
      maxima[t] = m;
    }
    __syncthreads();
    block_combine<reduce_extreme<T, true>>(maxima, active);
    const T m = maxima[0];
    double s = 0;
    for (long long r = t; r < R; r += blockDim.x) s += exp_of(row[r] - m);
    sums[t] = s;
    __syncthreads();
    block_combine<reduce_sum<double>>(sums, blockDim.x);
    const double total = sums[0];
    for (long long r = t; r < R; r += blockDim.x) y[o * R + r] = normalised<Log>(row[r], m, total);
    __syncthreads();
  }
}

// I > 1: one thread per column (o, j), walking its R elements three times.
template <bool Log, class T>
__device__ void softmax_columns(const T* x, T* y, long long O, long long R, long long I) {
  const long long stride = static_cast<long long>(blockDim.x) * gridDim.x;
  for (long long k = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; k < O * I; k += stride) {
    const long long at = k / I * R * I + k % I;
    T m = x[at];
    for (long long r = 1; r < R; ++r) m = reduce_extreme<T, true>::combine(m, x[at + r * I]);
    double s = 0;
    for (long long r = 0; r < R; ++r) s += exp_of(x[at + r * I] - m);
    for (long long r = 0; r < R; ++r) y[at + r * I] = normalised<Log>(x[at + r * I], m, s);
  }
}

}  // namespace hybra::kernels
