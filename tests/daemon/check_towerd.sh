#!/usr/bin/env bash
# End to end: towerd on a temporary socket and state dir with stories260K. A 3-level hierarchy,
# 50 sessions under 5 bots chatting (streamed), a restart (every transcript and segment back, the next
# reply equal to the one the same request gave before), pool bytes growing by transcripts only,
# OpenAI request bodies unchanged, bad input answered with JSON errors while others are served.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
towerd_setup "$1" "$2" "$3"
command -v curl >/dev/null || { echo "SKIP: curl not installed"; exit 77; }
start

# (1) hierarchy: 1 platform, 2 communities, 5 bots.
api -X PUT http://localhost/v1/segments/plat -d '{"level":"platform","text":"You are a friendly storyteller."}' >/dev/null
for c in 0 1; do
  api -X PUT http://localhost/v1/segments/comm$c -d "{\"level\":\"community\",\"parent\":\"plat\",\"text\":\"This community likes story $c.\"}" >/dev/null
done
for b in 0 1 2 3 4; do
  api -X PUT http://localhost/v1/segments/bot$b -d "{\"level\":\"bot\",\"parent\":\"comm$((b % 2))\",\"text\":\"Your name is Bot $b.\"}" >/dev/null
done
[ "$(api http://localhost/v1/segments | json 'len(d["data"])')" = 8 ] || fail "8 segments expected"

# (2) pool bytes before sessions; every session adds only its transcript.
bytes0="$(api http://localhost/v1/pool | json 'd["kv_bytes"]')"
for i in $(seq 0 49); do
  api http://localhost/v1/sessions -d "{\"bot\":\"bot$((i % 5))\",\"id\":\"s$i\"}" >/dev/null
done
[ "$(api http://localhost/v1/pool | json 'd["kv_bytes"]')" = "$bytes0" ] || fail "creating sessions changed the pool"
for i in $(seq 0 49); do
  n=$i; [ "$i" = 5 ] && n=0   # s5 (bot0) gets the same first message as s0 (bot0)
  out="$(api -N http://localhost/v1/sessions/s$i/messages -d "{\"content\":\"Hello number $n\",\"temperature\":0,\"max_tokens\":16,\"stream\":true}")"
  echo "$out" | tail -1 | grep -q '^data: \[DONE\]' || fail "stream of s$i did not end with [DONE]: $out"
done
pool="$(api http://localhost/v1/pool)"
hier="$(echo "$pool" | json 'sum(v["bytes"] for k,v in d["by_kind"].items() if k in ("platform","community","bot"))')"
sess="$(echo "$pool" | json 'd["by_kind"]["session"]["bytes"]')"
[ "$hier" = "$bytes0" ] || fail "hierarchy bytes changed ($bytes0 -> $hier): shared segments must be stored once"
echo "pool: hierarchy $hier bytes once; 50 transcripts $sess bytes; $(echo "$pool" | json 'd["latency_ms"]')"
# Two sessions of one bot with the same history; the second message goes to s0 now, to s5 after the restart.
reply0="$(api http://localhost/v1/sessions/s0/messages -d '{"content":"What happened next?","temperature":0,"max_tokens":24}')"
before="$(echo "$reply0" | json 'd["choices"][0]["message"]["content"]')"
uncached0="$(echo "$reply0" | json 'd["usage"]["prompt_tokens"] - d["usage"]["prompt_tokens_details"]["cached_tokens"]')"
for i in $(seq 0 49); do api http://localhost/v1/sessions/s$i/transcript; echo; done | grep -v '^$' | sort >"$tmp/transcripts.before"
api http://localhost/v1/segments | json 'json.dumps([(s["name"],s["text"],s["tokens"]) for s in d["data"]])' >"$tmp/segments.before"

