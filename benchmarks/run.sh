#!/usr/bin/env bash
# Builds a benchmark target (Release, -O3 -march=native) and runs every case 5
# times, repetitions of different cases interleaved in random order so that a
# change in machine load hits all cases alike. Writes the aggregates as JSON to
# $BUILD_DIR/<target>.json and prints the medians. Figures go to docs/benchmarks.md.
#
#   bash benchmarks/run.sh bench_hybridize               # build dir: build/
#   BUILD_DIR=build-bench bash benchmarks/run.sh bench_engine --benchmark_filter=fused
#
# Extra arguments go to the benchmark. JOBS (default 2) sets build parallelism.
set -euo pipefail
target=${1:?usage: run.sh TARGET [benchmark arguments]}
shift
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath -m "${BUILD_DIR:-$root/build}")

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DHYBRA_OPTIMIZE_PROGRAMS=ON -DHYBRA_BUILD_BENCHMARKS=ON >/dev/null
cmake --build "$build" --target "$target" -j "${JOBS:-2}"

echo "load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)"
"$build/benchmarks/$target" \
  --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
  --benchmark_enable_random_interleaving=true \
  --benchmark_out="$build/$target.json" --benchmark_out_format=json "$@" 2>&1 | grep -v '_mean\|_stddev\|_cv'
echo "load average after the run:  $(cut -d' ' -f1-3 /proc/loadavg)"
