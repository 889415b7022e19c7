#pragma once
// cumsum on a GPU, as include/hybra/ops/cumsum.hpp computes it on the CPU
// (which writes the entries, picks one per shape and launches it); tests
// run it on the CPU (tests/unit/simt.hpp).
//
// x is seen as (outer, R, inner), a column being the R elements of one
// (outer, inner) place, summed along R from the first element or (reverse)
// from the last. Three kernels:
// - cumsum_by_thread: a thread per column, adding in the order the CPU
//   adds, so its results are the CPU's bit for bit; it needs many columns
//   to fill a GPU;
// - cumsum_by_block: a block per column, in tiles of scan_items elements
//   per thread: each thread adds its own items, the block scans the
//   threads' totals (block_exclusive_sum), and a running carry joins the
//   tiles;
// - cumsum_by_chunks, for columns too long and too few for a block each:
//   three launches over chunks of whole tiles, a block per chunk (below).
// Floats in a block's scan add in another order than the CPU's, so their
// sums agree with the CPU's to rounding; integers agree exactly.
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

// Where row r (counted in the scan's direction) of the column starting at
// `start` lies.
__device__ inline long long scan_element(long long start, long long R, long long inner, bool reverse, long long r) {
  return start + (reverse ? R - 1 - r : r) * inner;
}

__device__ inline long long column_start(long long c, long long R, long long inner) {
  return c / inner * R * inner + c % inner;
}

template <class In, class Out>
__device__ void cumsum_by_thread(const In* x, Out* y, long long outer, long long R, long long inner, bool reverse) {
  const long long columns = outer * inner;
  for (long long c = first_element(); c < columns; c += grid_stride()) {
    const long long start = column_start(c, R, inner);
    Out acc = 0;
    for (long long k = 0; k < R; ++k) {
      const long long at = scan_element(start, R, inner, reverse, k);
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

// The running sums of rows [from, to) of one column, after `carry`, by the
// whole block, a tile at a time.
template <class In, class Out>
__device__ void scan_rows(const In* x, Out* y, long long start, long long R, long long inner, bool reverse,
                          long long from, long long to, Out carry) {
  const long long tile = static_cast<long long>(blockDim.x) * scan_items;
  for (long long first = from; first < to; first += tile) {
    const long long mine = first + static_cast<long long>(threadIdx.x) * scan_items;
    Out running[scan_items];
    Out own = 0;
    for (int k = 0; k < scan_items; ++k) {
      if (mine + k < to) own += static_cast<Out>(x[scan_element(start, R, inner, reverse, mine + k)]);
      running[k] = own;
    }
    Out tile_total;
    const Out before = carry + block_exclusive_sum(own, tile_total);
    for (int k = 0; k < scan_items; ++k)
      if (mine + k < to) y[scan_element(start, R, inner, reverse, mine + k)] = before + running[k];
    carry += tile_total;
  }
}

template <class In, class Out>
__device__ void cumsum_by_block(const In* x, Out* y, long long outer, long long R, long long inner, bool reverse) {
  for (long long c = blockIdx.x; c < outer * inner; c += gridDim.x)
    scan_rows(x, y, column_start(c, R, inner), R, inner, reverse, 0, R, Out(0));
}

// cumsum_by_chunks: each column is cut into chunks of `chunk` rows (whole
// tiles), chunk j of column c being number c * chunks + j, and scanned by
// three launches:
// 1. cumsum_chunk_totals: a block per chunk writes its sum to totals;
// 2. cumsum_chunk_carries: cumsum_by_block over totals seen as (columns,
//    chunks, 1), in place, so that each chunk's entry becomes the sum of
//    its column's chunks up to and including it;
// 3. cumsum_chunks: a block per chunk scans it after the carry of the
//    chunks before it (the entry before its own).
__device__ inline long long chunk_count(long long R, long long chunk) { return (R + chunk - 1) / chunk; }

template <class In, class Out>
__device__ void cumsum_chunk_totals(const In* x, Out* totals, long long outer, long long R, long long inner,
                                    bool reverse, long long chunk) {
  const long long chunks = chunk_count(R, chunk);
  for (long long n = blockIdx.x; n < outer * inner * chunks; n += gridDim.x) {
    const long long start = column_start(n / chunks, R, inner), from = n % chunks * chunk;
    const long long to = from + chunk < R ? from + chunk : R;
    Out own = 0;
    for (long long r = from + threadIdx.x; r < to; r += blockDim.x)
      own += static_cast<Out>(x[scan_element(start, R, inner, reverse, r)]);
    Out total;
    block_exclusive_sum(own, total);
    if (threadIdx.x == 0) totals[n] = total;
  }
}

template <class Out>
__device__ void cumsum_chunk_carries(Out* totals, long long columns, long long R, long long chunk) {
  cumsum_by_block(totals, totals, columns, chunk_count(R, chunk), 1LL, false);
}

template <class In, class Out>
__device__ void cumsum_chunks(const In* x, const Out* carries, Out* y, long long outer, long long R, long long inner,
                              bool reverse, long long chunk) {
  const long long chunks = chunk_count(R, chunk);
  for (long long n = blockIdx.x; n < outer * inner * chunks; n += gridDim.x) {
    const long long from = n % chunks * chunk;
    scan_rows(x, y, column_start(n / chunks, R, inner), R, inner, reverse, from, from + chunk < R ? from + chunk : R,
              from ? carries[n - 1] : Out(0));
  }
}

}  // namespace hybra::kernels
