#!/usr/bin/env bash
# Every libFuzzer target for an hour (or FUZZ_SECONDS), two at a time, from the committed seeds plus
# what earlier runs found (build-check/fuzz/corpus/): the long run behind the 60 s of each target in
# scripts/test.sh. Builds the checking build first (scripts/build.sh --check fuzz). A finding's input
# is saved under build-check/fuzz/findings/ (tests/fuzz/README.md: replaying one, the findings so far).
#   bench/fuzz.sh [TARGET...]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/build.sh" --check fuzz
exec "$root/tests/fuzz/run.sh" "${TOWERS_CHECK_BUILD_DIR:-$root/build-check}" "${FUZZ_SECONDS:-3600}" "$@"
