#!/usr/bin/env bash
# Configures and builds Towers.
#   scripts/build.sh                    everything into build/ (or $TOWERS_BUILD_DIR): libraries,
#                                       towerd, towerctl, tests, benchmarks; RelWithDebInfo
#   scripts/build.sh towerd towerctl    only these targets (scripts/run.sh)
#   scripts/build.sh --check [TARGET...]
#                                       the checking build into build-check/ (or $TOWERS_CHECK_BUILD_DIR):
#                                       clang, Debug (asserts and the debug-only checks on), ASan and
#                                       UBSan on everything; by default the unit tests, towerd and the
#                                       libFuzzer targets (scripts/test.sh --check, bench/fuzz.sh)
# $TOWERS_CMAKE_ARGS: more configure options (scripts/build-arm64.sh: the cross toolchain).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
jobs="$(nproc 2>/dev/null || echo 2)"
if [ "${1:-}" = --check ]; then
  shift
  build="${TOWERS_CHECK_BUILD_DIR:-$root/build-check}"
  CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DTOWERS_SANITIZE=ON \
    -DTOWERS_FUZZ=ON -DTOWERS_BENCH=OFF >/dev/null
  [ $# -gt 0 ] || set -- unit_tests towerd fuzz  # what scripts/test.sh --check runs
else
  build="${TOWERS_BUILD_DIR:-$root/build}"
  # shellcheck disable=SC2086  # TOWERS_CMAKE_ARGS is a list of options
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${TOWERS_CMAKE_ARGS:-} >/dev/null
fi
if [ $# -gt 0 ]; then
  cmake --build "$build" -j "$jobs" --target "$@"
else
  cmake --build "$build" -j "$jobs"
fi
