#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine: install what building, the tests, fuzzing,
# benchmarks and packaging need (install-deps.sh --dev), build everything, run every test.
# Tests that need ../shared (models, reference outputs, tokenizer vectors) skip with a message when it
# is absent; point TOWERS_SHARED at it when it lives elsewhere.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/install-deps.sh" --dev
# The ARM64 leg: a cross build for aarch64 and a subset of the unit tests under qemu (README.md, "ARM64").
"$root/scripts/test-arm64.sh"
"$root/scripts/build.sh"
build="${TOWERS_BUILD_DIR:-$root/build}"
cd "$build"
ctest --output-on-failure -j "$(nproc 2>/dev/null || echo 2)"
