#!/usr/bin/env bash
# towerctl chat as a client, against tests/cli/fake_towerd.py (no model needed): with no --session or
# --bot it is a plain chat over POST /v1/chat/completions whose history towerctl keeps and resends;
# in the interactive loop Ctrl-C (SIGINT) stops the reply being streamed — the connection is closed,
# the part shown stays in the history — and the next line is a new message; Ctrl-C at the prompt ends
# the program; daemon errors and a missing daemon are one line on stderr and exit status 1.
set -euo pipefail
towerctl="$1"; tmp="${2:-/tmp}/check_chat_client.$$"
command -v python3 >/dev/null || { echo "SKIP: python3 not found"; exit 77; }
mkdir -p "$tmp"; server=""; chat=""
cleanup() {
  local rc=$?
  exec 3>&-
  [ -n "$chat" ] && kill "$chat" 2>/dev/null
  [ -n "$server" ] && kill "$server" 2>/dev/null && { wait "$server" 2>/dev/null || true; }
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in out err log; do [ -f "$tmp/$f" ] && { echo "--- $f:"; cat "$tmp/$f"; }; done; exit 1; }
# until_true SECONDS CMD...: polls CMD (bounded) until it succeeds.
until_true() {
  local limit=$(( $1 * 20 )); shift
  for _ in $(seq "$limit"); do "$@" && return 0; sleep 0.05; done
  return 1
}
sock="$tmp/fake.sock"
python3 "$(dirname "$0")/fake_towerd.py" "$sock" "$tmp/log" & server=$!
until_true 10 test -S "$sock" || fail "the fake towerd did not start"
export TOWERD_SOCKET="$sock"
# The messages array of the Nth chat request in the log (1-based).
messages() { python3 -c 'import json,sys
reqs=[json.loads(l) for l in open(sys.argv[1]) if "\"/v1/chat/completions\"" in l]
b=reqs[int(sys.argv[2])-1]["body"]; assert b["stream"] is True, b
print(json.dumps(b["messages"]))' "$tmp/log" "$1"; }

# One message, plain chat: the reply on stdout, a body with one user message.
out="$("$towerctl" chat --message "hello" 2>"$tmp/err")" || fail "chat --message exited $?"
[ "$out" = "echo: hello" ] || fail "reply: '$out'"
[ "$(messages 1)" = '[{"content": "hello", "role": "user"}]' ] || fail "first request: $(messages 1)"
out="$("$towerctl" chat --system "Be brief." -m "hi" 2>/dev/null)"
[ "$(messages 2)" = '[{"content": "Be brief.", "role": "system"}, {"content": "hi", "role": "user"}]' ] \
  || fail "--system: $(messages 2)"

# Interactive, with Ctrl-C in the middle of a reply. stdin is a FIFO the test writes lines to; SIGINT
# gets its default disposition back (a background job of a script starts with it ignored).
mkfifo "$tmp/in"
env --default-signal=INT "$towerctl" chat <"$tmp/in" >"$tmp/out" 2>"$tmp/err" & chat=$!
exec 3>"$tmp/in"
echo "first" >&3
until_true 10 grep -q "echo: first" "$tmp/out" || fail "no reply to the first line"
echo "long" >&3
until_true 10 grep -q "partial" "$tmp/out" || fail "the long reply did not start"
kill -INT "$chat"
until_true 10 grep -q '"client closed"' "$tmp/log" || fail "Ctrl-C did not close the reply's connection"
kill -0 "$chat" 2>/dev/null || fail "Ctrl-C during a reply ended towerctl"
echo "second" >&3
until_true 10 grep -q "echo: second" "$tmp/out" || fail "no reply after Ctrl-C"
exec 3>&-   # Ctrl-D
rc=0; wait "$chat" || rc=$?; chat=""
[ "$rc" = 0 ] || fail "towerctl chat exited $rc at the end of its input"
[ "$(cat "$tmp/out")" = "$(printf 'echo: first\npartial\necho: second')" ] || fail "stdout: $(cat "$tmp/out")"
grep -q "\[stopped\]" "$tmp/err" || fail "no [stopped] note on stderr"
want='[{"content": "first", "role": "user"}, {"content": "echo: first", "role": "assistant"}, '
want+='{"content": "long", "role": "user"}, {"content": "partial", "role": "assistant"}, '
want+='{"content": "second", "role": "user"}]'
[ "$(messages 5)" = "$want" ] || fail "history after Ctrl-C: $(messages 5)"

# Ctrl-C at the prompt ends towerctl (killed by SIGINT: 130).
env --default-signal=INT "$towerctl" chat <"$tmp/in" >"$tmp/out" 2>"$tmp/err" & chat=$!
exec 3>"$tmp/in"
last_request_is_healthz() { tail -1 "$tmp/log" | grep -q '"/healthz"'; }
until_true 10 last_request_is_healthz || fail "towerctl chat did not check towerd first"
kill -INT "$chat"
rc=0; wait "$chat" || rc=$?; chat=""
exec 3>&-
[ "$rc" = 130 ] || fail "Ctrl-C at the prompt: exit status $rc, want 130"

# Errors: one line on stderr, exit status 1.
rc=0; "$towerctl" chat -m "fail" >/dev/null 2>"$tmp/err" || rc=$?
[ "$rc" = 1 ] && [ "$(cat "$tmp/err")" = "towerctl: the fake refuses this (HTTP 400)" ] || fail "daemon error: $rc $(cat "$tmp/err")"
rc=0; "$towerctl" chat -m "hi" --socket "$tmp/none.sock" >/dev/null 2>"$tmp/err" || rc=$?
[ "$rc" = 1 ] && [ "$(wc -l <"$tmp/err")" = 1 ] && grep -q "is towerd running" "$tmp/err" || fail "no daemon: $rc $(cat "$tmp/err")"
echo "ok"
