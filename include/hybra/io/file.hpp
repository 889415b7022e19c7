#pragma once
// Reading a whole file, and replacing one atomically: whoever opens the path
// sees the old file or the complete new one, never a part-written file, even
// when the disk fills up or the machine crashes halfway through.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

#include "format_error.hpp"

namespace hybra::io {

namespace detail {
inline std::string os_reason(int err) { return std::generic_category().message(err); }

// Writes all of `bytes` to fd, retrying after signals. Returns 0 or the errno
// of the failure.
inline int write_all(int fd, std::string_view bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    // At most 1 GiB per call: Linux writes at most ~2 GiB per call anyway.
    const ssize_t n = ::write(fd, bytes.data() + done, std::min<std::size_t>(bytes.size() - done, std::size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;
    done += static_cast<std::size_t>(n);
  }
  return 0;
}
}  // namespace detail

// The file's bytes. A missing, unreadable or directory path is a FileError
// naming the path and the operating system's reason.
inline std::string read_file(const std::filesystem::path& path) {
  struct Descriptor {
    int fd;
    ~Descriptor() {
      if (fd >= 0) ::close(fd);
    }
  };
  auto give_up = [&](std::string_view why) { fail<FileError>("cannot read '", path.string(), "': ", why); };
  const Descriptor file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.fd < 0) give_up(detail::os_reason(errno));
  struct stat info {};
  if (::fstat(file.fd, &info) != 0) give_up(detail::os_reason(errno));
  if (S_ISDIR(info.st_mode)) give_up("it is a directory");
  // A regular file's size is known, so the string is allocated once; a file
  // that grows meanwhile, or a pipe, is read to its end all the same.
  std::string bytes;
  if (S_ISREG(info.st_mode)) bytes.reserve(static_cast<std::size_t>(info.st_size));
  char chunk[1 << 16];
  for (;;) {
    const ssize_t n = ::read(file.fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) give_up(detail::os_reason(errno));
    if (n == 0) break;
    bytes.append(chunk, static_cast<std::size_t>(n));
  }
  return bytes;
}

// Replaces `path` by `bytes`: writes a temporary file in the same directory,
// flushes it to the disk (fsync), renames it over `path` (atomic on POSIX
// file systems) and flushes the directory so the rename survives a crash.
// On any failure (no such directory, no permission, disk full, ...) the
// temporary file is removed, the old file at `path` is left as it was, and a
// FileError names the path and the operating system's reason.
inline void write_file_atomically(const std::filesystem::path& path, std::string_view bytes) {
  const std::string shown = path.string();
  if (!path.has_filename()) fail<FileError>("cannot write '", shown, "': the path names no file");
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");

  // O_EXCL makes the name ours alone; the suffix only has to make a clash
  // (another writer of the same path, in this process or another) unlikely.
  static std::atomic<unsigned> counter{0};
  std::filesystem::path temp;
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    const auto tick = std::chrono::steady_clock::now().time_since_epoch().count();
    // At most 100 bytes of the name, so the temporary's name stays within NAME_MAX (255).
    temp = dir / ("." + path.filename().string().substr(0, 100) + ".tmp-" + std::to_string(::getpid()) + "-" +
                  std::to_string(counter++) + "-" + std::to_string(tick % 1000000));
    fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && (errno != EEXIST || attempt == 100))
      fail<FileError>("cannot write '", shown, "': cannot create a temporary file in '", dir.string(),
                      "': ", detail::os_reason(errno));
  }

  // From here on, a failure removes the temporary file; `path` is not
  // touched until the rename. A file being replaced keeps its permissions.
  auto abandon = [&](std::string_view step, int err) {
    if (fd >= 0) ::close(fd);
    ::unlink(temp.c_str());
    fail<FileError>("cannot write '", shown, "': ", step, " failed: ", detail::os_reason(err),
                    " (the file at that path, if any, is unchanged)");
  };
  struct stat old {};
  if (::stat(path.c_str(), &old) == 0 && S_ISREG(old.st_mode) && ::fchmod(fd, old.st_mode & 07777) != 0)
    abandon("copying the old file's permissions", errno);
  if (int err = detail::write_all(fd, bytes)) abandon("writing", err);
  if (::fsync(fd) != 0) abandon("flushing to disk", errno);
  // close() reports delayed write errors on network file systems; Linux
  // releases the descriptor even then, so it must not be closed again.
  const int closed = ::close(fd);
  fd = -1;
  if (closed != 0) abandon("closing", errno);
  if (::rename(temp.c_str(), path.c_str()) != 0) abandon("renaming the temporary file over it", errno);

  // A directory that cannot be opened for reading (mode -wx) cannot be
  // flushed; the file is in place, only a crash in the next seconds could
  // undo the rename.
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return;
  const int synced = ::fsync(dir_fd);
  const int err = errno;
  ::close(dir_fd);
  // EINVAL: the file system does not sync directories (some FUSE, tmpfs setups).
  if (synced != 0 && err != EINVAL)
    fail<FileError>("wrote '", shown, "', but flushing its directory to disk failed: ", detail::os_reason(err));
}

}  // namespace hybra::io
