#!/usr/bin/env bash
# Cross-compiles Towers for 64-bit ARM (aarch64) into build-arm64/ (or $TOWERS_ARM64_BUILD_DIR) with
# Debian's g++-aarch64-linux-gnu and the :arm64 libraries (scripts/install-deps.sh --arm64;
# cmake/aarch64-linux-gnu.cmake). CTest and doctest's test discovery run the binaries under
# qemu-aarch64, so the tests run on an x86-64 machine too. No benchmarks.
#   scripts/build-arm64.sh                    everything else: libraries, towerd, towerctl, tests
#   scripts/build-arm64.sh test_codec ...     only these targets (scripts/test-arm64.sh)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
export TOWERS_BUILD_DIR="${TOWERS_ARM64_BUILD_DIR:-$root/build-arm64}"
export TOWERS_CMAKE_ARGS="-DCMAKE_TOOLCHAIN_FILE=$root/cmake/aarch64-linux-gnu.cmake -DTOWERS_BENCH=OFF"
exec "$root/scripts/build.sh" "$@"
