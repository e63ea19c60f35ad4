#!/usr/bin/env bash
# Acceptance: `towerctl bench` on a tiny synthetic model prints its report and the exact last line, for
# one sequence, a batch of sequences (decode steps of B tokens) and a long-context segment; bad
# options are refused with a message, not a crash. Speeds are not checked here (bench/README.md).
set -euo pipefail
towerctl="$1"; work="$3"
mkdir -p "$work"; file="$(mktemp "$work/bench-tiny-XXXXXX.gguf")"; err="$(mktemp "$work/bench-err-XXXXXX")"
trap 'rm -f "$file" "$err"' EXIT
TOWERS_SHARED=/nonexistent "$towerctl" model synth --shape tiny --type q4_0 -o "$file" 2>/dev/null
line='^bench model=[^ ]+ type=[A-Z0-9_]+ threads=2 pp=[0-9.]+ tg=[0-9.]+ roofline_tg=[0-9.]+ bw_gbs=[0-9.]+$'
for batch in 1 3; do
  out="$("$towerctl" bench -m "$file" -t 2 --prompt 8 --gen 4 --runs 2 --batch "$batch" 2>/dev/null)"
  echo "$out"
  tail -n 1 <<<"$out" | grep -Eq "$line"
  grep -q "memory bandwidth" <<<"$out"
done
out="$("$towerctl" bench -m "$file" -t 2 --prompt 8 --gen 4 --runs 1 --context 40 --context-format q8 2>/dev/null)"
echo "$out"
grep -Eq '^bench_context model=[^ ]+ threads=2 context=40 format=q8 pp=[0-9.]+ tg=[0-9.]+ tg_short=[0-9.]+ attn_share=[0-9.]+$' <<<"$out"
tail -n 1 <<<"$out" | grep -Eq "$line"
# Refusals: a batch out of range, a missing model.
if "$towerctl" bench -m "$file" --batch 0 >/dev/null 2>"$err"; then exit 1; fi
grep -q "batch" "$err"
if "$towerctl" bench -m "$work/does-not-exist.gguf" >/dev/null 2>"$err"; then exit 1; fi
grep -qi "does-not-exist" "$err"
echo "bench checks passed"
