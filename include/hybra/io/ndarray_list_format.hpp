#pragma once
// The byte layout of MXNet's NDArray-list files (`mx.nd.save`, Gluon's
// .params) and its validating parser. It needs no Tensor, so the fuzzer
// compiles just this; ndarray_list.hpp loads, encodes and saves tensors.
//
// The layout, as MXNet 1.9.1 writes it (little-endian):
//   u64 0x112 (list magic), u64 0 (reserved)
//   u64 n, then n arrays, each:
//     u32 magic          0xF993FAC9 (V2), or 0xF993FACA (V3: NumPy shape semantics, where 0-d exists)
//     i32 storage type   0 dense (1 row_sparse and 2 csr carry more fields; hybra rejects them)
//     i32 ndim, then ndim i64 extents
//     i32 device type, i32 device id   (1 = cpu; 2 gpu, 3 cpu_pinned, 5 cpu_shared)
//     i32 dtype code     (mxnet_dtype_name), then the values, row-major
//   u64 m (0 or n), then m names, each: u64 length, bytes
// Files of MXNet before 1.0 are read too: V1 (magic 0xF993FAC8) has no
// storage type, and before V1 the magic *is* the ndim and the extents are u32.
#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "../core/dtype.hpp"
#include "../core/shape.hpp"
#include "format_error.hpp"

namespace hybra::io {

static_assert(std::endian::native == std::endian::little,
              "hybra::io: MXNet's files are little-endian, and hybra reads and writes them on little-endian hosts only");

inline constexpr std::uint64_t ndarray_list_magic = 0x112;
inline constexpr std::uint32_t ndarray_v1_magic = 0xF993FAC8;
inline constexpr std::uint32_t ndarray_v2_magic = 0xF993FAC9;
inline constexpr std::uint32_t ndarray_v3_magic = 0xF993FACA;
// MXNet's limit on ndim; it also bounds what a corrupt file can make hybra read.
inline constexpr std::int64_t max_ndarray_ndim = 32;

// MXNet's dtype codes (mshadow's type flags) and hybra's dtypes.
inline std::string_view mxnet_dtype_name(std::int64_t code) {
  constexpr std::string_view names[] = {"float32", "float64", "float16", "uint8",  "int32",  "int8",    "int64",
                                        "bool",    "int16",   "uint16",  "uint32", "uint64", "bfloat16"};
  return code >= 0 && code < 13 ? names[code] : std::string_view{};
}
inline std::int32_t mxnet_dtype_code(DType d) {
  switch (d) {
    case DType::float32: return 0;
    case DType::float64: return 1;
    case DType::uint8: return 3;
    case DType::int32: return 4;
    case DType::int64: return 6;
    case DType::float16: return 2;
    case DType::bfloat16: return 12;
  }
  fail<DTypeError>("invalid dtype code ", static_cast<int>(d));
}
inline std::optional<DType> dtype_from_mxnet_code(std::int64_t code) {
  for (DType d : {DType::float32, DType::float64, DType::int32, DType::int64, DType::uint8, DType::float16,
                  DType::bfloat16})
    if (mxnet_dtype_code(d) == code) return d;
  return std::nullopt;
}

// One array of a parsed file: its values are bytes [offset, offset + bytes)
// of the file, row-major, little-endian. `name` is empty when the file is a
// plain list (MXNet allows a list without names).
struct ArrayRecord {
  std::string name;
  Shape shape;
  DType dtype = DType::float32;
  std::size_t offset = 0;
  std::size_t bytes = 0;
};

namespace detail {
inline std::string byte_count(std::uint64_t n) { return std::to_string(n) + (n == 1 ? " byte" : " bytes"); }

// Reads little-endian fields from a file's bytes; a read past the end is a
// FormatError saying what was being read and where.
class ByteReader {
 public:
  ByteReader(std::string_view bytes, std::string_view file) : bytes_(bytes), file_(file) {}

  std::size_t offset() const { return pos_; }
  std::size_t remaining() const { return bytes_.size() - pos_; }

