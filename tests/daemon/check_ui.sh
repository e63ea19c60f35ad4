#!/usr/bin/env bash
# The page (GET /) and `towerctl ui`: the page is served, the forwarder refuses what a browser on
# another site (or another local user) could send — no token, a foreign Origin, a foreign Host — and,
# in a real browser (Debian's chromium, headless), the page shows the tower (platform → bot) and
# streams a reply to a message sent from its chat box. The browser's view is kept as a screenshot:
# tests/artifacts/ui.png in the build directory.
#   check_ui.sh TOWERCTL TOWERD SHARED TMP_ROOT ARTIFACTS_DIR
set -euo pipefail
towerctl="$1"
. "$(dirname "$0")/lib.sh"
towerd_setup "$2" "$3" "$4"
artifacts="$5"
start
api -X PUT http://localhost/v1/segments/acme -H 'content-type: application/json' \
  -d '{"level":"platform","text":"You tell short stories."}' | grep -q '"name"' || fail "platform not defined"
api -X PUT http://localhost/v1/segments/teller -H 'content-type: application/json' \
  -d '{"level":"bot","parent":"acme","text":"Stories about a cat."}' | grep -q '"name"' || fail "bot not defined"

"$towerctl" ui --socket "$sock" --port 0 >"$tmp/ui.out" 2>"$tmp/ui.err" & ui_pid=$!
trap 'kill $ui_pid 2>/dev/null || true; cleanup' EXIT
for _ in $(seq 100); do  # bounded: the address is printed once it listens
  grep -q '^towerd.s page: ' "$tmp/ui.out" 2>/dev/null && break
  kill -0 "$ui_pid" 2>/dev/null || { cat "$tmp/ui.err"; fail "towerctl ui exited"; }
  sleep 0.1
done
url="$(sed -n 's/^towerd.s page: //p' "$tmp/ui.out")"
[ -n "$url" ] || fail "towerctl ui printed no address"
base="${url%%/\?*}"; port="${base##*:}"; token="${url##*token=}"
echo "towerctl ui: $base"

status() { curl -s -o "$tmp/body" -w '%{http_code}' "$@"; }
[ "$(status "$base/")" = 200 ] || fail "GET / through towerctl ui"
grep -q '<title>towerd</title>' "$tmp/body" || fail "GET / is not the page"
[ "$(api -o /dev/null -w '%{http_code}' http://localhost/)" = 200 ] || fail "GET / on the socket"
[ "$(status "$base/v1/pool")" = 401 ] || fail "an API call without the token must be refused (got $(cat "$tmp/body"))"
[ "$(status -H "Authorization: Bearer $token" "$base/v1/pool")" = 200 ] || fail "the token must let an API call through"
[ "$(status -H "Authorization: Bearer $token" -H 'Origin: http://evil.example' "$base/v1/pool")" = 403 ] ||
  fail "another site's Origin must be refused"
[ "$(status -H "Authorization: Bearer $token" -H "Host: evil.example:$port" "$base/v1/pool")" = 403 ] ||
  fail "a foreign Host (DNS rebinding) must be refused"
[ "$(status -X POST -H "Authorization: Bearer $token" -H "Origin: $base" -H 'content-type: application/json' \
      -d '{"bot":"teller","messages":[{"role":"user","content":"Hi"}],"max_tokens":4}' "$base/v1/chat/completions")" = 200 ] ||
  fail "the page's own origin must get through (got $(cat "$tmp/body"))"

browser="$(command -v chromium || command -v chromium-browser || true)"
if [ -z "$browser" ]; then
  echo "SKIP (browser part): chromium is not installed (scripts/install-deps.sh --dev installs it)"
  exit 0
fi
mkdir -p "$artifacts"
page="$url&bot=teller&say=Tell%20me%20a%20story"
# The page fetches, renders the tree, sends the message and streams the reply; ui_browser.py waits in
# the page for the reply's end (a condition, bounded), then keeps the DOM and a screenshot.
timeout 300 python3 "$(dirname "$0")/ui_browser.py" "$browser" "$page" "$tmp/dom.html" "$artifacts/ui.png" \
    --wait 120 --profile "$tmp/chromium" ||
  { tail -5 "$tmp/chromium/chromium.log" 2>/dev/null; fail "the page's chat did not finish its reply"; }
grep -q 'data-segment="acme"' "$tmp/dom.html" || fail "the page shows no platform segment"
grep -q 'data-segment="teller"' "$tmp/dom.html" || fail "the page shows no bot under it"
python3 - "$tmp/dom.html" <<'PY' || fail "the chat reply is not in the page"
import re, sys
dom = open(sys.argv[1]).read()
m = re.search(r'<div class="msg assistant" id="reply-1" data-done="true">([^<]*)</div>', dom)
assert m and m.group(1).strip(), "no finished reply-1 in the DOM"
print("the page's reply:", m.group(1).strip()[:80])
PY
[ -s "$artifacts/ui.png" ] || fail "no screenshot"
echo "screenshot: $artifacts/ui.png"
