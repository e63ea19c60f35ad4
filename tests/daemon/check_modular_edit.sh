#!/usr/bin/env bash
# Modular towers (issue 16): an edit of the platform's text places every segment under it on the new
# platform at once (its old KV reused, RoPE-shifted, its first [modular] repair_tokens recomputed) and
# rebuilds each exactly in the background. Checked on platform -> community -> 2 bots:
#   - right after the edit a bot answers; once no segment reports "pool": {"modular": true}, greedy
#     replies (text and every token's logprob) equal a freshly started towerd's given the final texts;
#   - with background_exact = false the bots report modular as soon as the PUT answers (a placement
#     still queued must not look exact), stay so, answer (a prompt's whole chain served from the
#     modular tower), and their logprobs differ from the exact ones (so the comparison above can tell
#     modular KV from exact KV), and /metrics counts them;
#   - a restart (SIGTERM) with background_exact = true rebuilds them exactly: the same replies again;
#   - a bot linked under a second community answers at once and, once exact, equals a fresh towerd's
#     bot of the same text defined there;
#   - repair_tokens below 16 (the measured floor, docs/towers.md) stops towerd naming the key.
# The question asked right after the edit is the one compared later, on the same bot: a prompt cached
# over modular rows must not outlive their exact replacement.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
towerd_setup "$1" "$2" "$3"
command -v curl >/dev/null || { echo "SKIP: curl not installed"; exit 77; }

PLATFORM="You are a friendly storyteller for little children. Your stories are short and happy. They have animals, a girl named Lily and a big red ball. Every story ends well."
EDITED="You are a friendly storyteller for little children. Your stories are short and happy. They have animals, a girl named Lily and a big red ball. Every story ends with a hug and a song."
COMMUNITY="This room is for stories about the sea. Boats, fish, shells and waves are in every story, and a kind old man who fixes nets by the water."
BOT1="Your name is Tom. You are a small brown dog who lives on a boat. You like to bark at birds, to run on the deck and to sleep in the sun."
BOT2="Your name is Sue. You are a happy fish with blue fins. You swim near the rocks, find shiny things and play hide and seek with the crabs."
COMMUNITY2="This room is for stories about the farm. Cows, hens and a red tractor are in every story, and a farmer who sings in the morning."
QUESTION="Tell me a story about the boat."
DEADLINE_S=120   # for the background rebuild of three short segments on stories260K

printf '[modular]\nbackground_exact = false\n' >"$tmp/approximate.toml"
printf '[modular]\nbackground_exact = true\n' >"$tmp/exact.toml"