  template <class T>
  T read(std::string_view what) {
    require(sizeof(T), what);
    T value;
    std::memcpy(&value, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }
  std::string_view take(std::size_t n, std::string_view what) {
    require(n, what);
    auto part = bytes_.substr(pos_, n);
    pos_ += n;
    return part;
  }
  template <class... Parts>
  [[noreturn]] void fail_at(std::size_t offset, Parts&&... parts) const {
    fail_at_offset(file_, offset, std::forward<Parts>(parts)...);
  }

 private:
  void require(std::size_t n, std::string_view what) const {
    if (n > remaining())
      fail_at(pos_, "truncated: ", what, " needs ", byte_count(n), " but the file ends ", byte_count(remaining()),
              " later");
  }

  std::string_view bytes_;
  std::string_view file_;
  std::size_t pos_ = 0;
};

inline std::string hex(std::uint64_t v) {
  constexpr char digits[] = "0123456789ABCDEF";
  std::string s;
  do s.insert(s.begin(), digits[v % 16]); while (v /= 16);
  return "0x" + s;
}

// One array's header and values; `index` names it in errors.
inline ArrayRecord parse_ndarray(ByteReader& in, std::size_t index) {
  const std::string what = "array " + std::to_string(index);
  const std::size_t start = in.offset();
  const auto magic = in.read<std::uint32_t>(what + "'s magic");
  const bool v2_or_v3 = magic == ndarray_v2_magic || magic == ndarray_v3_magic;
  if (!v2_or_v3 && magic != ndarray_v1_magic && magic > max_ndarray_ndim)
    in.fail_at(start, what, ": unknown array magic ", hex(magic), " (MXNet writes ", hex(ndarray_v2_magic),
               ", or ", hex(ndarray_v3_magic), " in NumPy mode)");
  auto none_array = [&] {
    in.fail_at(start, what, " is an uninitialised (none) NDArray, which hybra cannot load");
  };

  if (v2_or_v3) {
    const std::size_t at = in.offset();
    const auto storage = in.read<std::int32_t>(what + "'s storage type");
    if (storage == 1 || storage == 2)
      in.fail_at(at, what, ": sparse storage (", storage == 1 ? "row_sparse" : "csr",
                 ") is not supported; hybra loads dense arrays only");
    if (storage != 0) in.fail_at(at, what, ": unknown storage type ", storage);
  }

  // The shape: i32 ndim and i64 extents, or before V1 the magic as ndim and u32 extents.
  const bool pre_v1 = !v2_or_v3 && magic != ndarray_v1_magic;
  const std::size_t ndim_at = pre_v1 ? start : in.offset();
  const std::int64_t ndim = pre_v1 ? std::int64_t{magic} : in.read<std::int32_t>(what + "'s ndim");
  // A none array has no device, dtype or values after its shape: V2 marks it
  // with ndim 0 (0-d arrays exist only in V3), V3 with ndim -1.
  if ((ndim == 0 && magic != ndarray_v3_magic) || (ndim == -1 && magic == ndarray_v3_magic)) none_array();
  if (ndim < 0 || ndim > max_ndarray_ndim)
    in.fail_at(ndim_at, what, ": ndim ", ndim, " is out of range (0 to ", max_ndarray_ndim, ")");
  ArrayRecord record;
  record.shape.resize(static_cast<std::size_t>(ndim));
  for (std::int64_t axis = 0; axis < ndim; ++axis) {
    const std::size_t at = in.offset();
    const std::string extent = what + "'s extent " + std::to_string(axis);
    const std::int64_t d = pre_v1 ? std::int64_t{in.read<std::uint32_t>(extent)} : in.read<std::int64_t>(extent);
    if (d == -1 && magic == ndarray_v3_magic) none_array();
    if (d < 0) in.fail_at(at, what, ": extent ", d, " of axis ", axis, " is negative");
    record.shape[static_cast<std::size_t>(axis)] = d;
  }

  // The device the array lived on when saved; MXNet loads onto the CPU
  // whatever it says, and so does hybra (without checking it, as MXNet).
  in.read<std::int32_t>(what + "'s device type");
  in.read<std::int32_t>(what + "'s device id");

  const std::size_t dtype_at = in.offset();
  const auto code = in.read<std::int32_t>(what + "'s dtype code");
  const auto dtype = dtype_from_mxnet_code(code);
  if (!dtype) {
    const auto mx_name = mxnet_dtype_name(code);
    if (mx_name.empty()) in.fail_at(dtype_at, what, ": dtype code ", code, " is not an MXNet dtype");
    in.fail_at(dtype_at, what, ": dtype code ", code, " (", mx_name,
               ") is not supported by hybra (float32, float64, int32, int64 or uint8)");
  }
  record.dtype = *dtype;

  // The size is checked against the bytes left before anything is
  // allocated, so a corrupt shape cannot ask for terabytes. The extents'
  // product, 0s counted as 1s, must fit in int64 even for an empty array:
  // hybra's strides are that product (checked_numel, contiguous_strides).
  std::int64_t elements = 1;
  bool empty = false;
  for (auto d : record.shape) {
    empty = empty || d == 0;
    if (__builtin_mul_overflow(elements, d == 0 ? 1 : d, &elements))
      in.fail_at(ndim_at, what, ": shape ", to_string(record.shape), " has more elements than fit in int64");
  }
  std::uint64_t bytes = 0;
  if (!empty && __builtin_mul_overflow(static_cast<std::uint64_t>(elements), size_of(*dtype), &bytes))
    in.fail_at(ndim_at, what, ": shape ", to_string(record.shape), " of ", name(*dtype),
               " has more bytes than fit in 64 bits");
  if (bytes > in.remaining())
    in.fail_at(in.offset(), "truncated: ", what, "'s values (", to_string(record.shape), ", ", name(*dtype),
               ") need ", byte_count(bytes), " but the file ends ", byte_count(in.remaining()), " later");
  record.offset = in.offset();
  record.bytes = static_cast<std::size_t>(bytes);
  in.take(record.bytes, what + "'s values");
  return record;
}
}  // namespace detail

// Every array of an NDArray-list file, checked: any malformed, truncated or
// unsupported content (sparse arrays, dtypes hybra lacks, names that do not
// match the arrays, trailing bytes) is a FormatError naming `file_name` and
// the byte offset. Nothing is allocated in proportion to what the file
// merely declares.
inline std::vector<ArrayRecord> parse_ndarray_list(std::string_view file_bytes, std::string_view file_name) {
  detail::ByteReader in(file_bytes, file_name);
  const auto magic = in.read<std::uint64_t>("the list magic");
  if (magic != ndarray_list_magic)
    in.fail_at(0, "not an MXNet NDArray file: the list magic is ", detail::hex(magic), ", not ",
               detail::hex(ndarray_list_magic));
  in.read<std::uint64_t>("the reserved field");

  const std::size_t count_at = in.offset();
  const auto count = in.read<std::uint64_t>("the array count");
  // The smallest array, before V1 with one extent of 0, takes 20 bytes.
  if (count > in.remaining() / 20)
    in.fail_at(count_at, "truncated: the file declares ", count, " arrays, more than its remaining ",
               detail::byte_count(in.remaining()), " can hold");
  // Grown as arrays are read rather than reserved from the count, so the
  // records never outgrow what the file really holds.
  std::vector<ArrayRecord> records;
  for (std::size_t i = 0; i < count; ++i) records.push_back(detail::parse_ndarray(in, i));

  const std::size_t names_at = in.offset();
  const auto names = in.read<std::uint64_t>("the name count");
  if (names != 0 && names != count)
    in.fail_at(names_at, "the file has ", names, " names for ", count,
               " arrays (MXNet writes one name per array, or none)");
  std::unordered_map<std::string_view, std::size_t> seen;
  for (std::size_t i = 0; i < names; ++i) {
    const std::size_t at = in.offset();
    const std::string what = "name " + std::to_string(i);
    const auto length = in.read<std::uint64_t>(what + "'s length");
    if (length > in.remaining())
      in.fail_at(at, "truncated: ", what, " is ", detail::byte_count(length), " long but the file ends ",
                 detail::byte_count(in.remaining()), " later");
    const auto text = in.take(static_cast<std::size_t>(length), what);
    if (auto [it, fresh] = seen.emplace(text, i); !fresh)
      in.fail_at(at, what, " '", text, "' repeats name ", it->second, " (each array needs its own name)");
    records[i].name = text;
  }
  if (in.remaining() != 0)
    in.fail_at(in.offset(), detail::byte_count(in.remaining()), " of trailing garbage after the last ",
               names ? "name" : "array");
  return records;
}

}  // namespace hybra::io
