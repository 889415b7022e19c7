#!/usr/bin/env bash
# Inference of an MXNet model-zoo network (ResNet-18 v1 at batch 2 unless
# MODELS and BATCHES say otherwise) while k busy loops compete for the cores,
# k = 0, 1, 2: hybra (benchmarks/bench_zoo --calls), MXNet 1.9.1 and PyTorch 2
# (benchmarks/peers/zoo_inference.py --calls), every system on the same number
# of threads. Each case times CALLS single calls; per round and load the
# systems alternate, A B C, so that the machine's noise hits all three.
# benchmarks/zoo_calls.py turns the calls into the table of docs/benchmarks.md
# (median, 90th percentile, slowdown against the quiet median).
#
#   MXNET_PYTHON=.../bin/python TORCH_PYTHON=.../bin/python bash benchmarks/zoo_under_load.sh
#
# Every case runs once with libgomp's default wait policy and once more per
# entry of WAIT_POLICIES, for all three systems (whose OpenMP runtimes are
# libgomp), as system "<name>/<entry>": a value of OMP_WAIT_POLICY, or an
# assignment such as GOMP_SPINCOUNT=1000.
#
# HYBRA_VARIANTS lists settings of hybra's own to run beside it at the
# default policy, each as system "hybra/<setting>" (default
# HYBRA_SPIN_THROTTLE=0: hybra leaving libgomp's spins as they are).
#
# Environment: THREADS (default: all cores), ROUNDS (2), LOADS (0 1 2),
# WAIT_POLICIES (passive; empty: the default only), HYBRA_VARIANTS,
# CALLS (30), BATCHES (2), MODELS (resnet18_v1), BUILD_DIR (build-bench),
# LOG (where the calls go; default $BUILD_DIR/zoo_under_load.log).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath -m "${BUILD_DIR:-$root/build-bench}")
mxnet=${MXNET_PYTHON:?a Python with mxnet==1.9.1}
torch=${TORCH_PYTHON:?a Python with torch and torchvision}
threads=${THREADS:-$(nproc)} rounds=${ROUNDS:-2} loads=${LOADS:-0 1 2} calls=${CALLS:-30}
batches=${BATCHES:-2} models=${MODELS:-resnet18_v1} policies=${WAIT_POLICIES-passive}
variants=${HYBRA_VARIANTS-HYBRA_SPIN_THROTTLE=0}
log=${LOG:-$build/zoo_under_load.log}
files="$build/zoo-under-load-models"

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DHYBRA_OPTIMIZE_PROGRAMS=ON -DHYBRA_BUILD_BENCHMARKS=ON >/dev/null
cmake --build "$build" --target bench_zoo -j "${JOBS:-2}"
rm -rf "$files"
"$mxnet" "$root/benchmarks/peers/zoo_inference.py" export "$files" --models "$models" 2>&1 | grep -v Warning

busy=()
stop_busy() {
  ((${#busy[@]})) && kill "${busy[@]}" 2>/dev/null
  busy=()
}
trap stop_busy EXIT
export OMP_NUM_THREADS=$threads
: >"$log"
for round in $(seq "$rounds"); do
  for k in $loads; do
    echo "== round $round, $k busy loops, $threads threads, load average $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"
    for _ in $(seq "$k"); do
      bash -c 'while :; do :; done' &
      busy+=($!)
    done
    for policy in default $policies; do
      unset OMP_WAIT_POLICY GOMP_SPINCOUNT
      if [[ $policy == *=* ]]; then export "$policy"; elif [[ $policy != default ]]; then export OMP_WAIT_POLICY=$policy; fi
      {
        "$build/benchmarks/bench_zoo" --models "$files" --batches "$batches" --calls "$calls"
        if [[ $policy == default ]]; then
          for variant in $variants; do
            env "$variant" "$build/benchmarks/bench_zoo" --models "$files" --batches "$batches" --calls "$calls" |
              sed "s|^\([^ ]*\)|\1/$variant|"
          done
        fi
        "$mxnet" "$root/benchmarks/peers/zoo_inference.py" mxnet "$files" --models "$models" --batches "$batches" \
          --calls "$calls"
        "$torch" "$root/benchmarks/peers/zoo_inference.py" torch --models "$models" --batches "$batches" --calls "$calls"
      } | if [[ $policy == default ]]; then sed "s/^/load:$k /"; else sed "s/^/load:$k /; s|^\(load:$k [^ ]*\)|\1/$policy|"; fi |
        tee -a "$log"
    done
    unset OMP_WAIT_POLICY GOMP_SPINCOUNT
    stop_busy
  done
done
python3 "$root/benchmarks/zoo_calls.py" "$log"
