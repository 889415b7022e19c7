#!/usr/bin/env bash
# Writes a C++ program that runs every ```cpp block of the given Markdown files,
# each as its own function, so the documentation's code is compiled and run by
# the test suite and cannot rot. Usage: doc_examples.sh OUTPUT.cpp DOC.md...
set -euo pipefail
out=$1
shift
body=$(for doc in "$@"; do
  awk -v base="$(basename "$doc" .md | tr -c 'A-Za-z0-9\n' '_')" '
    /^```cpp[[:space:]]*$/ { n++; printf "static void doc_%s_%d() {\n#line %d \"%s\"\n", base, n, NR + 1, FILENAME; inside = 1; next }
    /^```[[:space:]]*$/ && inside { print "}"; inside = 0; next }
    inside { print }
    END { if (inside) { print FILENAME ": unterminated code block" > "/dev/stderr"; exit 1 } }
  ' "$doc"
done)
{
  printf '#include <hybra/hybra.hpp>\n#include <iostream>\n#include <vector>\nusing namespace hybra;\n%s\nint main() {\n' "$body"
  grep -o '^static void doc_[A-Za-z0-9_]*' <<<"$body" | while read -r _ _ fn; do
    printf '  std::cout << "-- %s\\n";\n  %s();\n' "$fn" "$fn"
  done
  echo '}'
} >"$out.tmp"
mv "$out.tmp" "$out"
