#!/usr/bin/env bash
# Runs bench_fusion through run.sh, then prints a table of medians with the
# hybra/eigen and hybra/unfused ratios.
#
#   bash benchmarks/run_fusion.sh                  # build dir: build/
#   BUILD_DIR=build-bench bash benchmarks/run_fusion.sh --benchmark_filter=long
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath -m "${BUILD_DIR:-$root/build}")
bash "$root/benchmarks/run.sh" bench_fusion "$@"
python3 "$root/benchmarks/fusion_table.py" "$build/bench_fusion.json"
