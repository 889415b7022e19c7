#!/usr/bin/env bash
# What a distinct expression costs at compile time: GCC compiles a translation
# unit with 16 expressions of different types (x op1 (y op2 z), each op one of
# + - * /) and one with none, both including <hybra/hybra.hpp> as hybra's own
# programs do (HYBRA_SEPARATE_COMPILATION, -O1); the difference over 16 is
# the cost of one expression. Given several include directories (hybra's
# `include/` from two checkouts), it compiles each side's pair at the same
# time, one per core, so that the machine's swings (2x within minutes on the
# shared VMs) hit both sides alike, and repeats that ROUNDS times.
#   benchmarks/compile_time.sh [INCLUDE_DIR...]   (default: this checkout's include/)
# Environment: CXX (default c++), ROUNDS (default 2).
# Figures: docs/benchmarks.md, "Compile time of an expression".
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
(($#)) || set -- "$here/include"
cxx=${CXX:-c++}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

{
  echo '#include <hybra/hybra.hpp>'
  echo 'using hybra::Tensor;'
  k=0
  for a in + - '*' /; do
    for b in + - '*' /; do
      echo "Tensor f$k(const Tensor& x, const Tensor& y, const Tensor& z) { return x $a (y $b z); }"
      k=$((k + 1))
    done
  done
  echo 'int main() {}'
} > "$work/expressions.cpp"
printf '#include <hybra/hybra.hpp>\nint main() {}\n' > "$work/none.cpp"

flags=(-std=gnu++20 -O1 -fno-math-errno -fopenmp -DHYBRA_SEPARATE_COMPILATION -DHYBRA_WITH_ONEDNN=1
       -I/usr/local/cuda/include/cccl)
# seconds FILE INCLUDE: wall seconds of one compile, to a tenth.
seconds() {
  local start
  start=$(date +%s%N)
  "$cxx" "${flags[@]}" "-I$2" -c "$work/$1.cpp" -o "$work/$1.$BASHPID.o"
  local tenths=$((($(date +%s%N) - start) / 100000000))
  echo "$((tenths / 10)).$((tenths % 10))"
}
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for ((round = 1; round <= ${ROUNDS:-2}; ++round)); do
  for file in expressions none; do
    pids=()
    for dir in "$@"; do
      (printf 'round %d  %-11s %6s s  %s\n' "$round" "$file" "$(seconds "$file" "$dir")" "$dir") &
      pids+=($!)
    done
    wait "${pids[@]}"
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
