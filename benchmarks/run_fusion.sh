#!/usr/bin/env bash
# Builds bench_fusion (Release, -O3 -march=native) and runs every case 5 times,
# repetitions of different cases interleaved in random order so that a change
# in machine load hits all implementations alike. Writes the aggregates as
# JSON to $BUILD_DIR/bench_fusion.json and prints a table of medians with the
# hybra/eigen and hybra/unfused ratios.
#
#   bash benchmarks/run_fusion.sh                  # build dir: build/
#   BUILD_DIR=build-bench bash benchmarks/run_fusion.sh --benchmark_filter=long
#
# Extra arguments go to bench_fusion. JOBS (default 2) sets build parallelism.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath -m "${BUILD_DIR:-$root/build}")
json="$build/bench_fusion.json"

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" --target bench_fusion -j "${JOBS:-2}"

echo "load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)"
"$build/benchmarks/bench_fusion" \
  --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
  --benchmark_enable_random_interleaving=true \
  --benchmark_out="$json" --benchmark_out_format=json "$@"
echo "load average after the run:  $(cut -d' ' -f1-3 /proc/loadavg)"
python3 "$root/benchmarks/fusion_table.py" "$json"
