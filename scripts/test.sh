#!/usr/bin/env bash
# The whole test suite. Exits non-zero if anything fails.
#   0. build/mxnet-venv/  Python venv with mxnet==1.9.1 and numpy 1.23.5 from
#                   PyPI, best effort, for the MXNet interop test of stage 1.
#   1. build/       Release: configure, build everything, then ctest. The
#                   unit and MPI tests are built with AddressSanitizer + UBSan
#                   (HYBRA_TEST_SANITIZE) and run with leak detection; -O0 -g1:
#                   the same checks as -O1 at half the compile time, and -g1
#                   still gives file:line. UBSan without its null and alignment
#                   checks, which cost another third of the compile time: ASan
#                   reports null dereferences itself, and the fuzz stage (clang,
#                   full UBSan) checks the alignment of what the parsers read.
#                   Everything else uninstrumented: the GPU test cases
#                   (test_gpu.cpp: ASan and the CUDA driver want the same
#                   addresses), the examples at -O1, the benchmarks at -O0 to
#                   check that they build, not run (HYBRA_OPTIMIZE_PROGRAMS=OFF),
#                   and the packaging tests' -O3 build; ctest runs the unit tests,
#                   examples (--smoke), compile-fail tests (hybra's
#                   static_asserts), the packaging tests (install to a fresh
#                   prefix + find_package consumer, add_subdirectory consumer),
#                   and model files both ways between hybra and MXNet (interop).
#   2. build-fuzz/  libFuzzer + ASan/UBSan on the model-file parsers
#                   (tests/fuzz/run.sh): 25 s per target from the seed corpora,
#                   failing on any crash, stray exception or sanitizer report.
#   3. build-tsan/  ThreadSanitizer, MPI tests and the unit tests but
#                   test_gpu.cpp and the files whose code under test runs on
#                   one thread (HYBRA_UNIT_TESTS_LEFT_OUT): the engine's worker
#                   threads, its waits and the async tests, checked for data races
#                   and lock-order inversions, and the pieces of parallel loops.
#                   Built with -DHYBRA_OPENMP=OFF (libgomp is not instrumented:
#                   its barriers look like races) and -DHYBRA_THREAD_LOOPS=ON
#                   (parallel loops on std::threads instead), -O1 -g1.
# A failing stage does not stop the others (except the stages that need its
# output); the summary at the end lists each stage with its wall time.
# Environment: HYBRA_BUILD_DIR, HYBRA_TSAN_BUILD_DIR,
# HYBRA_FUZZ_DIR (build directories), HYBRA_MXNET_VENV (default
# build/mxnet-venv), HYBRA_JOBS (parallel ctest jobs, default: number of
# cores), HYBRA_FUZZ_SECONDS (fuzzing time per target, default 25).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD_DIR=${HYBRA_BUILD_DIR:-build}
TSAN_DIR=${HYBRA_TSAN_BUILD_DIR:-build-tsan}
JOBS=${HYBRA_JOBS:-$(nproc)}
# One build job per core: ninja's default (cores + 2) gains no speed, and
# under the sanitizers the big translation units take several GB each.
BUILD_JOBS=$(nproc)
SANITIZE="-fsanitize=address,undefined -fno-sanitize=null,alignment -fno-omit-frame-pointer -fno-sanitize-recover=all"
TSAN="-fsanitize=thread"

# allocator_may_return_null (ASan and TSan): the tests check that an impossible
# allocation is an OutOfMemory exception, which needs the allocator to fail
# rather than abort. max_free_fill_size: freed memory (up to 1 GiB a block) is
# overwritten with 0x55 bytes (1.5e13 as a float), so that a read after free
# by code ASan does not see (oneDNN, OpenBLAS) gives a wrong answer the tests
# catch, not the old values.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1:strict_string_checks=1:detect_stack_use_after_return=1:max_free_fill_size=1073741824}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# second_deadlock_stack: a lock-order report shows where both mutexes were taken.
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:allocator_may_return_null=1}
export CTEST_OUTPUT_ON_FAILURE=1

summary=()
failed=0
total_start=$SECONDS

# stage NAME COMMAND...: runs COMMAND, records its status and wall time.
stage() {
  local name=$1; shift
  echo
  echo "=== [$name] $*"
  local start=$SECONDS status
  "$@"
  status=$?
  local t=$((SECONDS - start))
  if ((status == 0)); then
    summary+=("$(printf '  %-22s %3dm%02ds  ok' "$name" $((t / 60)) $((t % 60)))")
  else
    summary+=("$(printf '  %-22s %3dm%02ds  FAILED (exit %d)' "$name" $((t / 60)) $((t % 60)) "$status")")
    failed=1
  fi
  return "$status"
}
# run_ctest DIR ARGS...: ctest with its closing summary line kept for the end.
ctest_lines=()
run_ctest() {
  local dir=$1; shift
  local log status
  log=$(mktemp)
  # --timeout: a test that hangs fails after 10 minutes instead of ctest's 25.
  ctest --test-dir "$dir" --output-on-failure -j "$JOBS" --timeout 600 "$@" 2>&1 | tee "$log"
  status=${PIPESTATUS[0]}
  ctest_lines+=("  $dir: $(grep -E '^[0-9]+% tests passed' "$log" | tail -n1)")
  rm -f "$log"
  return "$status"
}
skip() { summary+=("$(printf '  %-22s      -    skipped (%s)' "$1" "$2")"); failed=1; }

