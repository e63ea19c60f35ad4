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
llama_bench="${1:?usage: bench/side_by_side.sh LLAMA_BENCH [BUILD_DIR] [MODEL_DIR]}"
build="${2:-build}"; models="${3:-/tmp}"
towerctl="$build/cli/towerctl"
[ -x "$towerctl" ] || { echo "no $towerctl: build first (scripts/build.sh)" >&2; exit 1; }
[ -x "$llama_bench" ] || { echo "no llama-bench at $llama_bench" >&2; exit 1; }
prompt="${PROMPT:-128}"; gen="${GEN:-32}"; runs="${RUNS:-3}"; threads="${THREADS:-2}"
default_models="llama3.2-1b:q2_k llama3.2-1b:q3_k_m llama3.2-1b:q5_1 llama3.2-1b:iq4_nl llama3.2-1b:iq4_xs gemma2-2b:q4_0"

field() { sed -E "s/.* $1=([^ ]+).*/\1/" <<<"$2"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "-" }'; }

echo "| model | type | pp$prompt ours | pp$prompt llama.cpp | pp ratio | tg$gen ours | tg$gen llama.cpp | tg ratio | tg / roofline |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
for spec in ${MODELS:-$default_models}; do
  shape="${spec%%:*}"; type="${spec##*:}"
  model="$models/side-$shape-$type.gguf"
  if [ ! -f "$model" ]; then
    echo "writing $model" >&2
    "$towerctl" model synth --shape "$shape" --type "$type" -o "$model" >&2
  fi
  echo "$shape $type: ours" >&2
  line="$("$towerctl" bench --model "$model" --threads "$threads" --prompt "$prompt" --gen "$gen" --runs "$runs" 2>/dev/null |
          grep '^bench model=')"
  pp="$(field pp "$line")"; tg="$(field tg "$line")"; roof="$(field roofline_tg "$line")"
  echo "$shape $type: llama.cpp" >&2
  l="$(env ${LLAMA_OMP_WAIT:+OMP_WAIT_POLICY=$LLAMA_OMP_WAIT} "$llama_bench" -m "$model" -t "$threads" -r "$runs" \
         -p "$prompt" -n "$gen" -o csv 2>/dev/null |
       python3 -c 'import csv, sys
for row in csv.DictReader(sys.stdin):
    print(row["n_prompt"], row["n_gen"], row["avg_ts"])')" || l=""
  l_pp="$(awk -v p="$prompt" '$1 == p && $2 == 0 { print $3 }' <<<"$l")"; l_pp="${l_pp:-0}"
  l_tg="$(awk -v g="$gen" '$1 == 0 && $2 == g { print $3 }' <<<"$l")"; l_tg="${l_tg:-0}"
  printf '| %s | %s | %.1f | %.1f | %s | %.1f | %.1f | %s | %s |\n' "$shape" "$type" "$pp" "$l_pp" "$(ratio "$pp" "$l_pp")" \
    "$tg" "$l_tg" "$(ratio "$tg" "$l_tg")" "$(awk -v a="$tg" -v b="$roof" 'BEGIN { printf "%.0f%%", 100 * a / b }')"
done
