#!/usr/bin/env bash
# Runs the GPU bundle (scripts/gpu-bundle.sh) on the lent GPU machine, from the repository root:
#
#   bash scripts/gpu-run.sh [BUNDLE]      # BUNDLE: build-gpu/hybra-gpu.tar.xz (the default), or its unpacked folder
#
# A session that is lent a GPU builds the bundle and runs this FIRST, before any other work (docs/cuda.md).
# It unpacks the archive (into $TMPDIR), adds to its kernel cache the kernels of every kernels*.tar.gz beside
# it (what an earlier run compiled there and sent back), then runs, in order, each part under a time limit of
# its own: the environment (GPU, driver, toolkit, libraries, glibc, CPU); the `gpu` test cases (with each op's
# block combine, then the tree's on every op); examples/cuda_fusion; a short training run of LeNet on cuda0
# (hybridized, then eager) and one epoch of D2L's ResNet-18 on a slice of Fashion-MNIST; bench_cuda; the same
# workloads in PyTorch (benchmarks/peers/torch_gpu.py: eager, torch.compile, CUDA graphs); bench_cuda once
# more, so that machine drift shows between the two. A skipped GPU test is a failure here. On a test failure
# the failing cases run again with HYBRA_CUDA_SYNC=1, so that the op that failed names itself. Writes at most
# 8 files to $OUT (the device tool's folder; else a folder out/ beside the bundle):
#   summary.txt (each part: status, seconds, NVRTC compiles), env.txt, tests.log, programs.log,
#   bench_cuda.json, bench_cuda_again.json, torch_peer.json, kernels.tar.gz (kernels compiled here, for the
#   next run: put it beside the archive).
# Exits non-zero if any part failed. HYBRA_GPU_PARTS picks parts (default "tests fusion train bench peer";
# "profile" adds Nsight Compute's per-kernel summary of bench_cuda's sum, softmax and hybridized MLP, in
# programs.log). HYBRA_GPU_FILTER, a regex, keeps the bench_cuda and peer cases whose names it matches.
#
# HYBRA_GPU_STANDIN=1 runs it here, on the stand-in driver, cuBLAS and NCCL the bundle carries (fake/): the
# stand-in records launches without running them, so values are not checked (the tests' failures are
# reported, not counted), cuda_fusion (whose CUDA runtime needs a real driver) and the peer are left out;
# everything else runs as there. Given the unpacked folder (as gpu-bundle.sh does), it fills its kernel cache.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source=${1:-build-gpu/hybra-gpu.tar.xz}
unpack_start=$SECONDS
if [[ -d $source ]]; then
  bundle=$(realpath "$source")
elif [[ -f $source ]]; then
  bundle=${TMPDIR:-/tmp}/hybra-gpu
  # Python's tarfile where tar has no xz to call.
  rm -rf "$bundle" && mkdir -p "$bundle" && { tar -xJf "$source" -C "$bundle" 2>/dev/null ||
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$source" "$bundle"; } ||
    { echo "gpu-run.sh: cannot unpack $source into $bundle" >&2; exit 2; }
  for extra in "$(dirname "$source")"/kernels*.tar.gz; do
    [[ -f $extra ]] && tar -xzf "$extra" -C "$bundle/kernel_cache"
  done
else
  echo "gpu-run.sh: no bundle at $source: run scripts/gpu-bundle.sh first" >&2
  exit 2
fi
[[ -x $bundle/bin/hybra_gpu_tests ]] || { echo "gpu-run.sh: $bundle holds no bin/hybra_gpu_tests" >&2; exit 2; }
unpack_seconds=$((SECONDS - unpack_start))
standin=${HYBRA_GPU_STANDIN:-0}
parts=" ${HYBRA_GPU_PARTS:-tests fusion train bench peer} "
wants() { [[ $parts == *" $1 "* ]]; }
out=${OUT:-$(dirname "$bundle")/out}
mkdir -p "$out"
summary=$out/summary.txt
: >"$summary"
failed=0
run_start=$SECONDS
note() { printf '%s\n' "$*" | tee -a "$summary"; }

# The toolkit: NVRTC compiles with its headers; NVRTC, cuBLAS(Lt) and NCCL come from its lib64.
cuda_home=${HYBRA_CUDA_HOME:-}
if [[ -z $cuda_home ]]; then
  for c in /usr/local/cuda "$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /x/x/x)")")" /usr/local/cuda-*; do
    [[ -f $c/include/cuda.h ]] && { cuda_home=$c; break; }
  done
