#!/usr/bin/env bash
# Fuzzes the model-file parsers (include/hybra/io/) with libFuzzer under
# AddressSanitizer and UBSan: builds each tests/fuzz/fuzz_<target>.cpp with
# clang++, then runs it for a bounded time from its seed corpus
# (tests/fuzz/corpus/<target>/) plus what earlier runs found. Exits non-zero
# if a target crashes, throws anything but a FormatError, trips a sanitizer,
# allocates more than 64 MiB at once or takes over 10 s on one input; the
# input that did it is saved as <work dir>/crash-*, and the target binary
# reproduces it: <work dir>/fuzz_<target> <that file>.
# Environment:
#   HYBRA_FUZZ_SECONDS  seconds of fuzzing per target (default 25)
#   HYBRA_FUZZ_DIR      work directory: binaries, grown corpora, crashes (default build-fuzz)
#   HYBRA_FUZZ_CXX      the clang++ (default clang++)
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
SECONDS_EACH=${HYBRA_FUZZ_SECONDS:-25}
DIR=${HYBRA_FUZZ_DIR:-build-fuzz}
CXX=${HYBRA_FUZZ_CXX:-clang++}
targets=(ndarray_list symbol_json)
# Only the parsers' headers are compiled (no Tensor, no engine), so a build takes seconds.
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -Iinclude)
libs=(-lboost_json)

mkdir -p "$DIR"
failed=0

for t in "${targets[@]}"; do
  "$CXX" "${flags[@]}" "tests/fuzz/fuzz_$t.cpp" -o "$DIR/fuzz_$t" "${libs[@]}" &
done
for t in "${targets[@]}"; do
  wait -n || { echo "run.sh: building a fuzz target failed" >&2; exit 1; }
done

for t in "${targets[@]}"; do
  mkdir -p "$DIR/corpus/$t"
  dict=()
  [[ -f tests/fuzz/$t.dict ]] && dict=("-dict=tests/fuzz/$t.dict")
  echo "=== fuzz_$t: ${SECONDS_EACH}s"
  log="$DIR/fuzz_$t.log"
  # The first corpus directory collects new inputs; the seeds are only read.
  "$DIR/fuzz_$t" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=64 \
    -print_final_stats=1 -artifact_prefix="$DIR/" "${dict[@]}" "$DIR/corpus/$t" "tests/fuzz/corpus/$t" >"$log" 2>&1
  status=$?
  grep -E '^stat::(number_of_executed_units|peak_rss_mb)|^#[0-9]+.*DONE' "$log" | sed 's/^/  /'
  if ((status != 0)); then
    failed=1
    echo "fuzz_$t FAILED (exit $status); the end of its log ($log):"
    tail -n 40 "$log"
  fi
done
exit "$failed"
