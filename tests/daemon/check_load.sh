#!/usr/bin/env bash
# The short load test (issue 12): bench/load with 50 streaming clients on stories260K, 5 bots, 3 turns
# each. Fails on any error (a refusal with Retry-After is not one), on a missing or ill-formed last line, on a turn that was
# neither completed nor rejected, and when towerd's RSS after the run is more than 64 MiB above what it
# was before the clients (150 sessions of ~150 tokens of KV at 640 B per token are ~15 MB; the rest of
# the bound is allocator and buffer slack; a leak of a tail or a connection per turn passes it).
# Then 200 clients against a queue of 16 (and the default 64 connections per uid): every turn completes
# or is refused with Retry-After (429 queue full, 503 connection limit), and nothing else.
set -euo pipefail
towerd="$1"; shared="${TOWERS_SHARED:-$2}"; tmp_root="$3"; src="$(cd "$(dirname "$0")/../.." && pwd)"
model="$shared/models/stories260K.gguf"
[ -f "$model" ] || { echo "SKIP: $model not found (set TOWERS_SHARED)"; exit 77; }
command -v python3 >/dev/null || { echo "SKIP: python3 not installed"; exit 77; }
mkdir -p "$tmp_root"
fail() { echo "FAIL: $*"; exit 1; }

# check_line OUTPUT CLIENTS TURNS ALLOW_REJECTED
check_line() {
  local last; last="$(tail -1 <<<"$1")"
  [[ "$last" =~ ^load\ clients=([0-9]+)\ completed=([0-9]+)\ rejected=([0-9]+)\ errors=([0-9]+)\ ttft_p50_ms=[0-9.]+\ ttft_p99_ms=[0-9.]+\ itl_p99_ms=[0-9.]+\ agg_tps=[0-9.]+$ ]] ||
    fail "last line is not the load line: $last"
  local clients="${BASH_REMATCH[1]}" completed="${BASH_REMATCH[2]}" rejected="${BASH_REMATCH[3]}" errors="${BASH_REMATCH[4]}"
  [ "$clients" = "$2" ] || fail "clients=$clients, asked for $2"
  [ "$errors" = 0 ] || fail "$errors errors"
  [ "$4" = yes ] || [ "$rejected" = 0 ] || fail "$rejected turns rejected with a queue that has room for all"
  [ "$4" = no ] || [ "$rejected" -gt 0 ] || fail "no refusal for $2 clients against a queue of 16: the refusal path was not tried"
  # A client whose session was refused runs no turns; every other turn completed or was refused.
  [ "$completed" -gt 0 ] || fail "no turn completed"
  [ $((completed + rejected)) -le $(($2 * $3)) ] || fail "more turns counted than asked"
  [ "$4" = yes ] || [ "$completed" = $(($2 * $3)) ] || fail "only $completed of $(($2 * $3)) turns completed"
}

out="$(TMPDIR="$tmp_root" python3 "$src/bench/load" --towerd "$towerd" --model "$model" -C 50 -K 5 -M 3 \
  --max-tokens 24 --max-seconds 240 --max-rss-growth $((64 * 1024 * 1024)))" || { echo "$out"; fail "bench/load failed"; }
echo "$out"
check_line "$out" 50 3 no

out="$(TMPDIR="$tmp_root" python3 "$src/bench/load" --towerd "$towerd" --model "$model" -C 200 -K 5 -M 2 \
  --max-tokens 16 --max-seconds 240 --config '[limits]\nqueue_length = 16')" || { echo "$out"; fail "bench/load (200 clients) failed"; }
echo "$out"
check_line "$out" 200 2 yes
echo "load: OK"
