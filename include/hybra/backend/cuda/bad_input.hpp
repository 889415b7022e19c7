#pragma once
// Bad input that a kernel finds (an index outside its table) is raised on the
// host: a kernel cannot throw, so it writes the first it finds into its GPU's
// report (kernels/bad_input.cuh, whose layout BadInputReport mirrors), pinned
// host memory that the GPU writes directly (unified addressing: the host's
// address is the GPU's). The host reads the report whenever it has waited for
// the GPU (gpu.hpp: Fence::wait, Gpu::synchronize) and raises IndexError
// there, once, naming the op that found it; the kernel leaves its result
// defined (a zero row). Ops name themselves in the report by a code of this
// file's registry.
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "../../core/device.hpp"
#include "../../core/error.hpp"

namespace hybra::backend::cuda {

struct BadInputReport {
  std::uint32_t op = 0;  // the finder's code; 0: nothing found
  std::uint32_t unused = 0;
  double value = 0;
  std::int64_t position = 0;
  std::int64_t bound = 0;
};
static_assert(sizeof(BadInputReport) == 32);

namespace detail {
struct BadInputCodes {
  std::mutex mutex;
  std::vector<std::string> ops;  // code k names ops[k - 1]
};
inline BadInputCodes& bad_input_codes() {
  static BadInputCodes codes;
  return codes;
}
}  // namespace detail

// The code `op` reports under (the same for every call with that name).
inline std::uint32_t bad_input_code(std::string_view op) {
  auto& codes = detail::bad_input_codes();
  std::lock_guard g(codes.mutex);
  for (std::size_t k = 0; k < codes.ops.size(); ++k)
    if (codes.ops[k] == op) return static_cast<std::uint32_t>(k + 1);
  codes.ops.emplace_back(op);
  return static_cast<std::uint32_t>(codes.ops.size());
}

inline std::string bad_input_op(std::uint32_t code) {
  auto& codes = detail::bad_input_codes();
  std::lock_guard g(codes.mutex);
  return code >= 1 && code <= codes.ops.size() ? codes.ops[code - 1] : "an op (unknown code " + std::to_string(code) + ")";
}

// The error a report holds, raised where the host waited for `waited_for`
// (the work up to the end of op 'x') on `device`.
inline std::exception_ptr bad_input_error(const BadInputReport& r, Device device, std::string_view waited_for) {
  return std::make_exception_ptr(IndexError(hybra::detail::concat(
      bad_input_op(r.op), ": index ", r.value, " (element ", r.position, " of the indices, flattened) is not one of the ",
      r.bound, " rows of its table, found on ", device, " by its kernel (GPU ops run asynchronously: this is the ",
      "first wait after it, for ", waited_for, "); its rows of the result are zeros")));
}

}  // namespace hybra::backend::cuda
