#pragma once
// NumPy's array files: .npy (np.save, np.load) and .npz (np.savez,
// np.savez_compressed), so that a user's data and a model's tensors move
// between hybra and Python without a converter.
//
// A .npy file is the magic "\x93NUMPY", a version (1.0, 2.0 or 3.0), the
// length of a header, the header (a Python dict literal: 'descr', the dtype;
// 'fortran_order'; 'shape') and the values. hybra reads the dtypes it has
// ('<f4' float32, '<f8' float64, '<f2' float16, '<i4' int32, '<i8' int64,
// '|u1' uint8, and '|b1' bool as uint8 0/1; NumPy has no bfloat16), big-endian
// ones too, in C or Fortran order; it
// writes version 1.0 (2.0 for a header over 64 KiB), little-endian, C order,
// the header padded so the values start at a multiple of 64 bytes, as NumPy
// does. A .npz file is a ZIP archive (zip.hpp) of .npy members, named as
// np.load names them (the member's name without ".npy"); hybra writes them
// stored, as np.savez does. Errors: io::FileError for the file system,
// io::FormatError "npy file 'NAME': offset N: ..." (within an .npz: "npz
// file 'NAME': member 'a.npy': offset N: ...", N counting bytes of the
// member), DTypeError for a dtype hybra does not have.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../core/tensor.hpp"
#include "file.hpp"
#include "ndarray_list.hpp"
#include "zip.hpp"

namespace hybra::io {

namespace detail::npy {

constexpr std::string_view magic = "\x93NUMPY";
constexpr std::size_t alignment = 64;

// A .npy's bytes, and how its errors name it.
struct Source {
  std::string_view bytes;
  std::string where;  // "npy file 'a.npy'" or "npz file 'b.npz': member 'x.npy'"

  template <class... Parts>
  [[noreturn]] void fail_at(std::size_t offset, Parts&&... parts) const {
    fail<FormatError>(where, ": offset ", offset, ": ", std::forward<Parts>(parts)...);
  }
};

struct Descr {
  DType dtype;
  std::size_t bytes;
  bool big_endian;
};

inline Descr parse_descr(const Source& s, std::string_view descr, std::size_t at) {
  if (descr.size() < 3) s.fail_at(at, "dtype '", descr, "' is not a simple NumPy dtype");
  const char order = descr[0];
  const std::string_view kind = descr.substr(1);
  if (order != '<' && order != '>' && order != '|' && order != '=')
    s.fail_at(at, "dtype '", descr, "' has no byte order ('<', '>', '|' or '=')");
  struct Known {
    std::string_view kind;
    DType dtype;
    std::size_t bytes;
  };
  static constexpr Known known[] = {{"f4", DType::float32, 4}, {"f8", DType::float64, 8}, {"f2", DType::float16, 2}, {"i4", DType::int32, 4},
                                    {"i8", DType::int64, 8},   {"u1", DType::uint8, 1},   {"b1", DType::uint8, 1}};
  for (const Known& k : known)
    if (k.kind == kind) return {k.dtype, k.bytes, order == '>' && k.bytes > 1};
  fail<DTypeError>(s.where, ": offset ", at, ": dtype '", descr,
                   "' has no hybra dtype (hybra reads float32 '<f4', float64 '<f8', float16 '<f2', int32 '<i4', int64 "
                   "'<i8', uint8 "
                   "'|u1' and bool '|b1'; convert it with astype before np.save)");
}

// The text of one key's value in the header dict, from after "'key':".
inline std::string_view header_value(const Source& s, std::string_view header, std::size_t header_at,
                                     std::string_view key) {
  const std::string quoted = "'" + std::string(key) + "'";
  std::size_t k = header.find(quoted);
  if (k == std::string_view::npos) s.fail_at(header_at, "the header has no ", quoted, ": ", header);
  k = header.find(':', k + quoted.size());
  if (k == std::string_view::npos) s.fail_at(header_at + k, "no ':' after ", quoted);
  std::size_t begin = header.find_first_not_of(' ', k + 1);
  if (begin == std::string_view::npos) s.fail_at(header_at + k, "no value after ", quoted);
  const char open = header[begin];
  std::size_t end;
  if (open == '\'' || open == '"') end = header.find(open, begin + 1) + 1;
  else if (open == '(') end = header.find(')', begin) + 1;
  else end = header.find_first_of(",}", begin);
  if (end == std::string_view::npos || end == 0) s.fail_at(header_at + begin, "the value of ", quoted, " does not end");
  return header.substr(begin, end - begin);
}

inline Shape parse_shape(const Source& s, std::string_view text, std::size_t at) {
  if (text.size() < 2 || text.front() != '(' || text.back() != ')')
    s.fail_at(at, "shape ", text, " is not a tuple");
  Shape shape;
  std::string_view rest = text.substr(1, text.size() - 2);
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && (item.back() == ' ' || item.back() == 'L')) item.remove_suffix(1);
    if (!item.empty()) {
      std::int64_t n = 0;
      for (char c : item) {
        if (c < '0' || c > '9' || n > (INT64_MAX - 9) / 10) s.fail_at(at, "shape ", text, " has an extent that is not a size");
        n = n * 10 + (c - '0');
      }
      shape.push_back(n);
    }
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return shape;
}

inline void swap_bytes(char* data, std::size_t count, std::size_t width) {
  for (std::size_t i = 0; i < count; ++i) std::reverse(data + i * width, data + (i + 1) * width);
}

// Column-major values of `shape` into row-major order.
inline void fortran_to_c(const char* from, char* to, const Shape& shape, std::size_t width) {
  Strides column_major(shape.size());
  std::int64_t step = 1;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    column_major[d] = step;
    step *= shape[d];
  }
  std::size_t n = 0;
  for_each_offset(shape, column_major, [&](std::int64_t at) {
    std::memcpy(to + n++ * width, from + static_cast<std::size_t>(at) * width, width);
  });
}