put() {  # name level parent text
  local parent="" out
  [ -n "$3" ] && parent=",\"parent\":\"$3\""
  out="$(api -X PUT "http://localhost/v1/segments/$1" -d "{\"level\":\"$2\"$parent,\"text\":\"$4\"}")"
  echo "$out" | json 'd["tokens"]' >/dev/null 2>&1 || fail "PUT $1: $out"
}
define() {  # platform text: the whole hierarchy
  put plat platform "" "$1"
  put comm community plat "$COMMUNITY"
  put b1 bot comm "$BOT1"
  put b2 bot comm "$BOT2"
}
ask() {  # bot -> the greedy reply's text and every token's logprob (one line); status 200 or it fails
  local out code
  out="$(api -w '\n%{http_code}' http://localhost/v1/chat/completions \
           -d "{\"bot\":\"$1\",\"messages\":[{\"role\":\"user\",\"content\":\"$QUESTION\"}],\"temperature\":0,\"seed\":7,\"max_tokens\":24,\"logprobs\":true}")"
  code="${out##*$'\n'}"
  out="${out%$'\n'*}"
  [ "$code" = 200 ] || { echo "HTTP $code from bot $1: $out" >&2; return 1; }
  # The logprobs are the sensitive part: this small model's greedy text rarely moves with its context.
  echo "$out" | json 'd["choices"][0]["message"]["content"] + " " + repr([t["logprob"] for t in d["choices"][0]["logprobs"]["content"]])'
}
same_reply() {  # bot, wanted reply, when
  local got
  got="$(ask "$1")" || fail "$3, $1 (above)"
  [ "$got" = "$2" ] || fail "$3, $1 replied '$got', a fresh towerd '$2'"
}
# Names of the segments whose KV is a modular placement or not computed yet, on one line. Exit
# status 1 (reasons on stderr) when a segment with KV has no boolean pool.modular, or exact_progress
# is out of place.
modular_names() {
  api http://localhost/v1/segments | python3 -c '
import json, sys
bad, names = [], []
for g in json.load(sys.stdin)["data"]:
    p = g.get("pool")
    if p is None:
        continue
    if not isinstance(p.get("modular"), bool):
        bad.append("%s: pool.modular is %r" % (g["name"], p.get("modular")))
    elif "exact_progress" in p and not (p["modular"] and 0 <= p["exact_progress"] <= 1):
        bad.append("%s: exact_progress %r with modular %r" % (g["name"], p["exact_progress"], p["modular"]))
    # Waiting for its placement or build, it has no KV yet (tier cold: this script never idles long
    # enough for the cold tier): not exact either.
    if p.get("modular") is True or p.get("tier") == "cold":
        names.append(g["name"])
if bad:
    sys.exit("bad segment JSON: " + "; ".join(bad))
print(" ".join(names))'
}
wait_exact() {  # until every segment is computed exactly (bounded: DEADLINE_S)
  local names t0=$SECONDS
  while :; do
    names="$(modular_names)" || fail "GET /v1/segments (above)"
    [ -z "$names" ] && return 0
    [ $((SECONDS - t0)) -lt "$DEADLINE_S" ] || fail "modular or not computed ${DEADLINE_S} s after the edit: $names"
    sleep 0.1
  done
}
computed() {  # every segment has KV, none modular (before an edit)
  local out
  out="$(api http://localhost/v1/segments | json '" ".join(sorted(g["name"] for g in d["data"] if g["pool"] is not None))')"
  [ "$out" = "b1 b2 comm plat" ] || fail "after a chat, only [$out] have KV"
  out="$(modular_names)" || fail "GET /v1/segments (above)"
  [ -z "$out" ] || fail "modular segments before any edit: $out"
}
chat_once() {  # a session on b1 chats once
  local out
  api http://localhost/v1/sessions -d '{"bot":"b1","id":"s"}' >/dev/null
  out="$(api http://localhost/v1/sessions/s/messages -d '{"content":"Hello!","temperature":0,"max_tokens":8}')"
  echo "$out" | json 'd["choices"][0]["message"]["content"]' >/dev/null 2>&1 || fail "session s: $out"
}

# B: a fresh towerd given the final texts.
state="$tmp/state-fresh"
start
define "$EDITED"
b1_want="$(ask b1)" || fail "fresh towerd, b1 (above)"
b2_want="$(ask b2)" || fail "fresh towerd, b2 (above)"
put comm2 community plat "$COMMUNITY2"
put b1.comm2 bot comm2 "$BOT1"
linked_want="$(ask b1.comm2)" || fail "fresh towerd, b1.comm2 (above)"
names="$(modular_names)" || fail "GET /v1/segments (above)"
[ -z "$names" ] || fail "a fresh towerd has modular segments: $names"
stop

