#pragma once
// The ZIP container as NumPy's .npz files use it: read_zip lists an archive's
// members, stored or deflated, with or without ZIP64 records (np.savez writes
// every member with a ZIP64 extra field), each checked against its CRC-32;
// encode_zip writes members stored, as np.savez does, with ZIP64 records where
// a size or offset needs them. Errors are io::FormatError "<kind> file 'NAME':
// offset N: ...", N counting bytes of the archive.
#include <zlib.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "format_error.hpp"

namespace hybra::io {

struct ZipMember {
  std::string name;
  std::string bytes;  // uncompressed
};

namespace detail::zip {

using u64 = std::uint64_t;

constexpr std::uint32_t local_signature = 0x04034b50, central_signature = 0x02014b50, end_signature = 0x06054b50,
                        end64_signature = 0x06064b50, locator64_signature = 0x07064b50;
constexpr std::uint16_t zip64_extra = 0x0001;
constexpr std::uint32_t saturated32 = 0xFFFFFFFF;
constexpr std::uint16_t saturated16 = 0xFFFF;

// Little-endian reads within the archive, each checked against its end.
class Reader {
 public:
  Reader(std::string_view bytes, std::string_view kind, std::string_view file)
      : bytes_(bytes), kind_(kind), file_(file) {}

  template <class... Parts>
  [[noreturn]] void fail_at(u64 offset, Parts&&... parts) const {
    fail<FormatError>(kind_, " file '", file_, "': offset ", offset, ": ", std::forward<Parts>(parts)...);
  }
  void need(u64 offset, u64 count, std::string_view what) const {
    if (offset > bytes_.size() || count > bytes_.size() - offset)
      fail_at(offset, what, " (", count, " bytes) runs past the end of the archive (", bytes_.size(), " bytes)");
  }
  template <class T>
  T at(u64 offset, std::string_view what) const {
    need(offset, sizeof(T), what);
    T value = 0;
    for (std::size_t k = 0; k < sizeof(T); ++k)
      value |= static_cast<T>(static_cast<T>(static_cast<unsigned char>(bytes_[offset + k])) << (8 * k));
    return value;
  }
  std::string_view slice(u64 offset, u64 count, std::string_view what) const {
    need(offset, count, what);
    return bytes_.substr(offset, count);
  }
  u64 size() const { return bytes_.size(); }

