# shellcheck shell=bash
# Helpers the bench scripts source (bench/kernel_table.sh, prefill_table.sh, side_by_side.sh): find the
# tools, write missing synthetic models, run `towerctl bench` and llama.cpp's llama-bench, read and
# compare their numbers. Not run on its own.

# Sets towerctl to BUILD_DIR/cli/towerctl, or stops when it is not built.
need_towerctl() {
  towerctl="$1/cli/towerctl"
  [ -x "$towerctl" ] || { echo "no $towerctl: build first (scripts/build.sh)" >&2; exit 1; }
}
need_llama_bench() { [ -x "$1" ] || { echo "no llama-bench at $1" >&2; exit 1; }; }

# MODEL SHAPE TYPE: writes MODEL with `towerctl model synth` unless it exists.
synth_if_missing() {
  [ -f "$1" ] && return
  echo "writing $1" >&2
  "$towerctl" model synth --shape "$2" --type "$3" -o "$1" >&2
}

# MODEL THREADS PROMPT GEN RUNS [FLAGS...] -> the "bench model=... pp=X tg=Y roofline_tg=Z bw_gbs=W" line.
bench_line() {
  local model="$1" threads="$2" prompt="$3" gen="$4" runs="$5"; shift 5
  "$towerctl" bench --model "$model" --threads "$threads" --prompt "$prompt" --gen "$gen" --runs "$runs" "$@" \
    2>/dev/null | grep '^bench model='
}
# NAME LINE -> the value of NAME=... in LINE.
field() { sed -E "s/.* $1=([^ ]+).*/\1/" <<<"$2"; }

# LLAMA_BENCH MODEL THREADS RUNS ARGS... -> "n_prompt n_gen avg_ts" lines (OMP_WAIT_POLICY from
# LLAMA_OMP_WAIT when set).
llama_rows() {
  local llama_bench="$1" model="$2" threads="$3" runs="$4"; shift 4
  env ${LLAMA_OMP_WAIT:+OMP_WAIT_POLICY=$LLAMA_OMP_WAIT} "$llama_bench" -m "$model" -t "$threads" -r "$runs" \
      -o csv "$@" 2>/dev/null |
    python3 -c 'import csv, sys
for row in csv.DictReader(sys.stdin):
    print(row["n_prompt"], row["n_gen"], row["avg_ts"])'
}

# A B -> "A/Bx" (2 decimals; "-" when B is 0), and A as a whole percentage of B.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "-" }'; }
percent() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f%%", 100 * a / b }'; }
