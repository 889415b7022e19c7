#!/usr/bin/env bash
# The GPU tests: builds everything in build/ (Release) and runs the ctest label
# `gpu`. A GPU test that skips (no GPU, no driver) fails this script: on a
# machine meant to have a GPU, a skip is a failure. docs/cuda.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${HYBRA_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --parallel "$(nproc)"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
ctest --test-dir "$build" -L gpu --output-on-failure 2>&1 | tee "$log"
if grep -q "(Skipped)" "$log"; then
  echo "gpu.sh: a GPU test was skipped: there is no usable GPU here" >&2
  exit 1
fi
