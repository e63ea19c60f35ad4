#!/usr/bin/env bash
# The issue-3 speed table: prefill (pp) and decode (tg) tok/s, roofline and its achieved fraction, for
# Q4_0, Q4_K_M and Q8_0 synthetic Llama-3.2-1B models at 1 and 2 threads, one `towerctl bench` per cell.
#   bench/kernel_table.sh [BUILD_DIR] [MODEL_DIR]      (defaults: build, /tmp)
# Env: PROMPT (512), GEN (128), RUNS (5), TYPES ("q4_0 q4_k_m q8_0"), THREADS ("1 2").
# Models missing from MODEL_DIR are written first with `towerctl model synth` (random weights, ~0.8-1.3 GB
# each). Run it on an otherwise idle machine: every number is a ratio of this machine's own bandwidth.
set -euo pipefail
build="${1:-build}"; models="${2:-/tmp}"
towerctl="$build/cli/towerctl"
[ -x "$towerctl" ] || { echo "no $towerctl: build first (scripts/build.sh)" >&2; exit 1; }
prompt="${PROMPT:-512}"; gen="${GEN:-128}"; runs="${RUNS:-5}"
echo "| type | threads | pp tok/s | tg tok/s | roofline tg | tg / roofline | bandwidth GB/s |"
echo "|---|---|---|---|---|---|---|"
for type in ${TYPES:-q4_0 q4_k_m q8_0}; do
  model="$models/perf-1b-$type.gguf"
  if [ ! -f "$model" ]; then
    echo "writing $model" >&2
    "$towerctl" model synth --shape llama3.2-1b --type "$type" -o "$model" >&2
  fi
  for t in ${THREADS:-1 2}; do
    line="$("$towerctl" bench --model "$model" --threads "$t" --prompt "$prompt" --gen "$gen" --runs "$runs" 2>/dev/null |
            grep '^bench model=')"
    # bench model=NAME type=TYPE threads=T pp=X tg=Y roofline_tg=Z bw_gbs=W
    field() { sed -E "s/.* $1=([^ ]+).*/\1/" <<<"$line"; }
    pp="$(field pp)"; tg="$(field tg)"; roof="$(field roofline_tg)"; bw="$(field bw_gbs)"
    frac="$(awk -v a="$tg" -v b="$roof" 'BEGIN { printf "%.0f%%", 100 * a / b }')"
    echo "| $type | $t | $pp | $tg | $roof | $frac | $bw |"
  done
done
