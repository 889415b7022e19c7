#pragma once
// Every failure hybra reports is a hybra::Error (or a subclass), and its
// message names the op, the shapes, the dtype or the device involved.
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace hybra {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class ShapeError : public Error { public: using Error::Error; };
class DTypeError : public Error { public: using Error::Error; };
class DeviceError : public Error { public: using Error::Error; };
class AxisError : public Error { public: using Error::Error; };
class OutOfMemory : public Error { public: using Error::Error; };
class ValueError : public Error { public: using Error::Error; };
// An index outside what it indexes (an embedding's row).
class IndexError : public Error { public: using Error::Error; };
// Generated code the run-time compiler (NVRTC) refused: the message carries
// its log and the numbered source.
class CompileError : public Error { public: using Error::Error; };

namespace detail {
template <class... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream os;
  (os << ... << std::forward<Parts>(parts));
  return os.str();
}
}  // namespace detail

template <class E = Error, class... Parts>
[[noreturn]] void fail(Parts&&... parts) {
  throw E(detail::concat(std::forward<Parts>(parts)...));
}

}  // namespace hybra
