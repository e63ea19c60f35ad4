#!/usr/bin/env bash
# Prefill with int8 attention against exact attention, alternated (issue 26 item 2; docs/numerics.md,
# "int8 prefill attention"): per round, `towerctl bench --onednn` at pp512 (int8), pp4096 with
# --attention int8, int8-scores and exact, and pp512 exact; one markdown row per round with the
# ratios of numbers from that round (this VM's speed drifts by 20% within minutes, so only ratios
# within a round mean anything).
#   bench/attention_ab.sh [BUILD_DIR] [MODEL]        (defaults: build, /tmp/perf-1b-q4_0.gguf)
# Env: ROUNDS (5), THREADS (2), LONG (4096: the long prompt).
set -euo pipefail
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
need_towerctl "${1:-build}"
model="${2:-/tmp/perf-1b-q4_0.gguf}"
[ -f "$model" ] || { echo "no $model (towerctl model synth --shape llama3.2-1b --type q4_0 -o $model)" >&2; exit 1; }
rounds="${ROUNDS:-5}"; threads="${THREADS:-2}"; long="${LONG:-4096}"
pp() { field pp "$(bench_line "$model" "$threads" "$1" 1 1 --onednn --attention "$2")"; }
echo "| round | pp512 int8 | pp$long int8 | pp$long int8 scores | pp$long exact | pp512 exact | pp$long / pp512 (int8) | pp$long / pp512 (exact) | pp$long int8 / exact |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for r in $(seq "$rounds"); do
  echo "round $r of $rounds" >&2
  a=$(pp 512 int8); b=$(pp "$long" int8); c=$(pp "$long" int8-scores); d=$(pp "$long" exact); e=$(pp 512 exact)
  python3 -c "import sys; a,b,c,d,e=map(float,sys.argv[1:]); print(f'| $r | {a:.1f} | {b:.1f} | {c:.1f} | {d:.1f} | {e:.1f} | {b/a:.2f} | {d/e:.2f} | {b/d:.2f}x |')" "$a" "$b" "$c" "$d" "$e"
done
