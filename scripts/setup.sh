#!/usr/bin/env bash
# Installs everything hybra needs to build, test and benchmark, from Debian 12
# packages. Idempotent: packages already installed are left alone, and
# `apt-get update` runs only when something is missing. Quiet unless it fails.
set -euo pipefail

packages=(
  cmake ninja-build g++ git ccache pkg-config
  libboost1.81-dev # Boost.Yap/Hana 1.81 (NOT libboost-dev, which is 1.74)
  libboost-json1.81-dev # Boost.JSON, compiled: model files (include/hybra/io/)
  libboost-program-options1.81-dev # the examples' command lines (examples/common/command_line.hpp)
  doctest-dev libopenblas-dev libbenchmark-dev libeigen3-dev zlib1g-dev
  libdnnl-dev # oneDNN: the convolutions where it is faster (include/hybra/ops/conv_onednn.hpp)
  clang libclang-rt-14-dev # libFuzzer and its sanitizer runtimes: tests/fuzz/run.sh
  python3-venv # the MXNet interop test's venv (mxnet from PyPI): tests/interop/
  libopenmpi-dev openmpi-bin # training across processes: include/hybra/parallel/mpi.hpp
  dataset-fashion-mnist # real Fashion-MNIST (/usr/share/datasets/fashion-mnist): examples/train_lenet
)

die() { echo "setup.sh: ERROR: $*" >&2; exit 1; }

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || die "not root and no sudo: run as root"
  sudo=(sudo)
fi
command -v apt-get >/dev/null || die "apt-get not found: this script supports Debian 12 only"

installed() { [[ $(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null) == installed ]]; }

missing=()
for p in "${packages[@]}"; do installed "$p" || missing+=("$p"); done

if ((${#missing[@]})); then
  echo "setup.sh: installing ${missing[*]}"
  log=$(mktemp)
  trap 'rm -f "$log"' EXIT
  export DEBIAN_FRONTEND=noninteractive
  if ! "${sudo[@]}" apt-get update -qq >"$log" 2>&1; then
    cat "$log" >&2; die "apt-get update failed"
  fi
  if ! "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$log" 2>&1; then
    tail -n 40 "$log" >&2; die "apt-get install failed for: ${missing[*]}"
  fi
fi

# Verify, so a half-installed machine fails here rather than in CMake.
for p in "${packages[@]}"; do installed "$p" || die "package $p is not installed"; done
for tool in cmake ninja g++ clang++ git ccache pkg-config; do
  command -v "$tool" >/dev/null || die "$tool is not on PATH"
done
boost=$(sed -n 's/^#define BOOST_LIB_VERSION "\(.*\)"/\1/p' /usr/include/boost/version.hpp 2>/dev/null || true)
[[ $boost == 1_81 ]] || die "expected Boost 1.81 headers in /usr/include/boost, found '${boost:-none}'"
[[ -f /usr/include/boost/yap/yap.hpp ]] || die "Boost.Yap headers are missing"
[[ -f /usr/include/boost/json.hpp ]] || die "Boost.JSON headers are missing"
echo "setup.sh: ok ($(cmake --version | head -n1), g++ $(g++ -dumpfullversion), Boost ${boost/_/.})"
