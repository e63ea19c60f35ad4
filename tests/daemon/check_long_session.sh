#!/usr/bin/env bash
# Long sessions keep working (issue 12 item 5): a session driven far past the prompt limit (here
# limits.max_prompt_tokens = 200 on stories260K) answers every message; its oldest turns are dropped
# (usage says how many), never the bot's segments; the kept turns are served from RoPE-shifted
# segments, not re-prefilled; a restart serves the same truncated history and the same next reply;
# with overflow = "error" the same session is refused with 400 context_length_exceeded instead. The
# session holds about one segment (and file) per kept turn, however long it ran (issue 25 item 4).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
towerd_setup "$1" "$2" "$3"
command -v curl >/dev/null || { echo "SKIP: curl not installed"; exit 77; }
cat >"$tmp/towerd.toml" <<EOF
[limits]
max_prompt_tokens = 200
EOF
start --config "$tmp/towerd.toml"

api -X PUT http://localhost/v1/segments/plat -d '{"level":"platform","text":"You are a storyteller."}' >/dev/null
api -X PUT http://localhost/v1/segments/bot -d '{"level":"bot","parent":"plat","text":"Tell short stories."}' >/dev/null
api http://localhost/v1/sessions -d '{"bot":"bot","id":"long"}' >/dev/null
say() {  # message number -> the reply's JSON (one line)
  api http://localhost/v1/sessions/long/messages \
    -d "{\"content\":\"Tell me part $1 of the story.\",\"temperature\":0,\"max_tokens\":24,\"logprobs\":true}"
}
# A reply's text and its tokens' logprobs (this small model's greedy text rarely moves with its context).
reply() { json 'd["choices"][0]["message"]["content"] + " " + repr([t["logprob"] for t in d["choices"][0]["logprobs"]["content"]])'; }
dropped_any=0
for i in $(seq 1 30); do
  out="$(say "$i")"
  echo "$out" | json 'd["choices"][0]["message"]["content"] is not None' | grep -q True || fail "turn $i failed: $out"
  d="$(echo "$out" | json 'd["usage"].get("dropped_turns", 0)')"
  [ "$d" -gt 0 ] && dropped_any=1
  p="$(echo "$out" | json 'd["usage"]["prompt_tokens"]')"
  [ "$p" -le 200 ] || fail "turn $i: a prompt of $p tokens passed the limit of 200"
done
[ "$dropped_any" = 1 ] || fail "30 turns never reached the context: the test does not test truncation"
msgs="$(api http://localhost/v1/sessions/long | json 'd["messages"]')"
[ "$msgs" -lt 60 ] || fail "the transcript kept all $msgs messages"
first="$(api http://localhost/v1/sessions/long/transcript | json 'd["messages"][0]["content"]')"
case "$first" in "Tell me part 1 of"*) fail "the oldest turn is still there";; esac
pool="$(api http://localhost/v1/pool)"
echo "after 30 turns: $msgs messages kept, first: \"$first\"; $(echo "$pool" | json 'd["by_kind"].get("session")')"
# The session holds only the segments its transcript uses: about one per kept turn, not a copy of the
# kept transcript for every turn past the context (they used to stay until a restart), and no more
# files than segments (+ the two hierarchy ones).
kept_turns=$((msgs / 2))
held="$(echo "$pool" | json 'd["by_kind"]["session"]["segments"]')"
files="$(find "$state/segments" -name '*.tws' | wc -l)"
echo "session segments: $held for $kept_turns kept turns; segment files: $files"
[ "$held" -le $((kept_turns + 2)) ] || fail "after 30 turns the session holds $held segments for $kept_turns kept turns"
[ "$files" -le $((held + 2)) ] || fail "$files segment files for $held session segments and 2 hierarchy ones"
# The bot's segments are still the first of the tower: the next reply reuses them.
cached="$(echo "$(say 31)" | json 'd["usage"]["prompt_tokens_details"]["cached_tokens"]')"
[ "$cached" -gt 0 ] || fail "the next turn reused no segment"

# A restart serves the same history and the same next reply as an uninterrupted daemon would.
cp -r "$state" "$tmp/state-copy"
want="$(say 32 | reply)"
stop
rm -rf "$state"; mv "$tmp/state-copy" "$state"; rm -f "$state/towerd.lock"
start --config "$tmp/towerd.toml"
[ "$(api http://localhost/v1/sessions/long | json 'd["messages"]')" -ge 2 ] || fail "the session is gone after the restart"
got="$(say 32 | reply)"
[ "$got" = "$want" ] || fail "after the restart the reply differs: '$got' vs '$want'"
stop

# overflow = "error": the same full session is refused, with the OpenAI code.
cat >>"$tmp/towerd.toml" <<EOF
overflow = "error"
EOF
start --config "$tmp/towerd.toml"
for i in $(seq 33 60); do
  code="$(api -o "$tmp/err.json" -w '%{http_code}' http://localhost/v1/sessions/long/messages \
            -d "{\"content\":\"Tell me part $i of the story.\",\"temperature\":0,\"max_tokens\":24}")"
  [ "$code" = 200 ] && continue
  [ "$code" = 400 ] || fail "expected 400 once full, got $code: $(cat "$tmp/err.json")"
  json 'd["error"]["code"]' <"$tmp/err.json" | grep -qx context_length_exceeded || fail "not context_length_exceeded: $(cat "$tmp/err.json")"
  break
done
[ "$code" = 400 ] || fail "overflow = \"error\" never refused a message"
stop
echo "OK: long session past the context (truncate and error)"
