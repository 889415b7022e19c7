#pragma once
// A copy between two layouts of one shape on a GPU: what gathers a view into
// a contiguous tensor, writes a value into a view (assign, concat's parts,
// slice's gradient) or moves a tensor between views. One kernel serves every
// shape and stride (they are its parameter, not constants of its code), so
// no layout costs a compile. include/hybra/backend/cuda/layout.hpp collapses the
// layouts and launches it; tests run it on the CPU (tests/unit/simt.hpp).
#include "grid.cuh"

namespace hybra::kernels {

// Axes of one shape, in element strides on each side (strides may be
// negative or zero), after backend/cuda/layout.hpp has merged the axes both
// sides walk alike: few remain for any view the ops make.
constexpr int copy_max_axes = 6;
struct copy_layout {
  int axes;
  long long extent[copy_max_axes], from[copy_max_axes], to[copy_max_axes];
};

// to[element's offset in `to`] = from[its offset in `from`], for every
// element of the shape (count of them: the product of the extents).
template <class T>
__device__ void copy_between_layouts(const T* from, T* to, copy_layout l, long long count) {
  for (long long i = first_element(); i < count; i += grid_stride()) {
    long long rest = i, src = 0, dst = 0;
    for (int a = l.axes - 1; a >= 0; --a) {
      const long long c = rest % l.extent[a];
      rest /= l.extent[a];
      src += c * l.from[a];
      dst += c * l.to[a];
    }
    to[dst] = from[src];
  }
}

}  // namespace hybra::kernels
