#!/usr/bin/env bash
# The GPU tests and benchmarks: builds everything in build/ (Release), runs the
# ctest label `gpu`, then bench_cuda twice: once with an empty kernel cache
# (its first kernel is an NVRTC compile), then with the cache it left (a disk
# hit) and every case, 5 interleaved repetitions, JSON in build/bench_cuda.json.
# A GPU test that skips (no GPU, no driver) fails this script: on a machine
# meant to have a GPU, a skip is a failure. docs/cuda.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${HYBRA_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHYBRA_OPTIMIZE_PROGRAMS=ON >/dev/null
cmake --build "$build" --parallel "$(nproc)"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
ctest --test-dir "$build" -L gpu --output-on-failure 2>&1 | tee "$log"
if grep -q "(Skipped)" "$log"; then
  echo "gpu.sh: a GPU test was skipped: there is no usable GPU here" >&2
  exit 1
fi
cache=$(mktemp -d)
trap 'rm -f "$log"; rm -rf "$cache"' EXIT
HYBRA_KERNEL_CACHE_DIR=$cache "$build/benchmarks/bench_cuda" --benchmark_filter=none
HYBRA_KERNEL_CACHE_DIR=$cache "$build/benchmarks/bench_cuda" \
  --benchmark_repetitions=5 --benchmark_report_aggregates_only=true --benchmark_enable_random_interleaving=true \
  --benchmark_out="$build/bench_cuda.json" --benchmark_out_format=json
