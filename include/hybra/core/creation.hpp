#pragma once
// Creating tensors: filled, ranges, from C++ containers, random.
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <initializer_list>
#include <type_traits>
#include <vector>

#include "../backend/cpu/threads.hpp"
#include "../engine/push.hpp"
#include "random.hpp"
#include "tensor.hpp"

namespace hybra {

namespace detail {
// On a GPU, a fill of 1- or 4-byte elements (or 8-byte ones whose halves
// match, as zero's) is a memset on the stream; other 8-byte values are
// filled on the host and copied.
template <class V>
Tensor full_on_gpu(const Shape& shape, V value, DType dtype, Device device);
}  // namespace detail

template <class V>
Tensor full(const Shape& shape, V value, DType dtype = DType::float32, Device device = cpu()) {
  static_assert(std::is_arithmetic_v<V>, "hybra::full: the fill value must be an arithmetic scalar");
  if (device.kind == DeviceKind::cuda) return detail::full_on_gpu(shape, value, dtype, device);
  Tensor t(shape, dtype, device);
  push_kernel("full", {}, {t}, [t, value] {
    dispatch_stored(t.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      T* p = static_cast<T*>(t.raw_data());
      T v = static_cast<T>(value);
      backend::cpu::parallel_for(t.size(), 1, [&](std::int64_t b, std::int64_t e) { std::fill(p + b, p + e, v); });
    });
  });
  return t;
}
template <class V>
Tensor detail::full_on_gpu(const Shape& shape, V value, DType dtype, Device device) {
  return dispatch_stored(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T v = static_cast<T>(value);
    std::uint32_t words[2] = {};
    std::memcpy(words, &v, sizeof(T));
    if (sizeof(T) == 8 && words[0] != words[1]) return full(shape, value, dtype, cpu()).to(device);
    Tensor t(shape, dtype, device);
    constexpr int width = sizeof(T) < 4 ? static_cast<int>(sizeof(T)) : 4;
    const auto count = static_cast<std::size_t>(t.size()) * sizeof(T) / static_cast<std::size_t>(width);
    push_op_on(device, "full", {}, {t}, [t, pattern = words[0], count] {
      backend::cuda::gpu(t.device().id)
          .fill(reinterpret_cast<backend::cuda::CUdeviceptr>(t.raw_data()), pattern, width, count);
    });
    return t;
  });
}

inline Tensor zeros(const Shape& shape, DType dtype = DType::float32, Device device = cpu()) {
  return full(shape, 0, dtype, device);
}
inline Tensor ones(const Shape& shape, DType dtype = DType::float32, Device device = cpu()) {
  return full(shape, 1, dtype, device);
}

// [start, stop) in steps of step, as NumPy's arange.
inline Tensor arange(double start, double stop, double step = 1, DType dtype = DType::float32, Device device = cpu()) {
  if (step == 0 || !std::isfinite(start) || !std::isfinite(stop) || !std::isfinite(step))
    fail<ValueError>("arange: start ", start, ", stop ", stop, " and step ", step, " must be finite with step != 0");
  if (device.kind == DeviceKind::cuda) return arange(start, stop, step, dtype, cpu()).to(device);
  double count = std::ceil((stop - start) / step);
  if (count > 9.0e18) fail<ShapeError>("arange: ", count, " elements do not fit in int64");
  Tensor t(Shape{std::max<std::int64_t>(0, static_cast<std::int64_t>(count))}, dtype, device);
  push_kernel("arange", {}, {t}, [t, start, step] {
    dispatch_stored(t.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      T* p = static_cast<T*>(t.raw_data());
      for (std::int64_t i = 0; i < t.size(); ++i) p[i] = static_cast<T>(start + static_cast<double>(i) * step);
    });
  });
  return t;
}
inline Tensor arange(double stop) { return arange(0, stop); }

// A tensor holding `values` in the given shape.
template <class T>
Tensor array(const std::vector<T>& values, const Shape& shape, Device device = cpu()) {
  static_assert(is_dtype_v<T>, "hybra::array: element type must be float, double, std::int32_t, std::int64_t, "
                               "std::uint8_t, hybra::float16_t or hybra::bfloat16_t");
  if (checked_numel(shape, "array") != static_cast<std::int64_t>(values.size()))
    fail<ShapeError>("array: ", values.size(), " values do not fill shape ", to_string(shape));
  if (device.kind == DeviceKind::cuda) return array(values, shape, cpu()).to(device);
  Tensor t(shape, dtype_of_v<T>, device);
  // Written on the calling thread: no op can know the new tensor yet, and
  // `values` need not be copied to outlive the call.
  std::copy(values.begin(), values.end(), static_cast<T*>(t.raw_data()));
  return t;
}
// A 1-d tensor holding `values`.
template <class T>
Tensor array(const std::vector<T>& values) {
  return array(values, Shape{static_cast<std::int64_t>(values.size())});
}
template <class T>
Tensor array(std::initializer_list<T> values) {
  return array(std::vector<T>(values));
}
template <class T>
Tensor array(std::initializer_list<std::initializer_list<T>> rows) {
  std::vector<T> values;
  std::int64_t cols = rows.size() ? static_cast<std::int64_t>(rows.begin()->size()) : 0;
  for (auto& r : rows) {
    if (static_cast<std::int64_t>(r.size()) != cols)
      fail<ShapeError>("array: ragged rows (", cols, " and ", r.size(), " values)");
    values.insert(values.end(), r);
  }
  return array(values, Shape{static_cast<std::int64_t>(rows.size()), cols});
}

