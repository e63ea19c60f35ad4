#!/usr/bin/env bash
# Runs libFuzzer targets, two at a time, each for SECONDS from its committed seed corpus.
#   tests/fuzz/run.sh BUILD_DIR SECONDS [TARGET...]    (no TARGET: every target in tests/fuzz/corpus/
#                                                      and every target that writes its own seeds)
# BUILD_DIR was configured with -DTOWERS_FUZZ=ON (scripts/test.sh --check, bench/fuzz.sh build it).
# New inputs go to BUILD_DIR/fuzz/corpus/<target>/ (kept between runs), the seeds in
# tests/fuzz/corpus/<target>/ are only read. A finding (crash, sanitizer report, leak, timeout, a
# target's own check) fails the run: the input is saved as BUILD_DIR/fuzz/findings/<target>-*, and
# `BUILD_DIR/tests/fuzz/<target> FILE` replays it. Exit status: the number of targets that failed.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="$(cd "$1" && pwd)"; seconds="$2"; shift 2
targets=("$@")
# Targets whose seeds are made by code and not committed: GGUF files stay out of git (tests build
# their models in code), so gguf_fuzz writes its seeds (`--write-seeds=DIR`) before each run.
seeded_by_code=(gguf_fuzz)
if [ ${#targets[@]} -eq 0 ]; then
  for d in "$here"/corpus/*/; do targets+=("$(basename "$d")"); done
  targets+=("${seeded_by_code[@]}")
fi
mkdir -p "$build/fuzz/findings" "$build/fuzz/logs"
export TMPDIR="${TMPDIR:-/tmp}"
# Leaks count as findings; UBSan stops at the first report (the targets are built that way too).
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

run_one() {
  local t="$1" exe="$build/tests/fuzz/$1"
  [ -x "$exe" ] || { echo "fuzz $t: $exe not built"; return 1; }
  mkdir -p "$build/fuzz/corpus/$t"
  local seeds=()
  if [[ " ${seeded_by_code[*]} " == *" $t "* ]]; then
    "$exe" --write-seeds="$build/fuzz/corpus/$t" >/dev/null || { echo "fuzz $t: could not write its seeds"; return 1; }
  else
    seeds=("$here/corpus/$t")
  fi
  # -max_len: inputs of the size the parsers meet in practice (requests, headers, records, schemas);
  # -timeout: one input taking this long (wall time) is a finding (a hang); -rss_limit_mb: so is this
  # much memory. TOWERS_FUZZ_TIMEOUT raises the timeout where the fuzzers run beside other work at a
  # low priority (bench/fuzz.sh under nice): api_fuzz's slowest input takes ~0.8 s of CPU, and at
  # nice 19 beside two busy builds one took 36 s of wall time.
  if "$exe" -max_total_time="$seconds" -max_len=16384 -timeout="${TOWERS_FUZZ_TIMEOUT:-30}" -rss_limit_mb=3072 -print_final_stats=1 \
        -artifact_prefix="$build/fuzz/findings/$t-" "$build/fuzz/corpus/$t" "${seeds[@]}" \
        >"$build/fuzz/logs/$t.log" 2>&1; then
    echo "fuzz $t: ${seconds} s, $(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$build/fuzz/logs/$t.log" |
                                    grep -o '[0-9]*$') inputs, no finding"
  else
    echo "fuzz $t: FINDING (log: $build/fuzz/logs/$t.log)"
    grep -E 'ERROR|runtime error|SUMMARY|_fuzz: |Test unit written' "$build/fuzz/logs/$t.log" | head -20
    return 1
  fi
}

failed=0
pids=()
names=()
for t in "${targets[@]}"; do
  run_one "$t" & pids+=($!); names+=("$t")
  if [ ${#pids[@]} -ge 2 ]; then
    wait "${pids[0]}" || failed=$((failed + 1))
    pids=("${pids[@]:1}"); names=("${names[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || failed=$((failed + 1)); done
exit "$failed"
