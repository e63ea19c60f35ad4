#!/usr/bin/env bash
# A long session survives kill -9 right after the turns that dropped old turns (check_long_session.sh's
# setup: limits.max_prompt_tokens = 200 on stories260K). Once turns are dropped, the kept turns are
# RoPE-shifted copies of their old KV, which no prefill of their tokens gives back: the turn's record
# must wait for their files, and after a restart the next shift must start from the same (paged in)
# KV. Replies after each kill -9 and restart, logprobs included, equal an uninterrupted daemon's, and
# the restarted daemon never finds a transcript segment file missing.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
towerd_setup "$1" "$2" "$3"
command -v curl >/dev/null || { echo "SKIP: curl not installed"; exit 77; }
cat >"$tmp/towerd.toml" <<EOF
[limits]
max_prompt_tokens = 200
EOF

say() {  # message number -> "dropped_turns text [logprobs]" (one line)
  local out
  out="$(api http://localhost/v1/sessions/long/messages \
           -d "{\"content\":\"Tell me part $1 of the story.\",\"temperature\":0,\"max_tokens\":24,\"logprobs\":true}")"
  # The logprobs are the sensitive part: this small model's greedy text rarely moves with its context.
  echo "$out" | json 'str(d["usage"].get("dropped_turns", 0)) + " " + d["choices"][0]["message"]["content"] + " " +
                      repr([t["logprob"] for t in d["choices"][0]["logprobs"]["content"]])' || fail "turn $1 failed: $out"
}
fresh() {  # a new state dir $1 with the bot and the session
  state="$tmp/state-$1"
  start --config "$tmp/towerd.toml"
  api -X PUT http://localhost/v1/segments/plat -d '{"level":"platform","text":"You are a storyteller."}' >/dev/null
  api -X PUT http://localhost/v1/segments/bot -d '{"level":"bot","parent":"plat","text":"Tell short stories."}' >/dev/null
  api http://localhost/v1/sessions -d '{"bot":"bot","id":"long"}' >/dev/null
}
kill9_restart() {
  kill -9 "$pid"
  wait "$pid" 2>/dev/null || true
  pid=""
  start --config "$tmp/towerd.toml"
}

# The uninterrupted daemon: turns until the first that drops, then three more.
fresh ref
first_drop=0
for i in $(seq 1 30); do
  r="$(say "$i")"
  echo "$r" >"$tmp/ref.$i"
  if [ "$first_drop" = 0 ] && [ "${r%% *}" -gt 0 ]; then first_drop=$i; fi
  [ "$first_drop" -gt 0 ] && [ "$i" -ge $((first_drop + 3)) ] && break
done
[ "$first_drop" -gt 0 ] || fail "30 turns never reached the context: the test does not test truncation"
stop
last=$((first_drop + 3))

# The same turns, with towerd killed (SIGKILL) right after every reply from the first drop on.
fresh killed
for i in $(seq 1 "$last"); do
  got="$(say "$i")"
  [ "$got" = "$(cat "$tmp/ref.$i")" ] || fail "turn $i after kill -9 and restart: '${got:0:160}' instead of '$(cut -c1-160 "$tmp/ref.$i")'"
  [ "$i" -ge "$first_drop" ] && [ "$i" -lt "$last" ] && kill9_restart
done
# Acknowledged turns never named a segment whose file was not there.
if grep -q "cannot be used" "$tmp/log"; then fail "a restart found a transcript segment unusable: $(grep "cannot be used" "$tmp/log" | head -3)"; fi
stop
echo "turns $first_drop..$last (each dropping old turns) killed with SIGKILL after the reply; every next reply and its logprobs as without the kills"
echo "OK: long session survives kill -9"