# A: the edit, with the background rebuild (the defaults).
state="$tmp/state-edit"
start
define "$PLATFORM"
chat_once
computed
put plat platform "" "$EDITED"
ask b1 >/dev/null || fail "b1 right after the edit (above)"
wait_exact
same_reply b1 "$b1_want" "once exact after the edit"
same_reply b2 "$b2_want" "once exact after the edit"
echo "edit, then exact in the background: replies equal a fresh towerd's ($(echo "$b1_want" | cut -c1-50))"
# One bot under a second community: linked (placed from b1's KV), answers at once, then exact.
put comm2 community plat "$COMMUNITY2"
out="$(api http://localhost/v1/segments/b1/link -d '{"parent":"comm2"}')"
[ "$(echo "$out" | json 'd["name"] + " " + d["parent"] + " " + d["text"]')" = "b1.comm2 comm2 $BOT1" ] || fail "link b1 under comm2: $out"
ask b1.comm2 >/dev/null || fail "b1.comm2 right after the link (above)"
wait_exact
same_reply b1.comm2 "$linked_want" "linked, once exact"
code="$(api -o /dev/null -w '%{http_code}' http://localhost/v1/segments/b1/link -d '{"parent":"comm"}')"
[ "$code" = 400 ] || fail "linking b1 under its own parent: HTTP $code, expected 400"
code="$(api -o /dev/null -w '%{http_code}' http://localhost/v1/segments/b1/link -d '{"parent":"nowhere"}')"
[ "$code" = 404 ] || fail "linking b1 under a parent that does not exist: HTTP $code, expected 404"
stop
echo "link: b1 under comm2 answers at once and, once exact, equals a fresh towerd's b1.comm2"

# Without the background rebuild: modular until a restart that has it.
state="$tmp/state-approximate"
start --config "$tmp/approximate.toml"
define "$PLATFORM"
chat_once
computed
put plat platform "" "$EDITED"
for b in b1 b2; do  # "placed at once": modular as soon as the PUT answers
  pool="$(api "http://localhost/v1/segments/$b" | json 'd["pool"]')"
  case "$pool" in
    *"'modular': True"*) ;;
    *"'tier': 'cold'"*) fail "$b is not placed when the edit's PUT answers, and says modular false: $pool" ;;
    *) fail "$b after the edit without background_exact: $pool" ;;
  esac
done
# The trie serves a prompt over the modular tower: every token of the bot's chain comes from it.
chain="$(api http://localhost/v1/segments | json 'sum(g["tokens"] for g in d["data"] if g["name"] in ("plat", "comm", "b1"))')"
cached="$(api http://localhost/v1/chat/completions \
            -d "{\"bot\":\"b1\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi.\"}],\"max_tokens\":1}" |
          json 'd["usage"]["prompt_tokens_details"]["cached_tokens"]')"
[ "$cached" -ge "$chain" ] || fail "a prompt on modular b1 reused $cached tokens, its chain has $chain"
got1="$(ask b1)" || fail "modular b1 (above)"
got2="$(ask b2)" || fail "modular b2 (above)"
[ "$got1" != "$b1_want" ] || fail "b1's modular reply equals the exact one: the test cannot tell them apart"
[ "$got2" != "$b2_want" ] || fail "b2's modular reply equals the exact one: the test cannot tell them apart"
names="$(modular_names)" || fail "GET /v1/segments (above)"
case " $names " in *" plat "*) fail "the edited platform itself is modular: [$names]" ;; esac
gauge="$(api http://localhost/metrics | awk '$1 == "towerd_pool_modular_segments" { print $2 }')"
[ "$gauge" = "$(echo $names | wc -w)" ] || fail "towerd_pool_modular_segments is '$gauge', GET /v1/segments shows [$names]"
echo "background_exact = false: [$names] modular, and they answer"
stop
start --config "$tmp/exact.toml"
wait_exact
same_reply b1 "$b1_want" "rebuilt after a restart"
same_reply b2 "$b2_want" "rebuilt after a restart"
stop
echo "restart with background_exact = true: rebuilt exactly"

# Fewer repaired tokens than the floor: refused at start, naming the key.
printf '[modular]\nrepair_tokens = 8\n' >"$tmp/bad.toml"
rc=0
"$towerd" --model "$model" --socket "$sock" --state-dir "$tmp/state-bad" --config "$tmp/bad.toml" 2>"$tmp/err" >/dev/null || rc=$?
[ "$rc" = 2 ] || fail "repair_tokens = 8: expected exit status 2, got $rc: $(cat "$tmp/err")"
grep -q "modular.repair_tokens" "$tmp/err" || fail "repair_tokens = 8: the error does not name modular.repair_tokens: $(cat "$tmp/err")"
echo "repair_tokens = 8 -> $(cat "$tmp/err")"
echo "OK: modular edit"
