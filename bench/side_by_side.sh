#!/usr/bin/env bash
# Issue 22's side-by-side lines: prefill (pp) and decode (tg) tok/s of `towerctl bench` beside
# llama.cpp's llama-bench on the same synthetic GGUF, one line per model shape and weight type.
#   bench/side_by_side.sh LLAMA_BENCH [BUILD_DIR] [MODEL_DIR]      (defaults: build, /tmp)
# LLAMA_BENCH: a llama-bench you built (bench/README.md, "Tools": fetch llama.cpp, never commit it).
# Env: MODELS ("SHAPE:TYPE ...", default the 1B Llama shape in each type issue 22 added, and gemma2-2b),
# PROMPT (128), GEN (32), RUNS (3), THREADS (2), LLAMA_OMP_WAIT (unset: llama.cpp's own OpenMP default;
# "passive" when other work shares the cores).
# Models missing from MODEL_DIR are written first with `towerctl model synth` (side-SHAPE-TYPE.gguf).
# Run it on an otherwise idle machine: ours and llama.cpp alternate per model, so each ratio is of two
# numbers minutes apart. Prints a markdown table; progress on stderr.
set -euo pipefail
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
llama_bench="${1:?usage: bench/side_by_side.sh LLAMA_BENCH [BUILD_DIR] [MODEL_DIR]}"
need_towerctl "${2:-build}"; need_llama_bench "$llama_bench"; models="${3:-/tmp}"
prompt="${PROMPT:-128}"; gen="${GEN:-32}"; runs="${RUNS:-3}"; threads="${THREADS:-2}"
default_models="llama3.2-1b:q2_k llama3.2-1b:q3_k_m llama3.2-1b:q5_1 llama3.2-1b:iq4_nl llama3.2-1b:iq4_xs gemma2-2b:q4_0"

echo "| model | type | pp$prompt ours | pp$prompt llama.cpp | pp ratio | tg$gen ours | tg$gen llama.cpp | tg ratio | tg / roofline |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
for spec in ${MODELS:-$default_models}; do
  shape="${spec%%:*}"; type="${spec##*:}"
  model="$models/side-$shape-$type.gguf"
  synth_if_missing "$model" "$shape" "$type"
  echo "$shape $type: ours" >&2
  line="$(bench_line "$model" "$threads" "$prompt" "$gen" "$runs")"
  pp="$(field pp "$line")"; tg="$(field tg "$line")"; roof="$(field roofline_tg "$line")"
  echo "$shape $type: llama.cpp" >&2
  l="$(llama_rows "$llama_bench" "$model" "$threads" "$runs" -p "$prompt" -n "$gen")" || l=""
  l_pp="$(awk -v p="$prompt" '$1 == p && $2 == 0 { print $3 }' <<<"$l")"; l_pp="${l_pp:-0}"
  l_tg="$(awk -v g="$gen" '$1 == 0 && $2 == g { print $3 }' <<<"$l")"; l_tg="${l_tg:-0}"
  printf '| %s | %s | %.1f | %.1f | %s | %.1f | %.1f | %s | %s |\n' "$shape" "$type" "$pp" "$l_pp" "$(ratio "$pp" "$l_pp")" \
    "$tg" "$l_tg" "$(ratio "$tg" "$l_tg")" "$(percent "$tg" "$roof")"
done
