#!/usr/bin/env bash
# train_lenet stopped after one epoch and resumed for the second ends with the
# weights and Trainer state of a run of two epochs, byte for byte, and with its
# learning curve; a resume that cannot continue is an error that names why.
#   resume.sh TRAIN_LENET
set -euo pipefail
train_lenet=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
small=(--batch-size 64 --train-size 1024 --test-size 256 --no-hybridize --seed 3)
"$train_lenet" "${small[@]}" --epochs 2 --save "$dir/whole" --csv "$dir/whole.csv"
"$train_lenet" "${small[@]}" --epochs 1 --save "$dir/first" --csv "$dir/first.csv"
cp "$dir/first.csv" "$dir/resumed.csv"  # the curve goes on in the first run's CSV
"$train_lenet" "${small[@]}" --epochs 2 --resume "$dir/first" --save "$dir/resumed" --csv "$dir/resumed.csv" |
  tee "$dir/resumed.log"
grep -q "resumed after epoch 1 of $dir/first" "$dir/resumed.log"
cmp "$dir/whole.params" "$dir/resumed.params"
cmp "$dir/whole.states" "$dir/resumed.states"
# Both epochs' rows, the first kept from the first run: the whole run's curve (but for its times).
[[ $(cut -d, -f1-4 "$dir/resumed.csv") == $(cut -d, -f1-4 "$dir/whole.csv") ]]
# Nothing left to run, and another batch size: errors, not a silent restart.
fails() {  # fails WHY ARGS...: train_lenet ARGS exits non-zero, saying WHY
  local why=$1
  shift
  if "$train_lenet" "$@" 2>"$dir/err"; then
    echo "train_lenet $* succeeded; expected: $why" >&2
    exit 1
  fi
  grep -q "$why" "$dir/err" || { cat "$dir/err" >&2; exit 1; }
}
fails "leaves none to run" "${small[@]}" --epochs 1 --resume "$dir/first"
fails "not whole epochs" "${small[@]/64/100}" --epochs 2 --resume "$dir/first"
echo "resumed run equals the uninterrupted one"
