#pragma once
// Reductions on a GPU: one step reduces the middle axis of a contiguous
// (O, R, I) block, or a piece of it, as include/hybra/ops/reduce.hpp does on
// the CPU, and include/hybra/backend/cuda/reduce.hpp plans the steps of a whole
// reduction and launches them.
//
// A policy says how values become accumulators (load: the element and its
// index along the reduced axis), how two accumulators combine, and what an
// accumulator finally is (finish). Every combine is commutative, ties in
// argmax included (the lower index wins), so threads may combine in any
// order and a result does not depend on the launch's shape, except for the
// rounding of sums, which accumulate in double (floats) or modulo 2^64
// (integers) as on the CPU.
//
// NVRTC compiles this file with the op's types (backend/cuda/reduce.hpp writes
// the __global__ entries); nvcc could include it too; and tests run it on the
// CPU with threads standing in for a block's (tests/unit/simt.hpp), since
// nothing here is more than C++ with CUDA's thread indices, __shared__ and
// __syncthreads.

#if defined(HYBRA_KERNELS_CUB)
#include <cub/warp/warp_reduce.cuh>
#endif

namespace hybra::kernels {

// The most threads a block of these kernels has: the size of their
// __shared__ buffers.
constexpr unsigned max_block_threads = 256;

// Rows (or pieces of rows) of at most this many elements are reduced by a
// warp each, a block's warps taking a row apiece: its lanes combine without
// a block barrier, and a short row does not leave most of a block idle.
// Longer ones take a whole block each.
constexpr long long warp_row_limit = 1024;

template <class Acc>
struct reduce_sum {
  using acc = Acc;
  template <class In>
  __device__ static Acc load(In v, long long) { return static_cast<Acc>(v); }
  __device__ static Acc combine(Acc a, Acc b) { return a + b; }
  template <class Out>
  __device__ static Out finish(Acc a, long long) { return static_cast<Out>(a); }
};

struct reduce_mean : reduce_sum<double> {
  template <class Out>
  __device__ static Out finish(double a, long long count) { return static_cast<Out>(a / static_cast<double>(count)); }
};

// NaN wins, so that max and min propagate it as NumPy's do.
template <class T, bool Max>
struct reduce_extreme {
  using acc = T;
  template <class In>
  __device__ static T load(In v, long long) { return v; }
  __device__ static T combine(T a, T b) {
    if (a != a) return a;
    if (Max) return (b > a || b != b) ? b : a;
    return (b < a || b != b) ? b : a;
  }
  template <class Out>
  __device__ static Out finish(T a, long long) { return a; }
};

template <class T>
struct arg_entry {
  T value;
  long long index;
};

// The first index of the maximum; a NaN counts as more than any number.
template <class T>
struct reduce_argmax {
  using acc = arg_entry<T>;
  __device__ static bool beats(T v, T w) { return v > w || (v != v && w == w); }
  template <class In>
  __device__ static acc load(In v, long long r) { return {v, r}; }
  __device__ static acc combine(acc a, acc b) {
    if (beats(a.value, b.value)) return a;
    if (beats(b.value, a.value)) return b;
    return b.index < a.index ? b : a;
  }
  template <class Out>
  __device__ static Out finish(acc a, long long) { return a.index; }
};

// An accumulator from an element of x: the input itself, or (FromAcc) an
// accumulator an earlier step wrote.
template <class P, bool FromAcc, class In>
__device__ typename P::acc load_at(const In* x, long long i, long long r) {
  if constexpr (FromAcc) return x[i];
  else return P::template load<In>(x[i], r);
}

// The accumulator for a piece, written where its step puts it: as an
// accumulator for a later step (ToAcc), or finished into the result.
template <class P, bool ToAcc, class Out>
__device__ void store_at(Out* out, long long i, typename P::acc a, long long count) {
  if constexpr (ToAcc) out[i] = a;
  else out[i] = P::template finish<Out>(a, count);
}

#if defined(HYBRA_KERNELS_CUB)
// P's combine as the function object CUB's primitives take.
template <class P>
struct combine_with {
  __device__ typename P::acc operator()(const typename P::acc& a, const typename P::acc& b) const {
    return P::combine(a, b);
  }
};

// Combines buf[0 .. active) into buf[0], the block's threads having written
// it and met at a barrier; every thread of the block calls it, and all see
// buf[0] after it. Each warp combines its 32 entries with CUB's WarpReduce
// (register shuffles, no barrier), then the first warp combines the warps'
// results: two barriers in all, where the tree below takes one per halving.
template <class P>
__device__ void block_combine(typename P::acc* buf, unsigned active) {
  using Acc = typename P::acc;
  using WarpReduce = cub::WarpReduce<Acc>;
  __shared__ typename WarpReduce::TempStorage warp_storage[max_block_threads / 32];
  __shared__ Acc warp_results[max_block_threads / 32];
  const unsigned t = threadIdx.x, warp = t / 32, warps = (active + 31) / 32;
  if (warp < warps) {
    const int valid = static_cast<int>(active - warp * 32 < 32 ? active - warp * 32 : 32);
    const Acc a = WarpReduce(warp_storage[warp]).Reduce(t < active ? buf[t] : buf[warp * 32], combine_with<P>{}, valid);
    if (t % 32 == 0) warp_results[warp] = a;
  }
  __syncthreads();
  if (warp == 0) {
    const Acc a = WarpReduce(warp_storage[0]).Reduce(t < warps ? warp_results[t] : warp_results[0], combine_with<P>{},
                                                     static_cast<int>(warps));
    if (t == 0) buf[0] = a;
  }
  __syncthreads();
}

// Combines the values `a` of the calling warp's lanes [0, active), which
// every lane of the warp passes (active is the same in all, and may be 0:
// then the result is meaningless); every lane gets the result. CUB's
// WarpReduce: register shuffles.
template <class P>
__device__ typename P::acc warp_combine(typename P::acc a, unsigned active) {
  using Acc = typename P::acc;
  using WarpReduce = cub::WarpReduce<Acc>;
  __shared__ typename WarpReduce::TempStorage storage[max_block_threads / 32];
  __shared__ Acc results[max_block_threads / 32];
  const unsigned warp = threadIdx.x / 32;
  if (active > 0) {
    const Acc r = WarpReduce(storage[warp]).Reduce(a, combine_with<P>{}, static_cast<int>(active));
    if (threadIdx.x % 32 == 0) results[warp] = r;
  }
  __syncwarp();
  const Acc r = results[warp];
  __syncwarp();  // results[warp] is the next call's
  return r;
}
#else
// Combines buf[0 .. active) into buf[0], the block's threads having written
// it and met at a barrier; every thread of the block calls it, and all see
// buf[0] after it. A tree in shared memory: a barrier per halving.
template <class P>
__device__ void block_combine(typename P::acc* buf, unsigned active) {
  unsigned width = 1;
  while (width < active) width *= 2;
  for (unsigned s = width / 2; s > 0; s /= 2) {
    if (threadIdx.x < s && threadIdx.x + s < active) buf[threadIdx.x] = P::combine(buf[threadIdx.x], buf[threadIdx.x + s]);
    __syncthreads();
  }
}

// Combines the values `a` of the calling warp's lanes [0, active), which
// every lane of the warp passes (active is the same in all, and may be 0:
// then the result is meaningless); every lane gets the result. A tree in
// the warp's part of shared memory, halved in place.
template <class P>
__device__ typename P::acc warp_combine(typename P::acc a, unsigned active) {
  __shared__ typename P::acc buf[max_block_threads];
  const unsigned lane = threadIdx.x % 32;
  typename P::acc* mine = buf + threadIdx.x / 32 * 32;
  mine[lane] = a;
  __syncwarp();
  for (unsigned s = 16; s > 0; s /= 2) {
    if (lane < s && lane + s < active) mine[lane] = P::combine(mine[lane], mine[lane + s]);
    __syncwarp();
  }
  const typename P::acc r = mine[0];
  __syncwarp();  // buf is the next call's
  return r;
}
#endif

// reduce_rows for pieces of at most warp_row_limit: a warp per piece, the
// block's warps taking consecutive pieces (blockDim.x a multiple of 32).
// Every warp makes the same number of turns, so that a block's warps meet
// the same barriers where simulated threads stand in for them.
template <class P, class In, class Out, bool FromAcc, bool ToAcc>
__device__ void reduce_rows_by_warp(const In* x, Out* out, long long O, long long R, long long len, long long count) {
  const long long pieces = (R + len - 1) / len, warps = blockDim.x / 32;
  const unsigned lane = threadIdx.x % 32;
  for (long long first = blockIdx.x * warps; first < O * pieces; first += gridDim.x * warps) {
    const long long b = first + threadIdx.x / 32;
    unsigned active = 0;
    typename P::acc a{};
    if (b < O * pieces) {
      const long long o = b / pieces, r0 = (b % pieces) * len, r1 = r0 + len < R ? r0 + len : R;
      active = r1 - r0 < 32 ? static_cast<unsigned>(r1 - r0) : 32;
      if (lane < active) {
        a = load_at<P, FromAcc>(x, o * R + r0 + lane, r0 + lane);
        long long r = r0 + lane + 32;
        for (; r + 96 < r1; r += 128) {
          const typename P::acc a0 = load_at<P, FromAcc>(x, o * R + r, r);
          const typename P::acc a1 = load_at<P, FromAcc>(x, o * R + r + 32, r + 32);
          const typename P::acc a2 = load_at<P, FromAcc>(x, o * R + r + 64, r + 64);
          const typename P::acc a3 = load_at<P, FromAcc>(x, o * R + r + 96, r + 96);
          a = P::combine(a, P::combine(P::combine(a0, a1), P::combine(a2, a3)));
        }
        for (; r < r1; r += 32) a = P::combine(a, load_at<P, FromAcc>(x, o * R + r, r));
      }
    }
    a = warp_combine<P>(a, active);
    if (active > 0 && lane == 0) store_at<P, ToAcc>(out, b, a, count);
  }
}

// I == 1: x is (O, R); each of the O * pieces blocks' worth of work (grid
// stride) is one piece of len elements of one row, reduced by the whole
// block, or by a warp where pieces are short (reduce_rows_by_warp); out is
// (O, pieces).
template <class P, class In, class Out, bool FromAcc, bool ToAcc>
__device__ void reduce_rows(const In* x, Out* out, long long O, long long R, long long len, long long count) {
  if (len <= warp_row_limit) return reduce_rows_by_warp<P, In, Out, FromAcc, ToAcc>(x, out, O, R, len, count);
  __shared__ typename P::acc buf[max_block_threads];
  const long long pieces = (R + len - 1) / len;
  const unsigned t = threadIdx.x;
  for (long long b = blockIdx.x; b < O * pieces; b += gridDim.x) {
    const long long o = b / pieces, r0 = (b % pieces) * len, r1 = r0 + len < R ? r0 + len : R;
    const unsigned active = r1 - r0 < blockDim.x ? static_cast<unsigned>(r1 - r0) : blockDim.x;
    if (t < active) {
      // Four loads in flight per thread before their combine (a memory-bound
      // pass needs them); combines commute, so the order changes no result
      // but a sum's rounding.
      const long long step = blockDim.x;
      typename P::acc a = load_at<P, FromAcc>(x, o * R + r0 + t, r0 + t);
      long long r = r0 + t + step;
      for (; r + 3 * step < r1; r += 4 * step) {
        const typename P::acc a0 = load_at<P, FromAcc>(x, o * R + r, r);
        const typename P::acc a1 = load_at<P, FromAcc>(x, o * R + r + step, r + step);
        const typename P::acc a2 = load_at<P, FromAcc>(x, o * R + r + 2 * step, r + 2 * step);
        const typename P::acc a3 = load_at<P, FromAcc>(x, o * R + r + 3 * step, r + 3 * step);
        a = P::combine(a, P::combine(P::combine(a0, a1), P::combine(a2, a3)));
      }
      for (; r < r1; r += step) a = P::combine(a, load_at<P, FromAcc>(x, o * R + r, r));
      buf[t] = a;
    }
    __syncthreads();
    block_combine<P>(buf, active);
    if (t == 0) store_at<P, ToAcc>(out, b, buf[0], count);
    __syncthreads();
  }
}

// I > 1: x is (O, R, I); each thread reduces one column j of one piece of
// len rows (consecutive threads read consecutive columns); out is
// (O, pieces, I).
template <class P, class In, class Out, bool FromAcc, bool ToAcc>
__device__ void reduce_columns(const In* x, Out* out, long long O, long long R, long long I, long long len,
                               long long count) {
  const long long pieces = (R + len - 1) / len, total = O * pieces * I;
  const long long stride = static_cast<long long>(blockDim.x) * gridDim.x;
  for (long long k = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; k < total; k += stride) {
    const long long j = k % I, c = k / I % pieces, o = k / I / pieces;
    const long long r0 = c * len, r1 = r0 + len < R ? r0 + len : R;
    const In* column = x + o * R * I + j;
    typename P::acc a = load_at<P, FromAcc>(column, r0 * I, r0);
    for (long long r = r0 + 1; r < r1; ++r) a = P::combine(a, load_at<P, FromAcc>(column, r * I, r));
    store_at<P, ToAcc>(out, k, a, count);
  }
}

}  // namespace hybra::kernels
