#pragma once
// Compiled kernels, kept in memory and on disk so that a second process
// skips the run-time compile. An entry is keyed by everything that decides
// the compiled code: the source, the target architecture and the compiler's
// version (the caller's key text). On disk an entry is one file,
//
//   "HYBRAKC1" | key length (8) | key | code length (8) | FNV-1a 64 of code (8) | code
//
// (lengths and hash little-endian) named by the FNV-1a hash of the key.
// Loading checks all of it: a truncated, corrupt or foreign entry (another
// key whose name collides) is ignored and rebuilt, never returned. The hash
// guards against corruption, not against someone who can write the cache
// directory (who could equally replace the library).
//
// The directory is $HYBRA_KERNEL_CACHE_DIR, else $XDG_CACHE_HOME/hybra/kernels,
// else ~/.cache/hybra/kernels; its size is bounded by
// $HYBRA_KERNEL_CACHE_BYTES (default 256 MiB): after a write, the least
// recently used entries go until it fits. A cache directory that cannot be
// written only costs the disk half: kernels are still built and kept in memory.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <unistd.h>
#include <unordered_map>
#include <utility>
#include <vector>

namespace hybra::backend::cuda {

inline std::uint64_t fnv1a64(std::string_view bytes) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}
// The same as 16 hex digits: a name for a file or a kernel.
inline std::string fnv1a64_hex(std::string_view bytes) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(fnv1a64(bytes)));
  return text;
}

class KernelCache {
 public:
  struct Stats {
    int memory_hits = 0, disk_hits = 0, builds = 0, rejected = 0;  // rejected: disk entries that failed a check
  };

  // dir empty: memory only.
  KernelCache(std::filesystem::path dir, std::uintmax_t max_bytes) : dir_(std::move(dir)), max_bytes_(max_bytes) {}

  // The process's cache, at the documented directory and bound.
  static KernelCache& global() {
    static KernelCache cache(default_dir(), default_max_bytes());
    return cache;
  }

  // The code for `key`: from memory, else from a valid disk entry, else
  // build()'s result, which is then kept in both. build() may throw; nothing
  // is kept then.
  std::string get(const std::string& key, const std::function<std::string()>& build) {
    std::lock_guard g(mutex_);
    if (auto it = memory_.find(key); it != memory_.end()) {
      ++stats_.memory_hits;
      return it->second;
    }
    std::string code;
    if (load(key, code)) {
      ++stats_.disk_hits;
    } else {
      code = build();
      ++stats_.builds;
      store(key, code);
    }
    memory_.emplace(key, code);
    return code;
  }

  Stats stats() const {
    std::lock_guard g(mutex_);
    return stats_;
  }
  const std::filesystem::path& dir() const { return dir_; }
  // The file an entry for key lives in.
  std::filesystem::path path_of(const std::string& key) const {
    return dir_ / (fnv1a64_hex(key) + ".hkc");
  }

 private:
  static constexpr std::string_view magic = "HYBRAKC1";

  static std::filesystem::path default_dir() {
    if (const char* v = std::getenv("HYBRA_KERNEL_CACHE_DIR"); v && *v) return v;
    if (const char* v = std::getenv("XDG_CACHE_HOME"); v && *v) return std::filesystem::path(v) / "hybra" / "kernels";
    if (const char* v = std::getenv("HOME"); v && *v) return std::filesystem::path(v) / ".cache" / "hybra" / "kernels";
    return {};
  }
  static std::uintmax_t default_max_bytes() {
    if (const char* v = std::getenv("HYBRA_KERNEL_CACHE_BYTES"); v && *v) {
      char* end = nullptr;
      const unsigned long long n = std::strtoull(v, &end, 10);
      if (end && *end == '\0') return n;
    }
    return std::uintmax_t{256} << 20;
  }

  static void put64(std::string& out, std::uint64_t v) {
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(v >> (8 * i) & 0xff));
  }
  static bool get64(std::string_view& in, std::uint64_t& v) {
    if (in.size() < 8) return false;
    v = 0;
    for (int i = 0; i < 8; ++i) v |= std::uint64_t{static_cast<unsigned char>(in[i])} << (8 * i);
    in.remove_prefix(8);
    return true;
  }

  bool load(const std::string& key, std::string& code) {
    if (dir_.empty()) return false;
    const auto path = path_of(key);
    std::ifstream file(path, std::ios::binary);
    if (!file) return false;
    const std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    std::string_view in = bytes;
    std::uint64_t key_size = 0, code_size = 0, hash = 0;
    const bool valid = in.substr(0, magic.size()) == magic && (in.remove_prefix(magic.size()), get64(in, key_size)) &&
                       key_size <= in.size() && in.substr(0, key_size) == key &&
                       (in.remove_prefix(key_size), get64(in, code_size)) && get64(in, hash) &&
                       code_size == in.size() && fnv1a64(in) == hash;
    if (!valid) {
      ++stats_.rejected;
      return false;
    }
    code.assign(in);
    std::error_code ec;
    std::filesystem::last_write_time(path, std::filesystem::file_time_type::clock::now(), ec);  // recently used
    return true;
  }

  void store(const std::string& key, const std::string& code) {
    if (dir_.empty()) return;
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec) return;
    std::string bytes(magic);
    put64(bytes, key.size());
    bytes += key;
    put64(bytes, code.size());
    put64(bytes, fnv1a64(code));
    bytes += code;
    // Written aside, then renamed: a reader never sees half an entry.
    const auto path = path_of(key);
    auto tmp = path;
    tmp += ".tmp" + std::to_string(::getpid());
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      if (!out || !out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()))) {
        std::filesystem::remove(tmp, ec);
        return;
      }
    }
    std::filesystem::rename(tmp, path, ec);
    if (ec) std::filesystem::remove(tmp, ec);
    evict();
  }

  // Removes the least recently used entries until the directory fits the bound.
  void evict() {
    std::error_code ec;
    std::vector<std::pair<std::filesystem::file_time_type, std::filesystem::path>> entries;
    std::uintmax_t total = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir_, ec)) {
      if (e.path().extension() != ".hkc") continue;
      const auto size = e.file_size(ec);
      if (ec) continue;
      total += size;
      entries.emplace_back(e.last_write_time(ec), e.path());
    }
    std::sort(entries.begin(), entries.end());
    for (const auto& [time, path] : entries) {
      if (total <= max_bytes_) break;
      const auto size = std::filesystem::file_size(path, ec);
      if (std::filesystem::remove(path, ec)) total -= size;
    }
  }

  std::filesystem::path dir_;
  std::uintmax_t max_bytes_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, std::string> memory_;
  Stats stats_;
};

}  // namespace hybra::backend::cuda
