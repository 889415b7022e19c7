#pragma once
// embedding on a GPU, as include/hybra/ops/embedding.hpp computes it on the
// CPU (which writes the entries and launches them); tests run it on the CPU
// (tests/unit/simt.hpp). The indices (count of them, any dtype; floats hold
// whole numbers) pick rows of a (rows, width) table; an index that is not
// one of its rows is reported (bad_input.cuh), and its row of the result is
// zeros, or, in the gradient, adds nowhere.
#include "bad_input.cuh"
#include "grid.cuh"

namespace hybra::kernels {

// The row index i names, or -1 where it names none.
template <class I>
__device__ long long embedding_row(I index, long long rows) {
  const double value = static_cast<double>(index);
  if (!(value >= 0 && value < static_cast<double>(rows))) return -1;
  const long long row = static_cast<long long>(index);
  return static_cast<I>(row) == index ? row : -1;
}

// y[i, c] = table[indices[i], c], a thread per element of y.
template <class I, class T>
__device__ void embedding_gather(const I* indices, const T* table, T* y, long long count, long long rows,
                                 long long width, bad_input_report* report, unsigned int op) {
  for (long long e = first_element(); e < count * width; e += grid_stride()) {
    const long long i = e / width, c = e % width;
    const long long row = embedding_row(indices[i], rows);
    if (row < 0 && c == 0) report_bad_input(report, op, static_cast<double>(indices[i]), i, rows);
    y[e] = row < 0 ? T(0) : table[row * width + c];
  }
}

// d_table[indices[i], c] += dy[i, c], a thread per element of dy, into a
// d_table of zeros: rows picked more than once add in the order the threads
// reach them.
template <class I, class T>
__device__ void embedding_scatter_add(const I* indices, const T* dy, T* d_table, long long count, long long rows,
                                      long long width, bad_input_report* report, unsigned int op) {
  for (long long e = first_element(); e < count * width; e += grid_stride()) {
    const long long i = e / width, c = e % width;
    const long long row = embedding_row(indices[i], rows);
    if (row < 0) {
      if (c == 0) report_bad_input(report, op, static_cast<double>(indices[i]), i, rows);
      continue;
    }
    atomicAdd(d_table + row * width + c, dy[e]);
  }
}

}  // namespace hybra::kernels
