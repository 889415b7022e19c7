#pragma once
// cumsum on a GPU, as include/hybra/ops/cumsum.hpp computes it on the CPU
// (which writes the entries, picks one per shape and launches it); tests
// run it on the CPU (tests/unit/simt.hpp).
//
// x is seen as (outer, R, inner), a column being the R elements of one
// (outer, inner) place, summed along R from the first element or (reverse)
// from the last. Two kernels:
// - cumsum_by_thread: a thread per column, adding in the order the CPU
//   adds, so its results are the CPU's bit for bit; it needs many columns
//   to fill a GPU;
// - cumsum_by_block: a block per column, in tiles of scan_items elements
//   per thread: each thread adds its own items, the block scans the
//   threads' totals (block_exclusive_sum), and a running carry joins the
//   tiles. Floats add in another order than the CPU's, so their sums
//   agree with the CPU's to rounding; integers agree exactly.
// block_exclusive_sum has two versions, as reduce.cuh's block_combine has:
// CUB's BlockScan (HYBRA_KERNELS_CUB) or a shared-memory tree, the one
// simulated threads can run.
#include "grid.cuh"

#if defined(HYBRA_KERNELS_CUB)
#include <cub/block/block_scan.cuh>
#endif

namespace hybra::kernels {

// The threads of a block of cumsum_by_block (CUB's BlockScan fixes it at
// compile time; the tree scans any blockDim.x up to it) and the elements
// each thread adds on its own per tile.
constexpr unsigned scan_block_threads = 256;
constexpr int scan_items = 4;

template <class In, class Out>
__device__ void cumsum_by_thread(const In* x, Out* y, long long outer, long long R, long long inner, bool reverse) {
  const long long columns = outer * inner;
  for (long long c = first_element(); c < columns; c += grid_stride()) {
    const long long start = c / inner * R * inner + c % inner;
    Out acc = 0;
    for (long long k = 0; k < R; ++k) {
      const long long at = start + (reverse ? R - 1 - k : k) * inner;
      acc += static_cast<Out>(x[at]);
      y[at] = acc;
    }
  }
}

#if defined(HYBRA_KERNELS_CUB)
// The sum of `value` over the block's threads before this one; `total`
// gets the sum over all of them. Every thread of the block calls it.
template <class T>
__device__ T block_exclusive_sum(T value, T& total) {
  using Scan = cub::BlockScan<T, scan_block_threads>;
  __shared__ typename Scan::TempStorage storage;
  T before;
  Scan(storage).ExclusiveSum(value, before, total);
  __syncthreads();  // storage is the next call's
  return before;
}
#else
// The sum of `value` over the block's threads before this one; `total`
// gets the sum over all of them. Every thread of the block calls it. A
// Hillis-Steele scan in shared memory: a doubling offset, two barriers
// per doubling.
template <class T>
__device__ T block_exclusive_sum(T value, T& total) {
  __shared__ T sums[scan_block_threads];
  const unsigned t = threadIdx.x;
  sums[t] = value;
  __syncthreads();
  for (unsigned offset = 1; offset < blockDim.x; offset *= 2) {
    const T earlier = t >= offset ? sums[t - offset] : T(0);
    __syncthreads();
    sums[t] = earlier + sums[t];
    __syncthreads();
  }
  total = sums[blockDim.x - 1];
  const T before = t ? sums[t - 1] : T(0);
  __syncthreads();  // sums is the next call's
  return before;
}
#endif

template <class In, class Out>
__device__ void cumsum_by_block(const In* x, Out* y, long long outer, long long R, long long inner, bool reverse) {
  const long long columns = outer * inner, tile = static_cast<long long>(blockDim.x) * scan_items;
  for (long long c = blockIdx.x; c < columns; c += gridDim.x) {
    const long long start = c / inner * R * inner + c % inner;
    Out carry = 0;
    for (long long first = 0; first < R; first += tile) {
      const long long mine = first + static_cast<long long>(threadIdx.x) * scan_items;
      Out running[scan_items];
      Out own = 0;
      for (int k = 0; k < scan_items; ++k) {
        const long long r = mine + k;
        if (r < R) own += static_cast<Out>(x[start + (reverse ? R - 1 - r : r) * inner]);
        running[k] = own;
      }
      Out tile_total;
      const Out before = carry + block_exclusive_sum(own, tile_total);
      for (int k = 0; k < scan_items; ++k) {
        const long long r = mine + k;
        if (r < R) y[start + (reverse ? R - 1 - r : r) * inner] = before + running[k];
      }
      carry += tile_total;
    }
  }
}

}  // namespace hybra::kernels
