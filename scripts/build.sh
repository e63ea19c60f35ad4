#!/usr/bin/env bash
# Configures and builds Towers into build/ (or $TOWERS_BUILD_DIR). Release-grade optimisation.
#   scripts/build.sh                    everything: libraries, towerd, towerctl, tests, benchmarks
#   scripts/build.sh towerd towerctl    only these targets (scripts/run.sh)
# $TOWERS_CMAKE_ARGS: more configure options (scripts/build-arm64.sh: the cross toolchain).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${TOWERS_BUILD_DIR:-$root/build}"
jobs="$(nproc 2>/dev/null || echo 2)"
# shellcheck disable=SC2086  # TOWERS_CMAKE_ARGS is a list of options
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${TOWERS_CMAKE_ARGS:-} >/dev/null
if [ $# -gt 0 ]; then
  cmake --build "$build" -j "$jobs" --target "$@"
else
  cmake --build "$build" -j "$jobs"
fi
