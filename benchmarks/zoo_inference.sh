#!/usr/bin/env bash
# Inference of MXNet model-zoo networks (ResNet-18/50 v1, MobileNet v2,
# DenseNet-121, VGG-11, AlexNet; 224x224; batch 1, 2 and 32): hybra imports
# the files MXNet exports (benchmarks/bench_zoo), MXNet 1.9.1 runs the same
# files, PyTorch 2 runs torchvision's same networks, every system on the same
# number of threads (MXNet uses one OpenMP thread unless OMP_NUM_THREADS says
# otherwise). Rounds alternate the systems per network, A B C A B C, so that
# the machine's noise hits all three. Figures go to docs/benchmarks.md.
#
#   MXNET_PYTHON=.../bin/python TORCH_PYTHON=.../bin/python bash benchmarks/zoo_inference.sh
#
# Environment: THREADS (default: all cores), ROUNDS (2), BATCHES (1,2,32),
# MODELS (all six, comma-separated), BUILD_DIR (build-bench), BASELINE (a
# bench_zoo binary of another build, run beside this one's: before / after).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath -m "${BUILD_DIR:-$root/build-bench}")
mxnet=${MXNET_PYTHON:?a Python with mxnet==1.9.1}
torch=${TORCH_PYTHON:?a Python with torch and torchvision}
threads=${THREADS:-$(nproc)} rounds=${ROUNDS:-2} batches=${BATCHES:-1,2,32}
models=${MODELS:-resnet18_v1,resnet50_v1,mobilenetv2_1.0,densenet121,vgg11,alexnet}
files="$build/zoo-models"

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DHYBRA_OPTIMIZE_PROGRAMS=ON -DHYBRA_BUILD_BENCHMARKS=ON >/dev/null
cmake --build "$build" --target bench_zoo -j "${JOBS:-2}"
"$mxnet" "$root/benchmarks/peers/zoo_inference.py" export "$files" --models "$models" 2>&1 | grep -v Warning
export OMP_NUM_THREADS=$threads
# One system after another per network, so that the machine's slow spells
# (these VMs change speed by a quarter for minutes at a time) hit all of them.
# BASELINE=<another bench_zoo> runs that build too, before this one.
hybra_case() {  # binary label model
  "$1" --models "$files" --batches "$batches" --benchmark_filter="^${3//./\\.}/batch:($(echo "$batches" | tr , '|'))/" \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true 2>/dev/null |
    awk -v label="$2" '/_median/ {sub("/min_time.*", "", $1); printf "%s %s %s ms (median of 3 repetitions)\n", label, $1, $2}'
}
for round in $(seq "$rounds"); do
  echo "== round $round, $threads threads, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  for model in ${models//,/ }; do
    [ -n "${BASELINE:-}" ] && hybra_case "$BASELINE" hybra-baseline "$model"
    hybra_case "$build/benchmarks/bench_zoo" hybra "$model"
    "$mxnet" "$root/benchmarks/peers/zoo_inference.py" mxnet "$files" --models "$model" --batches "$batches" 2>&1 | grep -v Warning
    "$torch" "$root/benchmarks/peers/zoo_inference.py" torch --models "$model" --batches "$batches"
  done
done
