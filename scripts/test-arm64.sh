#!/usr/bin/env bash
# The ARM64 leg of the test suite (scripts/test.sh runs it; README.md, "ARM64"): cross-compiles the
# libraries and the unit tests below for aarch64 (scripts/build-arm64.sh) and runs them under
# qemu-aarch64. A subset, to fit CI's time: the f32 and attention kernels and the quantized matmuls
# (on every Highway ARM target qemu's CPU offers: NEON, SVE, SVE2; NEON's packed kernels with and
# without sdot) and the codec's golden file written on x86-64, which ARM64 must reproduce bit for
# bit (tests/test_codec_portable.cc).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/install-deps.sh" --arm64
TESTS=(test_ops test_ggml_blocks test_attention test_int8_attention test_codec_portable test_quant_dot)
"$root/scripts/build-arm64.sh" "${TESTS[@]}"
regex="^($(IFS='|'; echo "${TESTS[*]}"))/"
ctest --test-dir "${TOWERS_ARM64_BUILD_DIR:-$root/build-arm64}" -R "$regex" --output-on-failure \
  -j "$(nproc 2>/dev/null || echo 2)"