// A tensor over `shape` elements of `dtype` at `data`, row-major, without a
// copy (LibTorch's from_blob): host memory of a CPU device, aligned to the
// dtype's size. hybra's ops read and write it in place, asynchronously: wait
// for them (wait_to_read, waitall) before the caller touches it. `release`,
// if given, is called with `data` once the last tensor over it is gone;
// without it, the caller keeps the memory alive as long as any tensor or op
// uses it. A view of it (slice, transpose) shares it; copy() makes a tensor
// of hybra's own.
inline Tensor from_blob(void* data, const Shape& shape, DType dtype, std::function<void(void*)> release = {},
                        Device device = cpu()) {
  const auto n = static_cast<std::size_t>(checked_numel(shape, "from_blob"));
  if (!data && n != 0) fail<ValueError>("from_blob: a null pointer for shape ", to_string(shape));
  if (reinterpret_cast<std::uintptr_t>(data) % size_of(dtype) != 0)
    fail<ValueError>("from_blob: address ", data, " is not aligned to ", name(dtype), "'s ", size_of(dtype), " bytes");
  if (n > std::numeric_limits<std::size_t>::max() / size_of(dtype))
    fail<ShapeError>("from_blob: shape ", to_string(shape), " of ", name(dtype), " overflows the address space");
  auto storage = std::make_shared<Storage>(data, n * size_of(dtype), device, std::move(release));
  return Tensor::from_storage(std::move(storage), shape, dtype, 0);
}
template <class T>
Tensor from_blob(T* data, const Shape& shape, std::function<void(void*)> release = {}, Device device = cpu()) {
  static_assert(is_dtype_v<T>, "hybra::from_blob: element type must be float, double, std::int32_t, std::int64_t or std::uint8_t");
  return from_blob(static_cast<void*>(data), shape, dtype_of_v<T>, std::move(release), device);
}

namespace detail {
// Queues filling t, contiguous on a GPU, as random_fill fills it on the CPU
// (defined by backend/cuda/random.hpp).
inline void push_draws_cuda(const Tensor& t, bool normal, double a, double b, std::array<std::uint32_t, 2> key,
                            std::uint64_t first, const char* op);

// A tensor of draws from the generator (core/philox.hpp's draw_pair: uniform
// in [a, b), or normal of mean a and standard deviation b): element i uses
// counter block first + i / 2 (two values per block), so results depend on
// neither the thread count nor the device. The counter blocks are reserved
// on the calling thread, so the values do not depend on when the op runs.
inline Tensor random_fill(const Shape& shape, DType dtype, Device device, Generator& gen, bool normal, double a,
                          double b, const char* op) {
  if (!is_floating(dtype))
    fail<DTypeError>(op, ": dtype must be float32, float64, float16 or bfloat16, not ", name(dtype));
  // The 16-bit floats: float32's draws, rounded.
  if (is_half(dtype)) return random_fill(shape, DType::float32, device, gen, normal, a, b, op).astype(dtype);
  Tensor t(shape, dtype, device);
  if (device == meta()) return t;  // inference only: draws nothing, so later values do not shift
  const std::int64_t n = t.size();
  const std::uint64_t blocks = Generator::blocks_for(n), first = gen.advance(blocks);
  if (device.kind == DeviceKind::cuda) {
    push_draws_cuda(t, normal, a, b, gen.key(), first, op);
    return t;
  }
  push_kernel(op, {}, {t}, [t, n, blocks, first, key = gen.key(), normal, a, b] {
    dispatch(t.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_floating_point_v<T>) {
        T* p = static_cast<T*>(t.raw_data());
        backend::cpu::parallel_for(static_cast<std::int64_t>(blocks), 2, [&](std::int64_t from, std::int64_t to) {
          for (std::int64_t j = from; j < to; ++j) {
            T v0, v1;
            philox::draw_pair<T>(normal, a, b, philox::block(first + static_cast<std::uint64_t>(j), key[0], key[1]), v0, v1);
            p[2 * j] = v0;
            if (2 * j + 1 < n) p[2 * j + 1] = v1;
          }
        });
      }
    });
  });
  return t;
}
}  // namespace detail

inline Tensor random_uniform(const Shape& shape, double low = 0, double high = 1, DType dtype = DType::float32,
                             Device device = cpu(), Generator& gen = default_generator()) {
  if (!(low < high)) fail<ValueError>("random_uniform: low ", low, " must be below high ", high);
  return detail::random_fill(shape, dtype, device, gen, false, low, high, "random_uniform");
}

inline Tensor random_normal(const Shape& shape, double mean = 0, double stddev = 1, DType dtype = DType::float32,
                            Device device = cpu(), Generator& gen = default_generator()) {
  if (!(stddev >= 0)) fail<ValueError>("random_normal: stddev ", stddev, " must be non-negative");
  return detail::random_fill(shape, dtype, device, gen, true, mean, stddev, "random_normal");
}

}  // namespace hybra