fi
[[ -n $cuda_home ]] || { note "gpu-run.sh: no CUDA toolkit found (HYBRA_CUDA_HOME)"; exit 2; }
export HYBRA_CUDA_HOME=$cuda_home
export HYBRA_CUDA_LIB_DIR=${HYBRA_CUDA_LIB_DIR:-$cuda_home/lib64}
export HYBRA_INCLUDE_DIR=$bundle/include
export HYBRA_KERNELS_DIR=$bundle/share/hybra/kernels
export HYBRA_KERNEL_CACHE_DIR=$bundle/kernel_cache
# The tests check that every cache of compiled code holds what each request would compile (docs/cuda.md).
tests_env=(env HYBRA_CUDA_CHECK_CACHES=1)
mkdir -p "$HYBRA_KERNEL_CACHE_DIR"
# The driver: where the loader finds it, else the usual mounts of a container's driver.
if [[ $standin == 1 ]]; then
  export HYBRA_CUDA_DRIVER=$bundle/fake/libhybra_fake_cuda.so HYBRA_CUBLAS=$bundle/fake/libhybra_fake_cublas.so
  export HYBRA_CUBLASLT=$bundle/fake/libhybra_fake_cublas.so HYBRA_NCCL=$bundle/fake/libhybra_fake_nccl.so
  export HYBRA_FAKE_CUDA_MEMORY=$((3 << 30))
elif ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
  for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64; do
    [[ -e $d/libcuda.so.1 ]] && { export LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; break; }
  done
fi

{
  echo "date: $(date -u +%FT%TZ)"
  echo "mode: $([[ $standin == 1 ]] && echo "stand-in driver (no GPU)" || echo "GPU")"
  echo "bundle: $bundle ($(du -sm "$bundle" | cut -f1) MiB), built from $(head -n1 "$bundle/COMMIT" 2>/dev/null)"
  echo "toolkit: $cuda_home ($("$cuda_home/bin/nvcc" --version 2>/dev/null | tail -n1))"
  echo "glibc: $(ldd --version | head -n1)"
  echo "kernel: $(uname -r)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-) x $(nproc), flags avx2=$(grep -c -m1 avx2 /proc/cpuinfo) avx512f=$(grep -c -m1 avx512f /proc/cpuinfo)"
  echo "load: $(cat /proc/loadavg)"
  echo "LD_LIBRARY_PATH: ${LD_LIBRARY_PATH:-}"
  echo "--- nvidia-smi"
  nvidia-smi 2>&1 | head -n 20
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv 2>&1
  echo "--- CUDA libraries the loader knows"
  ldconfig -p 2>/dev/null | grep -E 'libcuda\.so|libnvrtc|libcublas|libnccl' || echo "(none)"
  ls "$HYBRA_CUDA_LIB_DIR" 2>/dev/null | grep -E '^lib(nvrtc|cublas|cublasLt|nccl)\.so' | tr '\n' ' '
  echo
  echo "--- python"
  python3 -c 'import torch, sys; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1
} >"$out/env.txt" 2>&1
cat "$out/env.txt"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
kernels() { find "$HYBRA_KERNEL_CACHE_DIR" -name '*.hkc' | wc -l; }
# The entries there before this run (a hit refreshes an entry's time, so names, not times, tell what is new).
find "$HYBRA_KERNEL_CACHE_DIR" -name '*.hkc' -printf '%f\n' | sort >"$scratch/cached_before"
# part NAME LIMIT LOG COMMAND...: runs COMMAND with a time limit, appending to LOG; notes status, seconds and
# how many kernels NVRTC had to compile (new cache entries).
part() {
  local name=$1 limit=$2 log=$3; shift 3
  local before status t0=$SECONDS
  before=$(kernels)
  echo "=== $name: $*" >>"$log"
  timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
  status=$?
  local verdict=ok
  ((status == 124 || status == 137)) && verdict="TIMED OUT after ${limit}s"
  ((status != 0 && status != 124 && status != 137)) && verdict="FAILED (exit $status)"
  note "$(printf '%-28s %4ds  %3d NVRTC compiles  %s' "$name" $((SECONDS - t0)) $(($(kernels) - before)) "$verdict")"
  return $status
}
# Stand-in runs check that everything runs, not what it computes.
counted() { if [[ $standin == 1 ]]; then "$@" || true; else "$@" || failed=1; fi; }