 private:
  std::string_view bytes_, kind_, file_;
};

inline std::uint32_t crc_of(std::string_view bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (std::size_t done = 0; done < bytes.size();) {
    const auto n = static_cast<uInt>(std::min<std::size_t>(bytes.size() - done, UINT_MAX));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(bytes.data() + done), n);
    done += n;
  }
  return static_cast<std::uint32_t>(crc);
}

struct CentralEntry {
  std::string name;
  std::uint16_t method, flags;
  std::uint32_t crc;
  u64 compressed, uncompressed, local_offset;
};

// Where the central directory starts and how many entries it has, from the
// end record (or, where its fields are saturated, the ZIP64 end record).
inline std::pair<u64, u64> central_directory(const Reader& r) {
  if (r.size() < 22) r.fail_at(0, "too short for a ZIP archive (", r.size(), " bytes; an empty one has 22)");
  // The end record is the last 22 bytes plus a comment of up to 65535.
  u64 end = r.size() - 22;
  for (;; --end) {
    if (r.at<std::uint32_t>(end, "end record") == end_signature && end + 22 + r.at<std::uint16_t>(end + 20, "comment length") == r.size())
      break;
    if (end == 0 || r.size() - end > 22 + 65535) r.fail_at(r.size(), "no ZIP end-of-central-directory record");
  }
  u64 entries = r.at<std::uint16_t>(end + 10, "entry count");
  u64 start = r.at<std::uint32_t>(end + 16, "central directory offset");
  if (entries == saturated16 || start == saturated32) {
    if (end < 20 || r.at<std::uint32_t>(end - 20, "ZIP64 locator") != locator64_signature)
      r.fail_at(end, "saturated end record without a ZIP64 locator before it");
    const u64 end64 = r.at<u64>(end - 12, "ZIP64 end record offset");
    if (r.at<std::uint32_t>(end64, "ZIP64 end record") != end64_signature)
      r.fail_at(end64, "no ZIP64 end record where its locator points");
    entries = r.at<u64>(end64 + 32, "ZIP64 entry count");
    start = r.at<u64>(end64 + 48, "ZIP64 central directory offset");
  }
  return {start, entries};
}

// One central directory entry at `at`; returns it and the next entry's offset.
inline std::pair<CentralEntry, u64> central_entry(const Reader& r, u64 at) {
  if (r.at<std::uint32_t>(at, "central directory entry") != central_signature)
    r.fail_at(at, "expected a central directory entry (signature 0x02014b50)");
  CentralEntry e;
  e.flags = r.at<std::uint16_t>(at + 8, "flags");
  e.method = r.at<std::uint16_t>(at + 10, "method");
  e.crc = r.at<std::uint32_t>(at + 16, "CRC-32");
  e.compressed = r.at<std::uint32_t>(at + 20, "compressed size");
  e.uncompressed = r.at<std::uint32_t>(at + 24, "uncompressed size");
  const u64 name_length = r.at<std::uint16_t>(at + 28, "name length"),
            extra_length = r.at<std::uint16_t>(at + 30, "extra length"),
            comment_length = r.at<std::uint16_t>(at + 32, "comment length");
  e.local_offset = r.at<std::uint32_t>(at + 42, "local header offset");
  e.name = std::string(r.slice(at + 46, name_length, "member name"));
  // The ZIP64 extra field holds, in this order, each of these that is saturated above.
  const u64 extra = at + 46 + name_length;
  for (u64 field = extra; field + 4 <= extra + extra_length;) {
    const auto id = r.at<std::uint16_t>(field, "extra field id"), length = r.at<std::uint16_t>(field + 2, "extra field length");
    if (id == zip64_extra) {
      u64 value = field + 4;
      for (u64* v : {&e.uncompressed, &e.compressed, &e.local_offset})
        if (*v == saturated32) {
          if (value + 8 > field + 4 + length) r.fail_at(field, "ZIP64 extra field too short for the sizes it replaces");
          *v = r.at<u64>(value, "ZIP64 size");
          value += 8;
        }
    }
    field += 4 + length;
  }
  return {std::move(e), extra + extra_length + comment_length};
}

inline std::string inflate_raw(const Reader& r, std::string_view in, u64 at, u64 size) {
  if (in.size() > UINT_MAX || size > UINT_MAX) r.fail_at(at, "a deflated member over 4 GiB is not read");
  std::string out(size, '\0');
  z_stream s{};
  if (inflateInit2(&s, -MAX_WBITS) != Z_OK) r.fail_at(at, "zlib could not start inflating");
  s.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  s.avail_in = static_cast<uInt>(in.size());
  s.next_out = reinterpret_cast<Bytef*>(out.data());
  s.avail_out = static_cast<uInt>(out.size());
  const int status = inflate(&s, Z_FINISH);
  const u64 written = s.total_out;
  inflateEnd(&s);
  if (status != Z_STREAM_END || written != size)
    r.fail_at(at, "the deflated member does not inflate to its ", size, " bytes (zlib status ", status, ")");
  return out;
}

}  // namespace detail::zip

// The members of a ZIP archive, in the central directory's order. `kind`
// names the format in errors ("npz").
inline std::vector<ZipMember> read_zip(std::string_view bytes, std::string_view kind, std::string_view file) {
  namespace z = detail::zip;
  const z::Reader r(bytes, kind, file);
  auto [at, count] = z::central_directory(r);
  std::vector<ZipMember> members;
  for (z::u64 k = 0; k < count; ++k) {
    auto [e, next] = z::central_entry(r, at);
    at = next;
    const z::u64 local = e.local_offset;
    if (r.at<std::uint32_t>(local, "local header") != z::local_signature)
      r.fail_at(local, "member '", e.name, "': expected a local header (signature 0x04034b50)");
    if (e.flags & 1) r.fail_at(local, "member '", e.name, "' is encrypted");
    const z::u64 data = local + 30 + r.at<std::uint16_t>(local + 26, "name length") +
                        r.at<std::uint16_t>(local + 28, "extra length");
    const std::string_view stored = r.slice(data, e.compressed, "member data");
    std::string content;
    if (e.method == 0) {
      if (e.compressed != e.uncompressed)
        r.fail_at(data, "stored member '", e.name, "' has sizes ", e.compressed, " and ", e.uncompressed);
      content = std::string(stored);
    } else if (e.method == 8) {
      content = z::inflate_raw(r, stored, data, e.uncompressed);
    } else {
      r.fail_at(local, "member '", e.name, "' uses compression method ", e.method, " (only stored and deflated are read)");
    }
    if (z::crc_of(content) != e.crc) r.fail_at(data, "member '", e.name, "' fails its CRC-32 check: the archive is corrupt");
    members.push_back({std::move(e.name), std::move(content)});
  }
  return members;
}

