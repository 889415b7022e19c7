#!/usr/bin/env bash
# Model files between hybra and MXNet 1.9.1, both ways: MXNet exports models
# (every family of its vision model zoo among them) that hybra imports and
# runs, each five times from a fresh import, hybra exports models that MXNet
# imports and runs; each side compares the outputs with the other's
# (max |a - b| / max |b| <= 1e-4).
#   run.sh INTEROP_PROGRAM PYTHON
# PYTHON must import mxnet (scripts/test.sh makes a venv with mxnet==1.9.1
# from PyPI); without one the test is skipped (exit 77) and says why.
set -uo pipefail
interop=$1 python=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if ! "$python" -c "import mxnet" >/dev/null 2>&1; then
  echo "SKIPPED: no Python with mxnet at '$python' (scripts/test.sh installs mxnet==1.9.1 there from PyPI when it can)"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/from-mxnet" "$work/from-hybra"
"$python" "$here/mxnet_interop.py" export "$work/from-mxnet" &&
  "$interop" check "$work/from-mxnet" 5 &&
  "$interop" export "$work/from-hybra" &&
  "$python" "$here/mxnet_interop.py" check "$work/from-hybra"
