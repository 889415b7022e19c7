#!/usr/bin/env bash
# Builds bench_engine (Release, -O3 -march=native) and runs every case 5
# times, repetitions of different cases interleaved in random order, printing
# medians. Figures go to docs/benchmarks.md.
#
#   bash benchmarks/run_engine.sh                  # build dir: build/
#   bash benchmarks/run_engine.sh --benchmark_filter=fused
#
# Extra arguments go to bench_engine. JOBS (default 2) sets build parallelism.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath -m "${BUILD_DIR:-$root/build}")

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" --target bench_engine -j "${JOBS:-2}"

echo "load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)"
"$build/benchmarks/bench_engine" \
  --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
  --benchmark_enable_random_interleaving=true "$@" 2>&1 | grep -v '_mean\|_stddev\|_cv'
echo "load average after the run:  $(cut -d' ' -f1-3 /proc/loadavg)"