# 0. MXNet 1.9.1 from PyPI, in a venv, for the interop test (tests/interop/):
# best effort. Without it that test says why and is skipped; nothing fails.
MXNET_VENV=${HYBRA_MXNET_VENV:-$BUILD_DIR/mxnet-venv}
[[ $MXNET_VENV == /* ]] || MXNET_VENV=$PWD/$MXNET_VENV
mxnet_venv() {
  "$MXNET_VENV/bin/python" -c "import mxnet" >/dev/null 2>&1 && return 0
  python3 -m venv "$MXNET_VENV" &&
    timeout 600 "$MXNET_VENV/bin/pip" install -q --disable-pip-version-check mxnet==1.9.1 numpy==1.23.5 &&
    "$MXNET_VENV/bin/python" -c "import mxnet"
}
start=$SECONDS
if mxnet_venv; then
  summary+=("$(printf '  %-22s %3dm%02ds  ok' "mxnet venv" $(((SECONDS - start) / 60)) $(((SECONDS - start) % 60)))")
else
  summary+=("$(printf '  %-22s      -    unavailable: interop test skipped' "mxnet venv")")
fi

# 1. Release build: everything, then the full ctest suite; the unit and MPI
# tests under ASan + UBSan.
if stage "configure" cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
     -DHYBRA_BUILD_TESTS=ON -DHYBRA_BUILD_EXAMPLES=ON -DHYBRA_BUILD_BENCHMARKS=ON -DHYBRA_OPTIMIZE_PROGRAMS=OFF \
     "-DHYBRA_TEST_SANITIZE=-O0 -g1 $SANITIZE" --log-level=WARNING \
     "-DHYBRA_MXNET_PYTHON=$MXNET_VENV/bin/python"; then
  if stage "build" cmake --build "$BUILD_DIR" --parallel "$BUILD_JOBS"; then
    stage "ctest" run_ctest "$BUILD_DIR"
  else
    skip "ctest" "build failed"
  fi
else
  skip "build" "configure failed"; skip "ctest" "configure failed"
fi

# 2. Fuzzing the model-file parsers; run.sh builds its targets with clang++
# in HYBRA_FUZZ_DIR (default build-fuzz).
stage "fuzz" tests/fuzz/run.sh

# sanitized NAME DIR FLAGS CMAKE_ARGS...: configure DIR with the sanitizer
# FLAGS (compile and link), build the unit tests and examples, run them. The
# stand-in GPU tests read the kernels stage 1 compiled (NVRTC's output does
# not depend on the sanitizer) from its kernel cache.
# Compile-fail and packaging tests do not run sanitized code: stage 1 ran them,
# as it builds the nvcc-compiled programs (HYBRA_NVCC), which no sanitizer sees.
sanitized() {
  local name=$1 dir=$2 flags=$3; shift 3
  if stage "$name configure" cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
       "-DCMAKE_CXX_FLAGS=$flags" -DCMAKE_CXX_FLAGS_DEBUG=-g1 "-DCMAKE_EXE_LINKER_FLAGS=$flags" \
       -DHYBRA_BUILD_TESTS=ON -DHYBRA_BUILD_EXAMPLES=ON -DHYBRA_BUILD_BENCHMARKS=OFF -DHYBRA_NVCC=OFF \
       "-DHYBRA_TEST_KERNEL_CACHE=$(realpath -m "$BUILD_DIR")/tests/kernel_cache" --log-level=WARNING "$@"; then
    if stage "$name build" cmake --build "$dir" --parallel "$BUILD_JOBS"; then
      stage "$name ctest" run_ctest "$dir" -LE 'compile_fail|consumer'
    else
      skip "$name ctest" "build failed"
    fi
  else
    skip "$name build" "configure failed"; skip "$name ctest" "configure failed"
  fi
}

# 3. ThreadSanitizer, without OpenMP (libgomp is not instrumented): the unit
# tests (the engine, its waits, the async and data-parallel tests) and the
# MPI tests, parallel loops on std::threads (HYBRA_THREAD_LOOPS) so that a
# race inside one is seen too. OpenBLAS is not instrumented either, but hybra
# runs it single-threaded, on the calling (checked) thread. The examples,
# whose threads are the engine's, are left to stage 1: built here they cost
# ~8 minutes of a 2-core CI run.
# Left out: test_gpu.cpp, the unit test files whose code under test runs on
# one thread (tests/CMakeLists.txt, HYBRA_UNIT_TESTS_LEFT_OUT), and the
# suite's second run on the NaiveEngine.
sanitized tsan "$TSAN_DIR" "-O1 $TSAN" -DHYBRA_OPENMP=OFF -DHYBRA_THREAD_LOOPS=ON -DHYBRA_BUILD_EXAMPLES=OFF \
  "-DHYBRA_UNIT_TESTS_LEFT_OUT=gpu;thrust;io_formats;model_io;half;layout;tensor;transformer"

t=$((SECONDS - total_start))
echo
echo "=== test.sh summary (wall time per stage, $(nproc) cores)"
printf '%s\n' "${summary[@]}"
printf '  %-22s %3dm%02ds\n' "total" $((t / 60)) $((t % 60))
((${#ctest_lines[@]})) && printf '%s\n' "${ctest_lines[@]}"
if ((failed)); then
  echo "test.sh: FAILED"
  exit 1
fi
echo "test.sh: all stages passed"
