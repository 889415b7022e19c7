#!/usr/bin/env bash
# Configures hybra (Release, Ninja, build dir `build`), builds the main demo
# and runs it. Extra arguments are passed to the demo.
set -euo pipefail

DEMO=hybrid_mlp   # the main demo: an example under examples/<name>/

cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD_DIR=${HYBRA_BUILD_DIR:-build}

[[ -f examples/$DEMO/main.cpp ]] || { echo "demo.sh: ERROR: examples/$DEMO/main.cpp not found" >&2; exit 1; }

cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHYBRA_OPTIMIZE_PROGRAMS=ON --log-level=WARNING >/dev/null
cmake --build "$BUILD_DIR" --target "$DEMO"
exe="$BUILD_DIR/examples/$DEMO"
[[ -x $exe ]] || { echo "demo.sh: ERROR: built $DEMO but found no executable at $exe" >&2; exit 1; }
echo "== running $exe $*"
"$exe" "$@"