// The array a .npy's bytes hold, as a contiguous tensor on cpu(0).
inline Tensor decode(const Source& s) {
  const std::string_view b = s.bytes;
  if (b.size() < 10 || b.substr(0, 6) != magic) s.fail_at(0, "not a .npy file (no \\x93NUMPY magic)");
  const auto major = static_cast<unsigned char>(b[6]);
  if (major < 1 || major > 3) s.fail_at(6, "format version ", int(major), ".", int(static_cast<unsigned char>(b[7])), " is not 1, 2 or 3");
  const std::size_t length_bytes = major == 1 ? 2 : 4;
  if (b.size() < 8 + length_bytes) s.fail_at(8, "the header length runs past the end of the file");
  std::size_t header_length = 0;
  for (std::size_t k = 0; k < length_bytes; ++k)
    header_length |= std::size_t{static_cast<unsigned char>(b[8 + k])} << (8 * k);
  const std::size_t header_at = 8 + length_bytes;
  if (header_length > b.size() - header_at)
    s.fail_at(8, "a header of ", header_length, " bytes runs past the end of the file (", b.size(), " bytes)");
  const std::string_view header = b.substr(header_at, header_length);
  const std::string_view descr_text = header_value(s, header, header_at, "descr");
  if (descr_text.size() < 2 || (descr_text.front() != '\'' && descr_text.front() != '"'))
    s.fail_at(header_at, "'descr' ", descr_text, " is not a simple dtype string (a structured array?)");
  const Descr descr = parse_descr(s, descr_text.substr(1, descr_text.size() - 2), header_at);
  const std::string_view fortran = header_value(s, header, header_at, "fortran_order");
  if (fortran != "True" && fortran != "False") s.fail_at(header_at, "'fortran_order' is ", fortran, ", not True or False");
  Shape shape = parse_shape(s, header_value(s, header, header_at, "shape"), header_at);
  const std::size_t data_at = header_at + header_length;
  const std::int64_t count = checked_numel(shape);
  const std::size_t bytes = static_cast<std::size_t>(count) * descr.bytes;
  if (count != 0 && bytes / static_cast<std::size_t>(count) != descr.bytes)
    s.fail_at(header_at, "shape ", to_string(shape), " overflows the address space");
  if (b.size() - data_at < bytes)
    s.fail_at(data_at, "shape ", to_string(shape), " needs ", bytes, " bytes of values, the file has ", b.size() - data_at);
  Tensor t(shape, descr.dtype);
  // Written on the calling thread: no op can know the new tensor yet.
  auto* out = static_cast<char*>(t.raw_data());
  if (fortran == "True") fortran_to_c(b.data() + data_at, out, shape, descr.bytes);
  else std::memcpy(out, b.data() + data_at, bytes);
  if (descr.big_endian) swap_bytes(out, static_cast<std::size_t>(count), descr.bytes);
  return t;
}

