#!/usr/bin/env bash
# The RAM budget holds, measured from outside (issue 11): towerd with [policy] ram_budget = B serves
# bots whose segment KV is more than 4 B in all, each bot in turn (a session and one short reply, so
# its whole path is leased), and the daemon's resident memory (VmRSS) never grows more than
# 1.1 B + the request tails + a fixed allowance over what it was before the first bot. The allowance
# (6 MiB) covers what is not segment KV and grows with the run: catalog, records, sessions, HTTP
# buffers, allocator slack. The control: the same run with no budget must grow past the same bound,
# or the check measured nothing (KV not resident, or RSS not counting it).
# Model: the synthetic "tiny" shape in f16 (towerctl model synth), so that KV per token is large enough
# for megabytes to be measured and prefill is fast on 2 cores.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
towerd_setup "$1" "$2" "$3"
towerctl="$4"
command -v curl >/dev/null || { echo "SKIP: curl not installed"; exit 77; }
budget=$((12 * 1024 * 1024))
allowance=$((6 * 1024 * 1024))
model="$tmp/tiny-f16.gguf"
"$towerctl" model synth --shape tiny --type f16 -o "$model" --threads 2 >/dev/null

words=(red green blue cat dog sun moon tree)
rss() { awk '/^VmRSS:/ { print $2 * 1024 }' "/proc/$pid/status"; }
pool() { api http://localhost/v1/pool; }

# run BUDGET_TEXT [STOP_ABOVE]: one daemon's run over the bots; sets growth (peak RSS - base), kv, tails (peak), bots.
run() {
  cat >"$tmp/towerd.toml" <<EOF
[policy]
ram_budget = "$1"
[cold]
enabled = false
EOF
  rm -rf "$state"
  start --config "$tmp/towerd.toml"
  api -X PUT http://localhost/v1/segments/plat -d '{"level":"platform","text":"You are a helpful assistant."}' >/dev/null
  local base peak=0 tail_peak=0 i=0 r now t text
  kv=0
  # Before the first bot: the model is loaded and one reply has run (buffers, threads, arenas).
  api http://localhost/v1/sessions -d '{"bot":"plat","id":"warmup"}' >/dev/null
  api http://localhost/v1/sessions/warmup/messages -d '{"content":"hi","max_tokens":1}' >/dev/null
  base="$(rss)"
  # Bots of ~1500 tokens (byte-level vocabulary: a token per byte) until their KV passes 4 budgets.
  while [ "$kv" -lt $((4 * budget + budget / 2)) ]; do
    i=$((i + 1))
    RANDOM=$i; text=""
    for _ in $(seq 300); do text+="${words[RANDOM % 8]} "; done
    r="$(api -X PUT "http://localhost/v1/segments/bot$i" -d "{\"level\":\"bot\",\"parent\":\"plat\",\"text\":\"$text\"}")"
    echo "$r" | json '"error" not in d' | grep -qx True || fail "bot$i: $r"
    kv="$(pool | json 'd["kv_bytes"]')"
  done
  # Each bot in turn: its path is leased (paged in when warm), one token of reply. A run given
  # STOP_ABOVE ends as soon as RSS has grown past it (the control needs no more).
  for j in $(seq 1 "$i"); do
    api http://localhost/v1/sessions -d "{\"bot\":\"bot$j\",\"id\":\"s$j\"}" >/dev/null
    r="$(api "http://localhost/v1/sessions/s$j/messages" -d '{"content":"hi","max_tokens":1,"temperature":0}')"
    case "$r" in *'"finish_reason"'*) ;; *) fail "reply on bot$j: $r";; esac
    now="$(rss)"; [ "$now" -gt "$peak" ] && peak="$now"
    t="$(pool | json 'd["memory"]["tail_bytes"]')"; [ "$t" -gt "$tail_peak" ] && tail_peak="$t"
    [ -n "${2:-}" ] && [ $((peak - base)) -gt "$2" ] && break
  done
  kv="$(pool | json 'd["kv_bytes"]')"
  growth=$((peak - base)); tails=$tail_peak; bots=$i
  stop
}

run 12M
bound=$((budget * 11 / 10 + tails + allowance))
echo "budget $budget: $bots bots, segment KV $kv bytes in all; RSS grew $growth bytes (bound $bound = 1.1 x budget + tails $tails + allowance $allowance)"
[ "$kv" -ge $((4 * budget)) ] || fail "the working set ($kv bytes) is not 4x the budget"
[ "$growth" -le "$bound" ] || fail "RSS grew $growth bytes, over the bound $bound"

# The control: without a budget the same run must grow past the bound, or the check above measured
# nothing (KV not resident, or RSS not counting it).
run 0 "$bound"
echo "no budget: RSS grew $growth bytes"
[ "$growth" -gt "$bound" ] || fail "without a budget RSS grew only $growth bytes: the test cannot see the budget"
echo "ram budget: OK"
