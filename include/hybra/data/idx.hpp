#pragma once
// IDX files, the format of MNIST and Fashion-MNIST (http://yann.lecun.com/exdb/mnist/):
//   u8 0, u8 0          the magic number's first two bytes
//   u8 type code        0x08 unsigned byte, 0x09 signed byte, 0x0B short (16 bits),
//                       0x0C int (32 bits), 0x0D float, 0x0E double
//   u8 ndim             then ndim u32 extents
//   the values, row-major
// Every number is big-endian. Datasets ship them gzip-compressed; read_idx
// recognises gzip by its magic bytes (1f 8b), whatever the file is called.
//
// A malformed file is an io::FormatError "IDX file 'NAME': offset N: ...",
// where N counts bytes of the IDX data (of the decompressed data, for a gzip
// file); a broken gzip stream names its offset in the compressed file.
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <climits>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <type_traits>

#include "../core/tensor.hpp"
#include "../io/file.hpp"

namespace hybra::data {

// hybra's limit on an IDX file's ndim (the format allows 255); it also bounds
// what a corrupt header can make hybra read.
inline constexpr int max_idx_ndim = 32;

namespace detail {

template <class... Parts>
[[noreturn]] void fail_idx_at(std::string_view file, std::size_t offset, Parts&&... parts) {
  fail<io::FormatError>("IDX file '", file, "': offset ", offset, ": ", std::forward<Parts>(parts)...);
}

inline std::string byte_count(std::size_t n) { return std::to_string(n) + (n == 1 ? " byte" : " bytes"); }

inline std::string hex_byte(unsigned char b) {
  constexpr char digits[] = "0123456789ABCDEF";
  return {'0', 'x', digits[b >> 4], digits[b & 15]};
}

struct IdxType {
  unsigned char code;
  std::string_view name;
  std::size_t bytes;
  DType dtype;  // hybra has no int8 or int16: signed bytes and shorts widen to int32
};
inline constexpr IdxType idx_types[] = {
    {0x08, "unsigned byte", 1, DType::uint8}, {0x09, "signed byte", 1, DType::int32}, {0x0B, "short", 2, DType::int32},
    {0x0C, "int", 4, DType::int32},           {0x0D, "float", 4, DType::float32},     {0x0E, "double", 8, DType::float64}};

// n big-endian values stored as `Stored` (a signed integer or a float),
// converted to T. Assembling each word from its bytes reads the same on any
// host; GCC compiles it to a byte swap.
template <class Stored, class T>
void decode_big_endian(const unsigned char* from, T* to, std::size_t n) {
  using Word = std::conditional_t<sizeof(Stored) == 1, std::uint8_t,
                                  std::conditional_t<sizeof(Stored) == 2, std::uint16_t,
                                                     std::conditional_t<sizeof(Stored) == 4, std::uint32_t, std::uint64_t>>>;
  for (std::size_t i = 0; i < n; ++i, from += sizeof(Stored)) {
    Word word = 0;
    for (std::size_t k = 0; k < sizeof(Stored); ++k) word = static_cast<Word>((word << 8) | from[k]);
    to[i] = static_cast<T>(std::bit_cast<Stored>(word));
  }
}

inline bool is_gzip(std::string_view bytes) {
  return bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f && static_cast<unsigned char>(bytes[1]) == 0x8b;
}

// What a gzip file decompresses to. Several gzip members one after another
// (what `cat a.gz b.gz` makes) decompress to their concatenation, as gzip -d does.
inline std::string gunzip(std::string_view compressed, std::string_view file) {
  z_stream z{};
  // 16 + 15: a gzip header and trailer (not raw deflate or zlib), the largest window.
  if (inflateInit2(&z, 16 + 15) != Z_OK) fail<OutOfMemory>("IDX file '", file, "': zlib could not start inflating");
  struct End {
    z_stream& z;
    ~End() { inflateEnd(&z); }
  } end{z};
  auto fail_gzip = [&](std::size_t offset, auto&&... parts) {
    fail<io::FormatError>("IDX file '", file, "': gzip stream: compressed offset ", offset, ": ", parts...);
  };

  // The last member's trailer holds its size modulo 2^32: enough to allocate
  // once for a single-member file. Capped by deflate's best ratio (1032:1),
  // so a corrupt trailer cannot ask for more than the stream could hold.
  std::string out;
  if (compressed.size() >= 18) {
    std::uint32_t size_mod_2_32 = 0;
    for (std::size_t k = 1; k <= 4; ++k)
      size_mod_2_32 = (size_mod_2_32 << 8) | static_cast<unsigned char>(compressed[compressed.size() - k]);
    out.resize(std::min<std::size_t>(size_mod_2_32, compressed.size() * 1032));
  }
  std::size_t fed = 0;      // compressed bytes handed to zlib
  std::size_t written = 0;  // bytes of `out` filled
  for (;;) {
    // zlib counts in uInt (32 bits), so large buffers go in pieces.
    if (z.avail_in == 0 && fed < compressed.size()) {
      z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(compressed.data() + fed));
      z.avail_in = static_cast<uInt>(std::min<std::size_t>(compressed.size() - fed, UINT_MAX));
      fed += z.avail_in;
    }
    if (written == out.size()) out.resize(std::max<std::size_t>(2 * out.size(), 1 << 16));
    z.next_out = reinterpret_cast<Bytef*>(out.data() + written);
    z.avail_out = static_cast<uInt>(std::min<std::size_t>(out.size() - written, UINT_MAX));
    const uInt room = z.avail_out;
    const int status = inflate(&z, Z_NO_FLUSH);
    written += room - z.avail_out;
    const std::size_t at = fed - z.avail_in;  // compressed offset zlib has reached
    if (status == Z_STREAM_END) {
      if (at == compressed.size()) break;
      if (!is_gzip(compressed.substr(at)))
        fail_gzip(at, "trailing ", byte_count(compressed.size() - at), " after the gzip stream, not another gzip member");
      inflateReset(&z);
    } else if (status == Z_BUF_ERROR && z.avail_in == 0 && fed == compressed.size()) {
      fail_gzip(at, "the file ends before the gzip stream does (truncated)");
    } else if (status == Z_MEM_ERROR) {
      fail<OutOfMemory>("IDX file '", file, "': out of memory while decompressing");
    } else if (status != Z_OK && status != Z_BUF_ERROR) {
      fail_gzip(at, "corrupt data (zlib: ", z.msg ? z.msg : "error " + std::to_string(status), ")");
    }
  }
  out.resize(written);
  return out;
}

}  // namespace detail