bin=$bundle/bin
tests_log=$out/tests.log programs_log=$out/programs.log
: >"$tests_log"
: >"$programs_log"
note "gpu-run.sh: $(grep '^mode' "$out/env.txt" | cut -d' ' -f2-), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n1)"
note "$(printf '%-28s %4ds  %3d kernels in the cache' unpack "$unpack_seconds" "$(kernels)")"

# gpu_tests LABEL [VAR=VALUE...]: the `gpu` test cases with the block combine the variables choose; on a
# failure, the failing cases once more with HYBRA_CUDA_SYNC=1.
gpu_tests() {
  local label=$1; shift
  local mark
  mark=$(wc -l <"$tests_log")
  if ! part "$label" 150 "$tests_log" "${tests_env[@]}" "$@" "$bin/hybra_gpu_tests" --no-skip -ts=gpu --duration=true; then
    counted false
    if [[ $standin != 1 ]]; then
      # doctest's filters split at commas, which test names hold: each comma becomes the wildcard '?'.
      failing=$(tail -n +"$((mark + 1))" "$tests_log" |
                awk '/^TEST CASE:/ { sub(/^TEST CASE: +/, ""); name = $0 } /ERROR:/ { print name }' |
                sed 's/,/?/g' | sort -u | paste -sd, -)
      part "$label, failing, sync" 120 "$tests_log" "${tests_env[@]}" "$@" HYBRA_CUDA_SYNC=1 "$bin/hybra_gpu_tests" \
        --no-skip "--test-case=${failing:-gpu*}" || true
    fi
  fi
}
if wants tests; then
  # 1. The `gpu` test cases: with each op's block combine (docs/cuda.md), then with the tree's forced on every
  # op (HYBRA_CUDA_CUB=0, the fallback). "no GPU:" means they skipped: a failure here.
  gpu_tests "gpu tests"
  gpu_tests "gpu tests, tree" HYBRA_CUDA_CUB=0
  grep -q "^no GPU:" "$tests_log" && { note "gpu tests: SKIPPED (no GPU): a failure"; failed=1; }
  grep -E '^\[doctest\] (test cases|assertions)' "$tests_log" | tee -a "$summary"
  if [[ $standin == 1 ]]; then  # the stand-in's wrong values: tens of thousands of failed checks
    { head -n 100 "$tests_log"; echo "[...]"; grep -E '^\[doctest\]|TEST CASE' "$tests_log"; } >"$scratch/tests.log"
    mv "$scratch/tests.log" "$tests_log"
  fi
fi