inline std::string descr_of(DType d) {
  switch (d) {
    case DType::float32: return "<f4";
    case DType::float64: return "<f8";
    case DType::int32: return "<i4";
    case DType::int64: return "<i8";
    case DType::uint8: return "|u1";
    case DType::float16: return "<f2";
    case DType::bfloat16:
      fail<DTypeError>("save_npy: NumPy has no bfloat16 (a tensor of bfloat16); save t.astype(DType::float32), which "
                       "holds every bfloat16 exactly");
  }
  fail<DTypeError>("save_npy: no NumPy dtype for dtype ", static_cast<int>(d));
}

// A .npy's bytes for t (waits for its pending writes).
inline std::string encode(const Tensor& t) {
  t.require("save_npy");
  if (t.device().kind == DeviceKind::cuda) return encode(t.to(cpu()));
  std::string shape = "(";
  for (std::size_t d = 0; d < t.shape().size(); ++d)
    shape += std::to_string(t.shape()[d]) + (t.shape().size() == 1 ? "," : d + 1 < t.shape().size() ? ", " : "");
  shape += ")";
  std::string header = "{'descr': '" + descr_of(t.dtype()) + "', 'fortran_order': False, 'shape': " + shape + ", }";
  const bool long_header = header.size() + 1 + 10 > 65535;
  const std::size_t prefix = long_header ? 12 : 10;
  header.append(alignment - (prefix + header.size() + 1) % alignment, ' ');
  header += '\n';
  std::string out(magic);
  out += static_cast<char>(long_header ? 2 : 1);
  out += '\0';
  for (std::size_t k = 0; k < prefix - 8; ++k) out += static_cast<char>((header.size() >> (8 * k)) & 0xFF);
  out += header;
  t.wait_to_read();
  io::detail::append_values(out, t);
  return out;
}

}  // namespace detail::npy

// The array of a .npy file (np.save's), as a contiguous tensor on cpu(0).
inline Tensor load_npy(const std::filesystem::path& path) {
  const std::string bytes = read_file(path);
  return detail::npy::decode({bytes, "npy file '" + path.string() + "'"});
}

// Writes t as a .npy file np.load reads (replacing the file atomically).
inline void save_npy(const std::filesystem::path& path, const Tensor& t) {
  write_file_atomically(path, detail::npy::encode(t));
}

// The arrays of an .npz file (np.savez's or np.savez_compressed's), in the
// archive's order, under np.load's names.
inline std::vector<std::pair<std::string, Tensor>> load_npz(const std::filesystem::path& path) {
  const std::string bytes = read_file(path);
  const std::string where = "npz file '" + path.string() + "'";
  std::vector<std::pair<std::string, Tensor>> arrays;
  for (const ZipMember& m : read_zip(bytes, "npz", path.string())) {
    std::string name = m.name;
    if (name.ends_with(".npy")) name.resize(name.size() - 4);
    arrays.emplace_back(std::move(name), detail::npy::decode({m.bytes, where + ": member '" + m.name + "'"}));
  }
  return arrays;
}

// Writes named arrays as an .npz file (stored, as np.savez writes it). Names
// must be distinct and not empty.
inline void save_npz(const std::filesystem::path& path, std::span<const std::pair<std::string, Tensor>> arrays) {
  std::vector<ZipMember> members;
  for (const auto& [name, t] : arrays) {
    if (name.empty()) fail<ValueError>("save_npz: an array of shape ", to_string(t.shape()), " has an empty name");
    for (const ZipMember& m : members)
      if (m.name == name + ".npy") fail<ValueError>("save_npz: two arrays are named '", name, "'");
    members.push_back({name + ".npy", detail::npy::encode(t)});
  }
  write_file_atomically(path, encode_zip(members));
}

}  // namespace hybra::io