# (4) bad input, while the daemon keeps serving.
expect_error() {  # status, curl args...
  local want="$1"; shift
  local body code
  body="$(api -w '\n%{http_code}' "$@")"; code="$(echo "$body" | tail -1)"; body="$(echo "$body" | sed '$d')"
  [ "$code" = "$want" ] || fail "expected $want, got $code for $*: $body"
  echo "$body" | json 'd["error"]["message"] and d["error"]["type"]' >/dev/null || fail "not a JSON error: $body"
}
expect_error 400 http://localhost/v1/chat/completions -d '{"messages": [}'
expect_error 400 http://localhost/v1/chat/completions -d '{"messages":"hi"}'
expect_error 400 http://localhost/v1/chat/completions -d '{"messages":[{"role":"user","content":5}]}'
expect_error 400 http://localhost/v1/chat/completions -d '{"messages":[{"role":"user","content":"x"}],"temperature":"hot"}'
expect_error 404 http://localhost/v1/sessions/nope/messages -d '{"content":"x"}'
expect_error 404 http://localhost/v1/chat/completions -d '{"session":"nope","messages":[{"role":"user","content":"x"}]}'
printf '{"messages":[{"role":"user","content":"\xff\xfe"}]}' >"$tmp/bad-utf8.json"
expect_error 400 http://localhost/v1/chat/completions --data-binary @"$tmp/bad-utf8.json"
head -c 2000000 /dev/zero | tr '\0' 'a' >"$tmp/big.json"
expect_error 413 http://localhost/v1/chat/completions --data-binary @"$tmp/big.json"
python3 -c "import json; print(json.dumps({'messages':[{'role':'user','content':' '.join(['word']*5000)}]}))" >"$tmp/long.json"
expect_error 400 http://localhost/v1/chat/completions --data-binary @"$tmp/long.json"
expect_error 409 -X DELETE http://localhost/v1/segments/bot0
expect_error 404 http://localhost/v1/nothing-here

# (3) an OpenAI client body, unchanged, streamed and not.
openai='{"model":"stories260K","messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":"Say hi"}],"temperature":0,"max_tokens":12,"top_p":1,"n":1,"presence_penalty":0,"stream":false,"user":"u1"}'
api http://localhost/v1/chat/completions -H 'Content-Type: application/json' -d "$openai" | json 'd["choices"][0]["message"]["role"]=="assistant" and d["usage"]["total_tokens"]>0' | grep -q True || fail "OpenAI body"
api -N http://localhost/v1/chat/completions -d "${openai/\"stream\":false/\"stream\":true}" >"$tmp/sse"
grep -q '^data: {' "$tmp/sse" && grep -v '^$' "$tmp/sse" | tail -1 | grep -q '^data: \[DONE\]' || fail "SSE: $(cat "$tmp/sse")"
api http://localhost/v1/models | json 'd["data"][0]["id"]' | grep -q stories260K || fail "/v1/models"
# Read whole first: grep -q stops at its match and, under pipefail, curl's broken pipe would fail the line.
metrics="$(api http://localhost/metrics)"
grep -q '^towerd_pool_segments{tier="hot"} ' <<<"$metrics" || fail "/metrics"

# Restart: transcripts and segments back; s5 (same history as s0 had) answers as s0 did.
stop
start
for i in $(seq 0 49); do api http://localhost/v1/sessions/s$i/transcript; echo; done | grep -v '^$' | sort >"$tmp/transcripts.after"
cmp -s "$tmp/transcripts.before" "$tmp/transcripts.after" || fail "transcripts differ after the restart"
api http://localhost/v1/segments | json 'json.dumps([(s["name"],s["text"],s["tokens"]) for s in d["data"]])' >"$tmp/segments.after"
cmp -s "$tmp/segments.before" "$tmp/segments.after" || fail "segments differ after the restart"
prefilled_before="$(api http://localhost/v1/pool | json 'd["prefill_tokens"]')"
[ "$prefilled_before" = 0 ] || fail "the restart prefilled $prefilled_before tokens (every segment should come back from its file)"
reply="$(api http://localhost/v1/sessions/s5/messages -d '{"content":"What happened next?","temperature":0,"max_tokens":24}')"
after="$(echo "$reply" | json 'd["choices"][0]["message"]["content"]')"
[ "$before" = "$after" ] || fail "reply after restart differs: '$before' vs '$after'"
echo "reply before and after the restart: $after"
# The restarted session's transcript came back from its segment files: its first message after the
# restart prefilled what s0's same message prefilled without a restart (the new message, its template
# tokens and the last reply token), not the transcript.
read -r prompt cached <<<"$(echo "$reply" | json 'd["usage"]["prompt_tokens"], d["usage"]["prompt_tokens_details"]["cached_tokens"]' | tr -d '(),')"
prefilled=$(( $(api http://localhost/v1/pool | json 'd["prefill_tokens"]') - prefilled_before ))
echo "first message after the restart: prompt $prompt tokens, $cached from segments, $prefilled prefilled (without a restart: $uncached0)"
[ $((prompt - cached)) -eq "$uncached0" ] || fail "after the restart the session prefilled $((prompt - cached)) of its $prompt prompt tokens, not $uncached0"
[ "$prefilled" -eq "$uncached0" ] || fail "the pool prefilled $prefilled tokens for the session's first message after the restart, not $uncached0"
stop
echo "towerd end-to-end: OK"
