#!/usr/bin/env bash
# The issue-3 speed table: prefill (pp) and decode (tg) tok/s, roofline and its achieved fraction, for
# Q4_0, Q4_K_M and Q8_0 synthetic Llama-3.2-1B models at 1 and 2 threads, one `towerctl bench` per cell.
#   bench/kernel_table.sh [BUILD_DIR] [MODEL_DIR]      (defaults: build, /tmp)
# Env: PROMPT (512), GEN (128), RUNS (5), TYPES ("q4_0 q4_k_m q8_0"), THREADS ("1 2").
# Models missing from MODEL_DIR are written first with `towerctl model synth` (random weights, ~0.8-1.3 GB
# each). Run it on an otherwise idle machine: every number is a ratio of this machine's own bandwidth.
set -euo pipefail
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
need_towerctl "${1:-build}"; models="${2:-/tmp}"
prompt="${PROMPT:-512}"; gen="${GEN:-128}"; runs="${RUNS:-5}"
echo "| type | threads | pp tok/s | tg tok/s | roofline tg | tg / roofline | bandwidth GB/s |"
echo "|---|---|---|---|---|---|---|"
for type in ${TYPES:-q4_0 q4_k_m q8_0}; do
  model="$models/perf-1b-$type.gguf"
  synth_if_missing "$model" llama3.2-1b "$type"
  for t in ${THREADS:-1 2}; do
    line="$(bench_line "$model" "$t" "$prompt" "$gen" "$runs")"
    pp="$(field pp "$line")"; tg="$(field tg "$line")"; roof="$(field roofline_tg "$line")"; bw="$(field bw_gbs "$line")"
    frac="$(percent "$tg" "$roof")"
    echo "| $type | $t | $pp | $tg | $roof | $frac | $bw |"
  done
done
