#!/usr/bin/env bash
# kill -9 restart loop (issue 11): tests/daemon/kill9.py kills towerd at random moments during segment
# PUTs and chats, TOWERS_KILL9_ROUNDS times (default 20), restarts it, checks that every acknowledged
# segment and message is back and nothing else was invented, and at the end that every reply equals a
# daemon's that never died. TOWERS_KILL9_SEED replays a run (the seed is printed first).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
towerd_setup "$1" "$2" "$3"
command -v python3 >/dev/null || { echo "SKIP: python3 not installed"; exit 77; }
args=(--rounds "${TOWERS_KILL9_ROUNDS:-20}")
[ -n "${TOWERS_KILL9_SEED:-}" ] && args+=(--seed "$TOWERS_KILL9_SEED")
python3 "$(dirname "$0")/kill9.py" "$towerd" "$model" "$tmp" "${args[@]}" || {
  rc=$?; echo "--- the killed daemon's log (end):"; tail -30 "$tmp/killed/towerd.log" 2>/dev/null || true; exit "$rc"; }
# The same with a client compressing all the time (--cold): kills land while segments freeze, sessions
# go to rest (their text leaves the log) and wake again (TOWERS_KILL9_COLD_ROUNDS, default 8).
cold_args=(--rounds "${TOWERS_KILL9_COLD_ROUNDS:-8}" --cold)
[ -n "${TOWERS_KILL9_SEED:-}" ] && cold_args+=(--seed "$TOWERS_KILL9_SEED")
mkdir -p "$tmp/cold"
python3 "$(dirname "$0")/kill9.py" "$towerd" "$model" "$tmp/cold" "${cold_args[@]}" || {
  rc=$?; echo "--- the killed daemon's log (end):"; tail -30 "$tmp/cold/killed/towerd.log" 2>/dev/null || true; exit "$rc"; }
woken=$(grep -c 'woken from rest' "$tmp/cold/killed/towerd.log" || true)
echo "kill9 --cold: $woken session wake(s) from rest in the killed daemon's log"
[ "$woken" -ge 1 ] || fail "no session went to rest and woke during the --cold run"
