#!/usr/bin/env bash
# Issue 26's table: prefill (pp512, pp4096) and decode (tg128) tok/s of towerd's kernels — the fast
# ones, and prefill through oneDNN (`towerctl bench --onednn`, as `[model] onednn_prefill = true`) —
# beside llama.cpp's llama-bench on the same GGUF files, one machine, one run of this script.
#   bench/prefill_table.sh LLAMA_BENCH [BUILD_DIR] [MODEL_DIR]      (defaults: build, /tmp)
# LLAMA_BENCH: a llama-bench you built (bench/README.md, "Tools": fetch llama.cpp, never commit it).
# Env: MODELS ("1b:q4_0 1b:q4_k_m 1b:q8_0 8b:q4_k_m"), RUNS (3; pp512/tg128), LONG_RUNS (1; pp4096), THREADS (2),
# LLAMA_OMP_WAIT (unset: llama.cpp's own OpenMP default, the fair setting on an idle machine; "passive"
# keeps its threads from spinning when other work shares the cores).
# Models missing from MODEL_DIR are written first with `towerctl model synth` (perf-1b-TYPE.gguf,
# perf-8b-TYPE.gguf; 0.8-4.9 GB each). Run it on an otherwise idle machine; every ratio is of two
# numbers from this run. Prints a markdown table; progress on stderr.
set -euo pipefail
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
llama_bench="${1:?usage: bench/prefill_table.sh LLAMA_BENCH [BUILD_DIR] [MODEL_DIR]}"
need_towerctl "${2:-build}"; need_llama_bench "$llama_bench"; models="${3:-/tmp}"
runs="${RUNS:-3}"; long_runs="${LONG_RUNS:-1}"; threads="${THREADS:-2}"
ours() { bench_line "$1" "$threads" "$2" "$3" "$4" "${@:5}"; }  # MODEL PROMPT GEN RUNS [--onednn]
llama() { local model="$1" r="$2"; shift 2; llama_rows "$llama_bench" "$model" "$threads" "$r" "$@"; }

echo "| model | pp512 fast | pp512 oneDNN | pp512 llama.cpp | pp4096 fast | pp4096 oneDNN | pp4096 llama.cpp | tg128 | tg128 llama.cpp | roofline tg | oneDNN pp512 / llama.cpp | pp4096 / pp512 (oneDNN) | tg / roofline |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for spec in ${MODELS:-1b:q4_0 1b:q4_k_m 1b:q8_0 8b:q4_k_m}; do
  size="${spec%%:*}"; type="${spec##*:}"
  shape=llama3.2-1b; [ "$size" = 8b ] && shape=llama3.1-8b
  model="$models/perf-$size-$type.gguf"
  synth_if_missing "$model" "$shape" "$type"
  echo "$size $type: ours, fast kernels" >&2
  line="$(ours "$model" 512 128 "$runs")"
  pp="$(field pp "$line")"; tg="$(field tg "$line")"; roof="$(field roofline_tg "$line")"
  pp_long="$(field pp "$(ours "$model" 4096 1 "$long_runs")")"
  echo "$size $type: ours, oneDNN prefill" >&2
  pp_dnn="$(field pp "$(ours "$model" 512 1 "$runs" --onednn)")"
  pp_dnn_long="$(field pp "$(ours "$model" 4096 1 "$long_runs" --onednn)")"
  echo "$size $type: llama.cpp" >&2
  l_short="$(llama "$model" "$runs" -p 512 -n 128)"
  l_long="$(llama "$model" "$long_runs" -p 4096 -n 0)"
  l_pp="$(awk '$1 == 512 && $2 == 0 { print $3 }' <<<"$l_short")"
  l_tg="$(awk '$1 == 0 && $2 == 128 { print $3 }' <<<"$l_short")"
  l_pp_long="$(awk '$1 == 4096 { print $3 }' <<<"$l_long")"
  printf '| %s %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %s | %s | %s |\n' \
    "$size" "$type" "$pp" "$pp_dnn" "$l_pp" "$pp_long" "$pp_dnn_long" "$l_pp_long" "$tg" "$l_tg" "$roof" \
    "$(ratio "$pp_dnn" "$l_pp")" "$(ratio "$pp_dnn_long" "$pp_dnn")" \
    "$(percent "$tg" "$roof")"
done
