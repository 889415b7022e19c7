#pragma once
// Named tensors in MXNet's NDArray-list format (.params): what `mx.nd.save`
// writes and `mx.nd.load` reads, and what Gluon's save_parameters and export
// use. The byte layout and the validating parser are in ndarray_list_format.hpp.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "../core/tensor.hpp"
#include "file.hpp"
#include "ndarray_list_format.hpp"

namespace hybra::io {

// The named tensors of an NDArray-list file, in file order, as contiguous
// tensors on cpu(0). Names are empty when the file is a plain list.
inline std::vector<std::pair<std::string, Tensor>> load_ndarray_list(const std::filesystem::path& path) {
  const std::string bytes = read_file(path);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (auto& record : parse_ndarray_list(bytes, path.string())) {
    Tensor t(record.shape, record.dtype);
    // Written on the calling thread: no op can know the new tensor yet.
    std::memcpy(t.raw_data(), bytes.data() + record.offset, record.bytes);
    tensors.emplace_back(std::move(record.name), std::move(t));
  }
  return tensors;
}

namespace detail {
template <class T>
void append_le(std::string& out, T value) {
  char raw[sizeof(T)];
  std::memcpy(raw, &value, sizeof(T));
  out.append(raw, sizeof(T));
}

// Appends a tensor's values row-major, whatever its strides.
inline void append_values(std::string& out, const Tensor& t) {
  const std::size_t element = size_of(t.dtype());
  const auto* origin = static_cast<const char*>(t.raw_data());
  if (t.is_contiguous()) {
    out.append(origin, static_cast<std::size_t>(t.size()) * element);
    return;
  }
  for_each_offset(t.shape(), t.strides(),
                  [&](std::int64_t at) { out.append(origin + at * static_cast<std::int64_t>(element), element); });
}
}  // namespace detail

// The bytes of an NDArray-list file holding `tensors` under their names, as
// MXNet 1.9.1 writes them: dense storage, cpu context, and the V2 array
// magic -- unless a tensor is 0-d, which only MXNet's NumPy shape semantics
// can express: then every array gets the V3 magic, and MXNet reads the file
// with `mx.npx.load` (or inside `mx.util.np_shape(True)`), as it reads the
// files it writes in that mode. When every name is empty the file is a plain
// list (no names), as `mx.nd.save` writes a Python list. Waits for pending
// writes of the tensors.
inline std::string encode_ndarray_list(std::span<const std::pair<std::string, Tensor>> tensors) {
  const bool named = std::any_of(tensors.begin(), tensors.end(), [](const auto& p) { return !p.first.empty(); });
  bool has_0d = false;
  std::size_t size = 32;
  std::unordered_set<std::string_view> names;
  for (const auto& [name, t] : tensors) {
    if (!t.defined())
      fail<ValueError>("encode_ndarray_list: tensor '", name, "' is empty (default-constructed or moved-from)");
    if (t.device() == meta())
      fail<DeviceError>("encode_ndarray_list: tensor '", name, "' lives on meta: it has no values to save");
    if (t.ndim() > max_ndarray_ndim)
      fail<ShapeError>("encode_ndarray_list: tensor '", name, "' has ", t.ndim(), " dimensions; MXNet's limit is ",
                       max_ndarray_ndim);
    if (named && !names.insert(name).second)
      fail<ValueError>("encode_ndarray_list: two tensors are named '", name, "'; MXNet's files need unique names");
    has_0d = has_0d || t.ndim() == 0;
    size += 28 + 8 * static_cast<std::size_t>(t.ndim()) + static_cast<std::size_t>(t.size()) * size_of(t.dtype()) +
            8 + name.size();
  }
  std::string out;
  out.reserve(size);
  detail::append_le<std::uint64_t>(out, ndarray_list_magic);
  detail::append_le<std::uint64_t>(out, 0);
  detail::append_le<std::uint64_t>(out, tensors.size());
  for (const auto& [name, tensor] : tensors) {
    const Tensor t = tensor.device().kind == DeviceKind::cuda ? tensor.to(cpu()) : tensor;  // values via the host
    t.wait_to_read();
    detail::append_le<std::uint32_t>(out, has_0d ? ndarray_v3_magic : ndarray_v2_magic);
    detail::append_le<std::int32_t>(out, 0);  // dense storage
    detail::append_le<std::int32_t>(out, t.ndim());
    for (auto d : t.shape()) detail::append_le<std::int64_t>(out, d);
    detail::append_le<std::int32_t>(out, 1);  // device type: cpu
    detail::append_le<std::int32_t>(out, 0);  // device id
    detail::append_le<std::int32_t>(out, mxnet_dtype_code(t.dtype()));
    detail::append_values(out, t);
  }
  detail::append_le<std::uint64_t>(out, named ? tensors.size() : 0);
  if (named)
    for (const auto& [name, t] : tensors) {
      detail::append_le<std::uint64_t>(out, name.size());
      out += name;
    }
  return out;
}

// Writes encode_ndarray_list(tensors) to `path` atomically (file.hpp).
inline void save_ndarray_list(const std::filesystem::path& path,
                              std::span<const std::pair<std::string, Tensor>> tensors) {
  write_file_atomically(path, encode_ndarray_list(tensors));
}

}  // namespace hybra::io
