#!/usr/bin/env bash
# Writes a C++ program that runs every ```cpp block of the given Markdown files,
# each as its own function, so the documentation's code is compiled and run by
# the test suite and cannot rot. A block fenced ```cpp top-level (a class, a
# function template) is placed at file scope, before all the functions, so the
# blocks after it can use what it defines. Usage: doc_examples.sh OUTPUT.cpp DOC.md...
set -euo pipefail
out=$1
shift
# $1: "top" (the top-level blocks, verbatim) or "body" (the other blocks, as functions).
extract() {
  for doc in "${@:2}"; do
    awk -v part="$1" -v base="$(basename "$doc" .md | tr -c 'A-Za-z0-9\n' '_')" '
      /^```cpp[[:space:]]+top-level[[:space:]]*$/ {
        kind = "top"; if (part == "top") printf "#line %d \"%s\"\n", NR + 1, FILENAME; next }
      /^```cpp[[:space:]]*$/ {
        kind = "body"; n++
        if (part == "body") printf "static void doc_%s_%d() {\n#line %d \"%s\"\n", base, n, NR + 1, FILENAME
        next }
      /^```[[:space:]]*$/ && kind != "" { if (part == "body" && kind == "body") print "}"; kind = ""; next }
      kind == part { print }
      END { if (kind != "") { print FILENAME ": unterminated code block" > "/dev/stderr"; exit 1 } }
    ' "$doc"
  done
}
top=$(extract top "$@")
body=$(extract body "$@")
{
  printf '#include <hybra/hybra.hpp>\n#include <iostream>\n#include <vector>\nusing namespace hybra;\n%s\n%s\nint main() {\n' "$top" "$body"
  grep -o '^static void doc_[A-Za-z0-9_]*' <<<"$body" | while read -r _ _ fn; do
    printf '  std::cout << "-- %s\\n";\n  %s();\n' "$fn" "$fn"
  done
  echo '}'
} >"$out.tmp"
mv "$out.tmp" "$out"