// The array held by an IDX file's bytes (not compressed); `file` names it in
// errors. A uint8 tensor for unsigned bytes, int32 for signed bytes, shorts
// and ints, float32 and float64 for floats and doubles.
inline Tensor parse_idx(std::string_view bytes, std::string_view file) {
  auto byte = [&](std::size_t i) { return static_cast<unsigned char>(bytes[i]); };
  if (bytes.size() < 4)
    detail::fail_idx_at(file, bytes.size(), "the file ends inside the 4-byte magic number (it has ",
                        detail::byte_count(bytes.size()), ")");
  if (byte(0) != 0 || byte(1) != 0)
    detail::fail_idx_at(file, 0, "the magic number starts with ", detail::hex_byte(byte(0)), ' ',
                        detail::hex_byte(byte(1)), ", not 0x00 0x00: this is not an IDX file");
  const auto* type = std::find_if(std::begin(detail::idx_types), std::end(detail::idx_types),
                                  [&](const detail::IdxType& t) { return t.code == byte(2); });
  if (type == std::end(detail::idx_types))
    detail::fail_idx_at(file, 2, "unknown type code ", detail::hex_byte(byte(2)),
                        " (IDX defines 0x08 unsigned byte, 0x09 signed byte, 0x0B short, 0x0C int, 0x0D float, "
                        "0x0E double)");
  const int ndim = byte(3);
  if (ndim == 0 || ndim > max_idx_ndim)
    detail::fail_idx_at(file, 3, ndim, " dimensions; hybra reads IDX arrays of 1 to ", max_idx_ndim);
  const std::size_t header = 4 + 4 * static_cast<std::size_t>(ndim);
  if (bytes.size() < header)
    detail::fail_idx_at(file, bytes.size(), "the file ends inside the header, which has ", ndim, " extents and so ",
                        header, " bytes");

  Shape shape(static_cast<std::size_t>(ndim));
  for (std::size_t axis = 0; axis < shape.size(); ++axis) {
    std::uint32_t extent = 0;
    for (std::size_t k = 0; k < 4; ++k) extent = (extent << 8) | byte(4 + 4 * axis + k);
    shape[axis] = extent;
  }
  // Counted against the values present, so that a corrupt header's product
  // of extents cannot overflow.
  const std::size_t available = (bytes.size() - header) / type->bytes;
  std::size_t count = std::find(shape.begin(), shape.end(), 0) == shape.end() ? 1 : 0;
  bool beyond_file = false;
  for (std::size_t axis = 0; axis < shape.size() && count != 0 && !beyond_file; ++axis) {
    const auto extent = static_cast<std::size_t>(shape[axis]);
    if (count > available / extent)
      beyond_file = true;
    else
      count *= extent;
  }
  const std::string array = to_string(shape) + " array of " + std::string(type->name) + "s";
  if (beyond_file)
    detail::fail_idx_at(file, bytes.size(), "the file ends after ", detail::byte_count(bytes.size() - header),
                        " of values, too few for the header's ", array, " (", detail::byte_count(type->bytes),
                        " each): truncated");
  const std::size_t end = header + count * type->bytes;
  if (end < bytes.size())
    detail::fail_idx_at(file, end, "trailing ", detail::byte_count(bytes.size() - end), " after the header's ", array);

  Tensor result(shape, type->dtype);
  // Written on the calling thread, as creation functions do: no op knows the
  // new tensor yet.
  const auto* values = reinterpret_cast<const unsigned char*>(bytes.data() + header);
  void* to = result.raw_data();
  switch (type->code) {
    case 0x08: std::memcpy(to, values, count); break;
    case 0x09: detail::decode_big_endian<std::int8_t>(values, static_cast<std::int32_t*>(to), count); break;
    case 0x0B: detail::decode_big_endian<std::int16_t>(values, static_cast<std::int32_t*>(to), count); break;
    case 0x0C: detail::decode_big_endian<std::int32_t>(values, static_cast<std::int32_t*>(to), count); break;
    case 0x0D: detail::decode_big_endian<float>(values, static_cast<float*>(to), count); break;
    case 0x0E: detail::decode_big_endian<double>(values, static_cast<double*>(to), count); break;
  }
  return result;
}

// The array in the IDX file at `path`, gzip-compressed or not. A file that
// cannot be read is an io::FileError; malformed bytes an io::FormatError.
inline Tensor read_idx(const std::filesystem::path& path) {
  const std::string shown = path.string();
  std::string bytes = io::read_file(path);
  if (detail::is_gzip(bytes)) bytes = detail::gunzip(bytes, shown);
  return parse_idx(bytes, shown);
}

}  // namespace hybra::data
