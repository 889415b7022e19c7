#!/usr/bin/env bash
# D2L 8.5's ResNet-18 trained for one epoch on the first TRAIN_SIZE images of
# Fashion-MNIST (batch BATCH, width WIDTH; SGD lr 0.1, momentum 0.9): hybra's
# examples/train_resnet hybridized and eager, MXNet 1.9.1 Gluon hybridized and
# eager, PyTorch 2 eager, in rounds that alternate them, on the same threads.
# Prints each run's median step time, its spread, the loss and the test
# accuracy after the epoch. Figures go to docs/benchmarks.md.
#
#   MXNET_PYTHON=.../bin/python TORCH_PYTHON=.../bin/python bash benchmarks/resnet18_train.sh
#
# Environment: THREADS (default: all cores), ROUNDS (2), WIDTH (64), BATCH (64), TRAIN_SIZE (2048),
# TEST_SIZE (1000), BUILD_DIR (build-bench).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath -m "${BUILD_DIR:-$root/build-bench}")
mxnet=${MXNET_PYTHON:?a Python with mxnet==1.9.1}
torch=${TORCH_PYTHON:?a Python with torch}
threads=${THREADS:-$(nproc)} rounds=${ROUNDS:-2}
args=(--width "${WIDTH:-64}" --batch-size "${BATCH:-64}" --train-size "${TRAIN_SIZE:-2048}" --test-size "${TEST_SIZE:-1000}")

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DHYBRA_OPTIMIZE_PROGRAMS=ON -DHYBRA_BUILD_EXAMPLES=ON >/dev/null
cmake --build "$build" --target train_resnet -j "${JOBS:-2}"
export OMP_NUM_THREADS=$threads
peer="$root/benchmarks/peers/resnet18_train.py"
for round in $(seq "$rounds"); do
  echo "== round $round, $threads threads, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  for mode in --hybridize --no-hybridize; do
    echo -n "hybra ${mode#--}: "
    "$build/examples/train_resnet" "${args[@]}" --epochs 1 $mode --csv "$build/train_resnet$mode.csv" | grep '^epoch 1:'
  done
  "$mxnet" "$peer" mxnet --hybridize "${args[@]}" --threads "$threads" 2>&1 | grep -v Warning
  "$mxnet" "$peer" mxnet "${args[@]}" --threads "$threads" 2>&1 | grep -v Warning
  "$torch" "$peer" torch "${args[@]}" --threads "$threads"
done