# 2. The nvcc-compiled example, and LeNet trained on cuda0.
wants fusion && [[ $standin != 1 ]] && { part "cuda_fusion" 60 "$programs_log" "$bin/cuda_fusion" || failed=1; }
if wants train; then
  data=$bundle/data/fashion-mnist
  part "train_lenet hybridized" 90 "$programs_log" "$bin/train_lenet" --devices cuda0 --data "$data" --epochs 2 \
    --csv "$scratch/hybridized.csv" || counted false
  part "train_lenet eager, smoke" 60 "$programs_log" "$bin/train_lenet" --devices cuda0 --data "$data" --smoke \
    --no-hybridize --csv "$scratch/eager.csv" || counted false
  # The book's network and batch; on the stand-in, whose cuBLAS multiplies on the host, a narrow copy on a few
  # batches compiles the same kernels.
  resnet_args=(--width 64 --batch-size 256 --train-size 12288)
  [[ $standin == 1 ]] && resnet_args=(--width 8 --batch-size 64 --train-size 256 --test-size 256)
  part "train_resnet hybridized" 150 "$programs_log" "$bin/train_resnet" --devices cuda0 --data "$data" --epochs 1 \
    "${resnet_args[@]}" --csv "$scratch/resnet.csv" || counted false
  grep -E 'epoch|accuracy|LeNet|ResNet' "$programs_log" | tail -n 9 | tee -a "$summary"
fi

# 3. bench_cuda, the PyTorch peer, bench_cuda again (A B A: drift shows as A's two runs disagreeing).
bench_args=(--benchmark_repetitions=3 --benchmark_report_aggregates_only=false --benchmark_min_time=0.3
            --benchmark_enable_random_interleaving=true)
peer_args=()
if [[ -n ${HYBRA_GPU_FILTER:-} ]]; then
  bench_args+=("--benchmark_filter=$HYBRA_GPU_FILTER")
  peer_args+=(--filter "$HYBRA_GPU_FILTER")
fi
if [[ $standin == 1 ]]; then
  # The stand-in computes products on the host: one short iteration of each case that compiles any kernel
  # (the GEMMs compile none).
  bench_args=(--benchmark_filter='-gemm' --benchmark_min_time=0.0001)
fi
bench() {
  part "bench_cuda ($1)" 100 "$programs_log" "$bin/bench_cuda" "${bench_args[@]}" \
    --benchmark_out="$out/$1.json" --benchmark_out_format=json || counted false
}
wants bench && bench bench_cuda
if [[ $standin != 1 ]] && wants peer; then
  part "torch peer" 180 "$programs_log" env PYTHONUNBUFFERED=1 python3 benchmarks/peers/torch_gpu.py \
    --out "$out/torch_peer.json" "${peer_args[@]}" || failed=1
  wants bench && bench bench_cuda_again
fi
if [[ $standin != 1 ]] && wants profile; then
  ncu=$(command -v ncu || ls "$cuda_home"/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n1)
  part "ncu profile" 150 "$programs_log" "${ncu:-ncu}" --clock-control none --print-summary per-kernel --launch-count 200 \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,launch__block_size,launch__registers_per_thread \
    "$bin/bench_cuda" --benchmark_filter='BM_cuda_(sum|softmax|mlp/hybridized)' --benchmark_min_time=0.001 ||
    failed=1
fi

# What NVRTC compiled here, for the next run's cache (gpu-bundle.sh's cache plus these).
new=$(find "$HYBRA_KERNEL_CACHE_DIR" -name '*.hkc' -printf '%f\n' | sort | comm -13 "$scratch/cached_before" -)
[[ -n $new && $standin != 1 ]] && tar -czf "$out/kernels.tar.gz" -C "$HYBRA_KERNEL_CACHE_DIR" $new
note "$(printf 'total %ds, %d kernels in the cache, %d compiled in this run' $((SECONDS - run_start)) "$(kernels)" \
  "$(printf '%s' "$new" | grep -c .)")"
[[ $standin == 1 ]] && note "(stand-in: values not checked; the tests' failures above are the stand-in's)"
((failed)) && { note "gpu-run.sh: FAILED"; exit 1; }
note "gpu-run.sh: all parts passed"
