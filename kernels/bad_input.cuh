#pragma once
// How a kernel reports bad input it finds (an index outside its table): it
// cannot throw, so the first thread to find some writes what it found into
// its GPU's report, pinned host memory that the GPU writes directly; the host
// reads it when it next waits for that GPU and raises the error there
// (include/hybra/backend/cuda/bad_input.hpp, which mirrors this layout).

namespace hybra::kernels {

struct bad_input_report {
  unsigned int op;  // the code of the op that found it (the host's registry); 0: nothing found
  unsigned int unused;
  double value;        // the bad index
  long long position;  // its element's number in the indices, flattened
  long long bound;     // the size of what it indexes
};

// Claims the report for the first finder; later finders leave it as it is.
__device__ inline void report_bad_input(bad_input_report* report, unsigned int op, double value,
                                        long long position, long long bound) {
  if (atomicCAS(&report->op, 0u, op) != 0u) return;
  report->value = value;
  report->position = position;
  report->bound = bound;
}

}  // namespace hybra::kernels
