// libFuzzer target: parse_symbol_json on arbitrary text (tests/fuzz/run.sh).
// A FormatError is the right answer to a bad file. A file that parses must
// survive encoding: encode(parse(encode(file))) is encode(file), and parsing
// it gives back the same graph with its attrs sorted. Anything else --
// another exception, a crash, a sanitizer report, an allocation beyond
// run.sh's -malloc_limit_mb -- is a finding.
#include <hybra/io/symbol_json.hpp>

#include <algorithm>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  hybra::io::SymbolFile file;
  try {
    file = hybra::io::parse_symbol_json(text, "fuzz.json");
  } catch (const hybra::io::FormatError&) {
    return 0;
  }
  std::string encoded;
  try {
    encoded = hybra::io::encode_symbol_json(file);
  } catch (const hybra::ValueError& e) {
    // JSON escapes can spell control characters that MXNet's reader cannot read back.
    if (std::string_view(e.what()).find("control character") == std::string_view::npos) __builtin_trap();
    return 0;
  }
  const hybra::io::SymbolFile again = hybra::io::parse_symbol_json(encoded, "encoded.json");
  for (auto& node : file.nodes) std::sort(node.attrs.begin(), node.attrs.end());
  if (!(again == file) || hybra::io::encode_symbol_json(again) != encoded) __builtin_trap();
  return 0;
}
