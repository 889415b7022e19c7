// libFuzzer target: parse_ndarray_list on arbitrary bytes (tests/fuzz/run.sh).
// A FormatError is the right answer to a bad file. Anything else -- another
// exception, a crash, a sanitizer report, an allocation beyond run.sh's
// -malloc_limit_mb, records that point outside the file, or a shape that a
// Tensor would refuse (so load_ndarray_list would fail late) -- is a finding.
#include <hybra/io/ndarray_list_format.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    for (const auto& record : hybra::io::parse_ndarray_list(bytes, "fuzz.params")) {
      std::uint64_t expected = hybra::size_of(record.dtype);
      for (auto d : record.shape) expected *= static_cast<std::uint64_t>(d);
      if (record.offset > size || record.bytes > size - record.offset || record.bytes != expected) __builtin_trap();
      // What Tensor's constructor checks; a ShapeError escaping here is a finding.
      hybra::checked_numel(record.shape);
      hybra::contiguous_strides(record.shape);
    }
  } catch (const hybra::io::FormatError&) {
  }
  return 0;
}
