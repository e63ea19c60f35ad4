#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine: install what building, the tests, fuzzing,
# benchmarks and packaging need (install-deps.sh --dev), then its legs:
#   release  build everything (RelWithDebInfo, gcc) into build/ and run every test;
#   arm64    cross-compile the libraries and a subset of the unit tests for aarch64 and run them under
#            qemu (scripts/test-arm64.sh; README.md "ARM64"; ~3 min on two idle cores);
#   check    the checking build (clang, Debug so assert() and the debug-only checks are compiled in:
#            Mutex::assert_held, the segment pool's invariant after every change, the catalog's
#            no-wait lock) with ASan and UBSan halting on the first finding, in build-check/, without
#            benchmarks: it runs the unit tests and the kill -9 checks (daemon/kill9,
#            daemon/long_session_kill9), then every libFuzzer target for TOWERS_FUZZ_SECONDS (default
#            60) each, two at a time (tests/fuzz/run.sh).
#   scripts/test.sh              the legs CI runs (.ci/run): TOWERS_TEST_LEGS, default "release arm64 check"
#   scripts/test.sh --release    only the release leg (likewise --arm64, --check)
# Time of the check leg (2026-11-26, this repo's 2-core machine, clean build-check/): the build ~1400
# CPU-seconds (~12 min on two idle cores; simd/ is left uninstrumented and Highway compiles only its
# AVX2 and baseline targets there), the unit and kill -9 tests 403 s, the fuzzing 11 targets x 60 s two
# at a time (~6 min): ~25 min, beside the release and arm64 legs' ~29 min.
# Tests that need ../shared (models, reference outputs, tokenizer vectors) skip with a message when it
# is absent; point TOWERS_SHARED at it when it lives elsewhere. TOWERS_BUILD_DIR and
# TOWERS_CHECK_BUILD_DIR move the build directories.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
read -r -a legs <<< "${TOWERS_TEST_LEGS:-release arm64 check}"
case "${1:-}" in
  "") ;;
  --release) legs=(release) ;;
  --arm64) legs=(arm64) ;;
  --check) legs=(check) ;;
  -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
  *) echo "test.sh: unknown option '$1' (--release, --arm64, --check)" >&2; exit 2 ;;
esac
jobs="$(nproc 2>/dev/null || echo 2)"
"$root/scripts/install-deps.sh" --dev

release_leg() {
  "$root/scripts/build.sh"
  (cd "${TOWERS_BUILD_DIR:-$root/build}" && ctest --output-on-failure -j "$jobs")
}

arm64_leg() {
  "$root/scripts/test-arm64.sh"
}

check_leg() {
  local build="${TOWERS_CHECK_BUILD_DIR:-$root/build-check}"
  "$root/scripts/build.sh" --check
  # Leaks are findings too; UBSan's reports stop the process (it is also built not to recover).
  ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}" UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}" \
    ctest --test-dir "$build" --output-on-failure -j "$jobs" -R '^(test_[a-z0-9_]+/|daemon/(kill9|long_session_kill9)$)'
  "$root/tests/fuzz/run.sh" "$build" "${TOWERS_FUZZ_SECONDS:-60}"
}

for leg in "${legs[@]}"; do
  echo "=== test.sh: the $leg leg"
  "${leg}_leg"
done
