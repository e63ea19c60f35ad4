#!/usr/bin/env bash
# A session's replies are a function of its own history (temperature 0): session s alone, and s
# beside a sibling session on the same bot that sends the same first message with another
# max_tokens — its sealed first turn is a prefix of s's, so the cache trie holds one below the other —
# give s the same second and third replies, whichever of the two sealed its first turn first. (A
# tower built from the trie's payload path instead of s's own chain of segments held the sibling's
# rows and then s's own from the start again.)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
towerd_setup "$1" "$2" "$3"
command -v curl >/dev/null || { echo "SKIP: curl not installed"; exit 77; }

msg() {  # session, content, max_tokens -> the reply's text and every token's logprob (one line)
  local out
  out="$(api "http://localhost/v1/sessions/$1/messages" \
           -d "{\"content\":\"$2\",\"temperature\":0,\"max_tokens\":$3,\"logprobs\":true}")"
  # The logprobs are the sensitive part: this small model's greedy text rarely moves with its context.
  echo "$out" | json 'd["choices"][0]["message"]["content"] + " " + repr([t["logprob"] for t in d["choices"][0]["logprobs"]["content"]])' ||
    fail "no reply for $1: $out"
}
setup() {  # a fresh state dir with one bot and sessions $@
  stop_if_running
  state="$tmp/state-$1"; shift
  start
  api -X PUT http://localhost/v1/segments/plat -d '{"level":"platform","text":"You are a storyteller."}' >/dev/null
  api -X PUT http://localhost/v1/segments/bot -d '{"level":"bot","parent":"plat","text":"Tell short stories."}' >/dev/null
  for s in "$@"; do api http://localhost/v1/sessions -d "{\"bot\":\"bot\",\"id\":\"$s\"}" >/dev/null; done
}
stop_if_running() { [ -z "$pid" ] || stop; }
rest() {  # s's second and third replies, one line each
  msg s "What happened next?" 24
  msg s "And then?" 24
}

# s alone: its first reply has 20 tokens.
setup alone s
first="$(msg s "Once upon a time" 20)"
want="$(rest)"
# The sibling seals first (its shorter turn is sealed, then s's longer one lands below it in the trie).
setup sib-first sib s
msg sib "Once upon a time" 10 >/dev/null
[ "$(msg s "Once upon a time" 20)" = "$first" ] || fail "s's first reply changed beside the sibling"
got1="$(rest)"
# s seals first (the sibling's shorter turn is inserted inside the trie edge of s's).
setup s-first sib s
msg s "Once upon a time" 20 >/dev/null
msg sib "Once upon a time" 10 >/dev/null
got2="$(rest)"
stop
[ "$got1" = "$want" ] || fail "with the sibling sealed first, s replied '$got1' instead of '$want'"
[ "$got2" = "$want" ] || fail "with s sealed first, s replied '$got2' instead of '$want'"
echo "s's replies alone and beside a sibling (both orders): $(echo "$want" | cut -c1-60 | tr '\n' '|')"
echo "OK: sibling sessions"
