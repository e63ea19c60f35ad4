#!/usr/bin/env bash
# The coded record is the cold session. A session whose transcript went cold (POST /v1/compress with
# idle_seconds 0 codes every idle segment) holds none of its tokens in the cache trie (GET /v1/pool:
# token_bytes drops by at least its transcript, its segments are at rest), and its next message —
# whose tokens come back only by decoding its records under their parents, then a prefill — gets the
# same reply, text and every logprob, as the same session on a daemon where nothing went cold; and
# so does the same session killed (SIGKILL) at rest and restarted (it comes back at rest from the
# cold packs' index). Once all its segments are coded the session itself goes to rest: its text
# leaves the state log (a session_rest record) and RAM, and its messages come back decoded.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
towerd_setup "$1" "$2" "$3"
command -v curl >/dev/null || { echo "SKIP: curl not installed"; exit 77; }

msg() {  # content, max_tokens -> the reply's text and every token's logprob (one line)
  local out
  out="$(api "http://localhost/v1/sessions/s/messages" \
           -d "{\"content\":\"$1\",\"temperature\":0,\"max_tokens\":$2,\"logprobs\":true}")"
  echo "$out" | json 'd["choices"][0]["message"]["content"] + " " + repr([t["logprob"] for t in d["choices"][0]["logprobs"]["content"]])' ||
    fail "no reply: $out"
}
pool() { api http://localhost/v1/pool | json "$1"; }
setup() {  # NAME [towerd args]: a fresh state dir with one bot and session s, two turns in (replies in $first)
  [ -z "$pid" ] || stop
  state="$tmp/state-$1"
  start "${@:2}"  # (not in a $(...): towerd would hold its output open)
  api -X PUT http://localhost/v1/segments/plat -d '{"level":"platform","text":"You are a storyteller."}' >/dev/null
  api -X PUT http://localhost/v1/segments/bot -d '{"level":"bot","parent":"plat","text":"Tell short stories."}' >/dev/null
  api http://localhost/v1/sessions -d '{"bot":"bot","id":"s"}' >/dev/null
  first="$(msg "Once upon a time" 20)"
  first+="$(msg "What happened next?" 24)"
}

# Never cold.
setup warm
want_first="$first"
want="$(msg "And then?" 24)"

# Cold after two turns: the session's segments leave the trie.
setup cold
got_first="$first"
[ "$got_first" = "$want_first" ] || fail "the first two replies differ between two fresh daemons"
transcript="$(api http://localhost/v1/sessions/s | json 'd["transcript_tokens"]')"
messages="$(api http://localhost/v1/sessions/s/transcript | json 'd["messages"]')"
before="$(pool 'd["token_bytes"]')"
compress="$(api http://localhost/v1/compress -d '{"idle_seconds":0}')"
compressed="$(echo "$compress" | json 'd["compressed"]')"
# The session went to rest: the state log holds none of its text (a compaction rewrote it), and the
# session says so without waking.
[ "$(echo "$compress" | json 'd["sessions_to_rest"]')" = 1 ] || fail "the session did not go to rest: $compress"
[ "$(api http://localhost/v1/sessions/s | json 'd["at_rest"]')" = True ] || fail "the session does not say it is at rest"
[ "$(api http://localhost/v1/sessions/s | json 'd["transcript_tokens"]')" = "$transcript" ] || fail "at rest, the transcript's length changed"
! grep -qaF "What happened next" "$state/towerd.log" || fail "the state log still holds the text of a session at rest"
after="$(pool 'd["token_bytes"]')"
resting="$(pool 'd["at_rest"]["segments"]')"
serving_coded="$(pool 'd["at_rest"]["bytes"]')"
echo "transcript $transcript tokens; compressed $compressed segments; trie token bytes $before -> $after; at rest: $resting segments, $(pool 'd["at_rest"]["bytes"]') coded bytes"
[ "$resting" -ge 2 ] || fail "the session's two turns are not at rest ($resting segments)"
[ $((before - after)) -ge $((transcript * 4)) ] ||
  fail "the trie still holds the cold session's tokens: $before -> $after bytes for a transcript of $transcript tokens"

got="$(msg "And then?" 24)"
wakes="$(pool 'd["at_rest"]["wakes"]')"
errors="$(pool 'd["at_rest"]["wake_errors"]')"
[ "$(api http://localhost/v1/sessions/s | json 'd["at_rest"]')" = False ] || fail "after its turn, the session is still at rest"
woken_messages="$(api http://localhost/v1/sessions/s/transcript | json 'd["messages"][:4]')"
[ "$woken_messages" = "$messages" ] || fail "woken, the session's messages are $woken_messages, not $messages"
stop
[ "$wakes" -ge 2 ] || fail "the reply did not decode the session's records ($wakes woken)"
[ "$errors" = 0 ] || fail "$errors records failed to decode"
[ "$got" = "$want" ] || fail "after going cold the session replied '$got' instead of '$want'"
echo "the third reply after going cold ($wakes segments decoded): $(echo "$want" | cut -c1-70)"

# Killed at rest: the session's records are in the cold packs, so it comes back at rest (no KV file,
# no token in the trie: the packs' index only) and its next message decodes them, to the same reply.
setup cold-kill9
api http://localhost/v1/compress -d '{"idle_seconds":0}' >/dev/null
packed="$(pool 'd["at_rest"]["packed"]["segments"]')"
[ "$packed" -ge 2 ] || fail "the session's records are not in the cold packs ($packed segments)"
kill -KILL "$pid"; wait "$pid" 2>/dev/null || true; pid=""
start
resting="$(pool 'd["at_rest"]["segments"]')"
after="$(pool 'd["token_bytes"]')"
[ "$resting" -ge 2 ] || fail "restarted, the session is not at rest ($resting segments)"
[ "$(pool 'd["at_rest"]["bytes"]')" = 0 ] || fail "restarted, records at rest are held in RAM"
[ "$(api http://localhost/v1/sessions/s | json 'd["at_rest"]')" = True ] || fail "restarted, the session is not at rest"
hierarchy=$(( $(api http://localhost/v1/segments/plat | json 'd["tokens"]') + $(api http://localhost/v1/segments/bot | json 'd["tokens"]') ))
[ "$after" -le $((hierarchy * 4)) ] ||
  fail "restarted, the trie holds the session's tokens: $after bytes, the platform and bot are $((hierarchy * 4))"
# Its messages come back decoded (GET wakes it), the same as before it went to rest.
woken_messages="$(api http://localhost/v1/sessions/s/transcript | json 'd["messages"]')"
[ "$woken_messages" = "$messages" ] || fail "restarted at rest, the session's messages are $woken_messages, not $messages"
got="$(msg "And then?" 24)"
wakes="$(pool 'd["at_rest"]["wakes"]')"
stop
[ "$wakes" -ge 2 ] || fail "restarted, the reply did not decode the session's records ($wakes woken)"
[ "$got" = "$want" ] || fail "killed at rest and restarted, the session replied '$got' instead of '$want'"
echo "killed at rest: restarted with $resting segments at rest from the cold packs, trie token bytes $after; the same third reply"

# The disk budget drives the cold tier: idle_seconds is the youngest a segment may go cold at, not a
# timer. With room on disk, segments idle far past it stay warm (two background scans, nothing
# coded); restarted with a budget 10% under the files, the compressor codes idle segments in the
# policy's order until they fit (at rest, not all of them), and the session's reply is the same.
poll() {  # PY_EXPR on /v1/pool until it prints True (bounded: 300 x 0.1 s)
  for _ in $(seq 300); do
    [ "$(pool "$1")" = True ] && return 0
    sleep 0.1
  done
  fail "not reached: $1 (pool: $(api http://localhost/v1/pool | head -c 600))"
}
printf '[cold]\nidle_seconds = 0\nscan_seconds = 1\n[state]\ndisk_budget = "100G"\n' >"$tmp/roomy.toml"
setup budget --config "$tmp/roomy.toml"
poll 'd["compressor"]["scans"] >= 2'
[ "$(pool 'd["compressor"]["compressed"]')" = 0 ] || fail "with room on disk, idle segments went cold"
[ "$(pool 'd["at_rest"]["segments"]')" = 0 ] || fail "with room on disk, segments are at rest"
files="$(pool 'd["disk"]["bytes"]')"
budget=$((files * 9 / 10))
stop
printf '[cold]\nidle_seconds = 0\nscan_seconds = 1\n[state]\ndisk_budget = %d\n' "$budget" >"$tmp/tight.toml"
start --config "$tmp/tight.toml"
poll "d['disk']['bytes'] <= $budget"
coded="$(pool 'd["compressor"]["compressed"]')"
warm="$(pool 'd["warm"]["segments"] + d["hot"]["segments"]')"
[ "$coded" -ge 1 ] || fail "over the disk budget, nothing was coded"
[ "$warm" -ge 2 ] || fail "the budget needed 10% of the files, yet only $warm segments kept theirs"
got="$(msg "And then?" 24)"
stop
[ "$got" = "$want" ] || fail "after the disk budget sent segments to rest, the session replied '$got' instead of '$want'"
echo "disk budget: roomy, nothing went cold; at 90% of the files ($files B), $coded segment(s) coded until they fit, $warm kept; the same third reply"

# [cold] coder: a smaller model of the same vocabulary codes and decodes. Here it has random weights,
# so it compresses worse (more coded bytes than the serving model's: proof that it coded), yet it gives
# back the same tokens: the same third reply. Then a restart with the serving model as coder again:
# the packs the other coder wrote are set aside, and the session, recomputed from the log's tokens on
# its next message, still gives the same reply.
if [ -n "${TOWERCTL:-}" ]; then
  "$TOWERCTL" model synth --shape tiny --type q8_0 --tokenizer "$model" -o "$tmp/coder.gguf" --threads 2 >"$tmp/synth.log" 2>&1 ||
    fail "cannot synthesize a coder: $(tail -3 "$tmp/synth.log")"
  printf '[cold]\ncoder = "%s"\n' "$tmp/coder.gguf" >"$tmp/coder.toml"
  setup coder --config "$tmp/coder.toml"
  grep -q "coded in the background.* by the coder $tmp/coder.gguf" "$tmp/log" || fail "towerd does not say it codes with the coder"
  api http://localhost/v1/compress -d '{"idle_seconds":0}' >/dev/null
  resting="$(pool 'd["at_rest"]["segments"]')"
  coder_coded="$(pool 'd["at_rest"]["bytes"]')"
  [ "$resting" -ge 2 ] || fail "with a coder, the session's two turns are not at rest ($resting segments)"
  [ "$coder_coded" -gt "$serving_coded" ] ||
    fail "the random coder's records ($coder_coded B) are not larger than the serving model's ($serving_coded B): did it code?"
  got="$(msg "And then?" 24)"
  [ "$(pool 'd["at_rest"]["wake_errors"]')" = 0 ] || fail "with a coder, records failed to decode"
  [ "$(pool 'd["at_rest"]["wakes"]')" -ge 2 ] || fail "with a coder, the reply did not decode the session's records"
  [ "$got" = "$want" ] || fail "with a coder, the session replied '$got' instead of '$want'"
  echo "coder: $coder_coded coded bytes (the serving model's: $serving_coded), the same third reply"

  # A session at rest exists only in the coder's records: another coder is refused (nothing set aside,
  # nothing lost), and the coder that wrote them serves it again.
  setup coder-switch --config "$tmp/coder.toml"
  api http://localhost/v1/compress -d '{"idle_seconds":0}' >/dev/null
  [ "$(api http://localhost/v1/sessions/s | json 'd["at_rest"]')" = True ] || fail "with a coder, the session is not at rest"
  stop
  rc=0
  "$towerd" --model "$model" --socket "$tmp/switch.sock" --state-dir "$state" --threads 2 2>"$tmp/switch.log" || rc=$?
  [ "$rc" = 2 ] || fail "sessions at rest and another coder: towerd exited with $rc, not 2 (invalid config)"
  grep -q "invalid config: cold.coder: 1 session(s) are at rest in .* only that model can decode them" "$tmp/switch.log" ||
    fail "sessions at rest and another coder: no reason given: $(cat "$tmp/switch.log")"
  start --config "$tmp/coder.toml"
  got="$(msg "And then?" 24)"
  [ "$got" = "$want" ] || fail "back with its coder, the session replied '$got' instead of '$want'"
  # Woken (and recorded whole again), the session no longer binds the coder: the switch sets the old
  # packs aside and the session is recomputed from the log's tokens.
  stop
  start
  grep -q "the cold packs were coded by model .* set aside" "$tmp/log" || fail "another coder's packs were not set aside"
  [ "$(pool 'd["at_rest"]["segments"]')" = 0 ] || fail "records of another coder came back at rest"
  got="$(msg "What then?" 16)"
  stop
  echo "coder changed: refused while a session was at rest in its records; after a wake, the old packs set aside and the session recomputed from the log"

  # A coder of another vocabulary cannot code this model's tokens: towerd refuses to start, and says why.
  printf '[cold]\ncoder = "%s"\n' "$shared/models/babyllama105.gguf" >"$tmp/bad_coder.toml"
  rc=0
  "$towerd" --model "$model" --socket "$tmp/bad.sock" --state-dir "$tmp/state-bad" --threads 2 \
    --config "$tmp/bad_coder.toml" 2>"$tmp/bad.log" || rc=$?
  [ "$rc" = 2 ] || fail "a coder of another vocabulary: towerd exited with $rc, not 2 (invalid config)"
  grep -q "invalid config: cold.coder: .* cannot code this model's tokens: the coder model's vocabulary has" "$tmp/bad.log" ||
    fail "a coder of another vocabulary: no reason given: $(cat "$tmp/bad.log")"
else
  echo "([cold] coder part skipped: TOWERCTL not set)"
fi
echo "OK: cold session"