// The bytes of a ZIP archive holding `members` stored (not compressed).
inline std::string encode_zip(const std::vector<ZipMember>& members) {
  namespace z = detail::zip;
  auto put = [](std::string& out, z::u64 value, int bytes) {
    for (int k = 0; k < bytes; ++k) out.push_back(static_cast<char>((value >> (8 * k)) & 0xFF));
  };
  // Sizes and offsets that reach 2^32 - 1 go into ZIP64 fields; 1980-01-01 00:00 as every member's time.
  constexpr z::u64 dos_date = (1 << 5) | 1;
  std::string out, central;
  for (const ZipMember& m : members) {
    const z::u64 offset = out.size(), size = m.bytes.size();
    const bool big = size >= z::saturated32 || offset >= z::saturated32;
    const std::uint32_t crc = z::crc_of(m.bytes);
    const z::u64 shown_size = big ? z::saturated32 : size;
    // What the local header and the central entry share, from the version needed on.
    auto describe = [&](std::string& to, z::u64 extra_length) {
      put(to, big ? 45 : 20, 2);
      put(to, 0, 2);  // flags
      put(to, 0, 2);  // stored
      put(to, 0, 2);
      put(to, dos_date, 2);
      put(to, crc, 4);
      put(to, shown_size, 4);
      put(to, shown_size, 4);
      put(to, m.name.size(), 2);
      put(to, extra_length, 2);
    };
    put(out, z::local_signature, 4);
    describe(out, big ? 20 : 0);
    out += m.name;
    if (big) {
      put(out, z::zip64_extra, 2);
      put(out, 16, 2);
      put(out, size, 8);
      put(out, size, 8);
    }
    out += m.bytes;

    put(central, z::central_signature, 4);
    put(central, big ? 45 : 20, 2);  // made by
    describe(central, big ? 28 : 0);
    put(central, 0, 2);  // comment
    put(central, 0, 2);  // disk
    put(central, 0, 2);
    put(central, 0, 4);
    put(central, big ? z::saturated32 : offset, 4);
    central += m.name;
    if (big) {
      put(central, z::zip64_extra, 2);
      put(central, 24, 2);
      put(central, size, 8);
      put(central, size, 8);
      put(central, offset, 8);
    }
  }
  const z::u64 start = out.size(), count = members.size(), length = central.size();
  out += central;
  const bool big = start >= z::saturated32 || count >= z::saturated16;
  if (big) {
    const z::u64 end64 = out.size();
    put(out, z::end64_signature, 4);
    put(out, 44, 8);  // the record's size after this field
    put(out, 45, 2);
    put(out, 45, 2);
    put(out, 0, 4);
    put(out, 0, 4);
    put(out, count, 8);
    put(out, count, 8);
    put(out, length, 8);
    put(out, start, 8);
    put(out, z::locator64_signature, 4);
    put(out, 0, 4);
    put(out, end64, 8);
    put(out, 1, 4);
  }
  put(out, z::end_signature, 4);
  put(out, 0, 4);
  put(out, big ? z::saturated16 : count, 2);
  put(out, big ? z::saturated16 : count, 2);
  put(out, length >= z::saturated32 ? z::saturated32 : length, 4);
  put(out, big ? z::saturated32 : start, 4);
  put(out, 0, 2);
  return out;
}

}  // namespace hybra::io
