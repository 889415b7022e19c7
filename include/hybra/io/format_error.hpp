#pragma once
// The two ways reading or writing a model file fails: the bytes are not a
// valid file of the expected format (FormatError), or the operating system
// refused to read or write it (FileError). Both name the file.
#include <cstddef>
#include <string_view>

#include "../core/error.hpp"

namespace hybra::io {

// A malformed model file. The message starts "model file 'NAME': " and goes
// on with the byte offset where the bytes went wrong ("offset 123: ...") or,
// in a symbol file, the node ("node 3 'fc1' (FullyConnected): ...").
class FormatError : public Error { public: using Error::Error; };

// A file that could not be opened, read, written or renamed; the message
// names the file and the operating system's reason.
class FileError : public Error { public: using Error::Error; };

template <class... Parts>
[[noreturn]] void fail_at_offset(std::string_view file, std::size_t offset, Parts&&... parts) {
  fail<FormatError>("model file '", file, "': offset ", offset, ": ", std::forward<Parts>(parts)...);
}

}  // namespace hybra::io
