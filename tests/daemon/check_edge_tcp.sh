#!/usr/bin/env bash
# The loopback TCP listener refuses what a web page could send it (issue 13 item 4): a Host that is
# not a loopback name (DNS rebinding), an Origin not in server.allowed_origins (CSRF), a POST/PUT
# body that is not application/json, and, with server.api_key_file, a missing or wrong bearer token.
# The Unix socket is unaffected. --listen sets the same listener from the command line. Config
# values are checked whole (issue 13 item 6): a port above 65535, a non-loopback address, a key
# file others can read, an origin with a path: each stops towerd with exit status 2 and the key.
# CORS for server.allowed_origins: preflights answered, replies readable (issue 23).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
towerd_setup "$1" "$2" "$3"
command -v curl >/dev/null || { echo "SKIP: curl not installed"; exit 77; }
. "$(dirname "$0")/edge_lib.sh"
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port="$(free_port)"
key="$(head -c 24 /dev/urandom | base64)"
printf '%s\n' "$key" >"$tmp/api.key"; chmod 600 "$tmp/api.key"
cat >"$tmp/towerd.toml" <<EOF
[server]
tcp_listen = "127.0.0.1:$port"
allowed_origins = ["http://localhost:3000"]
api_key_file = "$tmp/api.key"
EOF
start --config "$tmp/towerd.toml"
base="http://127.0.0.1:$port"
auth=(-H "Authorization: Bearer $key")
# expect STATUS WHAT CURL-ARGS...: the request's status; a refusal must be a JSON error.
expect() {
  local want="$1" what="$2"; shift 2
  local code; code="$(curl -s -o "$tmp/body" -w '%{http_code}' "$@")"
  [ "$code" = "$want" ] || fail "$what: expected $want, got $code: $(cat "$tmp/body")"
  if [ "$want" -ge 400 ]; then
    json_get 'd["error"]["message"]' <"$tmp/body" >"$tmp/msg" || fail "$what: not a JSON error: $(cat "$tmp/body")"
    echo "$what -> $code: $(cat "$tmp/msg")"
  fi
}
expect 401 "no token" "$base/healthz"
expect 401 "a wrong token" -H "Authorization: Bearer x$key" "$base/healthz"
expect 200 "the token" "${auth[@]}" "$base/healthz"
expect 403 "Host: attacker.example (DNS rebinding)" "${auth[@]}" -H "Host: attacker.example" "$base/healthz"
expect 403 "Origin: http://attacker.example" "${auth[@]}" -H "Origin: http://attacker.example" "$base/healthz"
expect 200 "Origin: http://localhost:3000 (allowed)" "${auth[@]}" -H "Origin: http://localhost:3000" "$base/healthz"
expect 415 "a text/plain POST (a form a page can send)" "${auth[@]}" -H "Content-Type: text/plain" \
  -X PUT -d '{"eviction":"lindy"}' "$base/v1/policy"
expect 415 "a form-encoded POST" "${auth[@]}" -d '{"eviction":"lindy"}' -X PUT "$base/v1/policy"
[ "$(curl -s --unix-socket "$sock" http://localhost/v1/policy | json_get 'd["eviction"]')" = lru ] || fail "a refused request changed the policy"
expect 200 "a JSON PUT" "${auth[@]}" -H "Content-Type: application/json" -X PUT -d '{"eviction":"lindy"}' "$base/v1/policy"
expect 200 "the Unix socket needs neither token nor JSON type" --unix-socket "$sock" -X PUT -d '{"eviction":"lru"}' \
  http://localhost/v1/policy
www="$(curl -s -D - -o /dev/null "$base/healthz" | tr -d '\r' | awk -F': ' 'tolower($1) == "www-authenticate" { print $2 }')"
[ "$www" = Bearer ] || fail "a 401 must carry WWW-Authenticate: Bearer, got '$www'"

# CORS (issue 23): a page on an allowed origin gets its preflight answered (without the key, which
# browsers do not send with it) and can read every reply; another origin's preflight is refused.
header() {  # NAME CURL-ARGS...: the value of a response header ("" when absent)
  local name="$1"; shift
  curl -s -D - -o /dev/null "$@" | tr -d '\r' | awk -F': ' -v n="$name" 'tolower($1) == tolower(n) { print $2 }'
}
preflight=(-X OPTIONS -H "Access-Control-Request-Method: POST" -H "Access-Control-Request-Headers: authorization, content-type")
expect 204 "a preflight from the allowed origin" "${preflight[@]}" -H "Origin: http://localhost:3000" "$base/v1/chat/completions"
[ "$(header Access-Control-Allow-Origin "${preflight[@]}" -H "Origin: http://localhost:3000" "$base/v1/chat/completions")" = \
  http://localhost:3000 ] || fail "the preflight does not allow the origin"
methods="$(header Access-Control-Allow-Methods "${preflight[@]}" -H "Origin: http://localhost:3000" "$base/v1/chat/completions")"
[[ "$methods" == *POST* ]] || fail "the preflight does not allow POST: '$methods'"
[ "$(header Access-Control-Allow-Headers "${preflight[@]}" -H "Origin: http://localhost:3000" "$base/v1/chat/completions")" = \
  "authorization, content-type" ] || fail "the preflight does not allow the headers asked for"
expect 403 "a preflight from another origin" "${preflight[@]}" -H "Origin: http://attacker.example" "$base/v1/chat/completions"
[ -z "$(header Access-Control-Allow-Origin "${preflight[@]}" -H "Origin: http://attacker.example" "$base/v1/chat/completions")" ] || \
  fail "a refused origin got Access-Control-Allow-Origin"
expect 403 "a preflight from the allowed origin naming another host" "${preflight[@]}" -H "Origin: http://localhost:3000" \
  -H "Host: attacker.example" "$base/v1/chat/completions"
[ "$(header Access-Control-Allow-Origin "${auth[@]}" -H "Origin: http://localhost:3000" "$base/healthz")" = http://localhost:3000 ] || \
  fail "a reply to the allowed origin lacks Access-Control-Allow-Origin"
[ "$(header Access-Control-Allow-Origin -H "Origin: http://localhost:3000" "$base/healthz")" = http://localhost:3000 ] || \
  fail "a 401 to the allowed origin lacks Access-Control-Allow-Origin (the page could not read why)"
[ "$(header Access-Control-Allow-Origin -N "${auth[@]}" -H "Origin: http://localhost:3000" -H "Content-Type: application/json" \
     -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":2,"stream":true}' "$base/v1/chat/completions")" = \
  http://localhost:3000 ] || fail "a stream to the allowed origin lacks Access-Control-Allow-Origin"
[ -z "$(header Access-Control-Allow-Origin "${auth[@]}" "$base/healthz")" ] || fail "a request without Origin got CORS headers"
expect 405 "OPTIONS without a preflight's header is an ordinary request" "${auth[@]}" -X OPTIONS "$base/v1/chat/completions"
stop

# --listen: the same listener from the command line (no key: the log says so; Host still checked).
port="$(free_port)"
start --listen "localhost:$port"
grep -q "and localhost:$port (TCP without server.api_key_file" "$tmp/log" || fail "--listen: no warning about the missing key"
expect 200 "--listen" "http://127.0.0.1:$port/healthz"
expect 403 "--listen, Host: attacker.example" -H "Host: attacker.example:$port" "http://127.0.0.1:$port/healthz"
stop

# Whole config values: each of these stops towerd with exit status 2 and a message naming the key.
refused_config() {  # WHAT EXPECTED-TEXT TOWERD-ARGS...
  local what="$1" text="$2"; shift 2
  local rc=0
  "$towerd" --model "$model" --socket "$sock" --state-dir "$state" "$@" 2>"$tmp/err" >/dev/null || rc=$?
  [ "$rc" = 2 ] || fail "$what: expected exit status 2, got $rc: $(cat "$tmp/err")"
  grep -q -- "$text" "$tmp/err" || fail "$what: expected '$text' in: $(cat "$tmp/err")"
  echo "$what -> $(cat "$tmp/err")"
}
printf '[server]\ntcp_listen = "127.0.0.1:99999"\n' >"$tmp/bad.toml"
refused_config "tcp_listen port 99999" "server.tcp_listen: the port must be a number from 1 to 65535" --config "$tmp/bad.toml"
refused_config "--listen 0.0.0.0:8080" "must be loopback" --listen 0.0.0.0:8080
refused_config "--listen 127.0.0.1:80x" "the port must be" --listen 127.0.0.1:80x
chmod 644 "$tmp/api.key"
printf '[server]\napi_key_file = "%s"\n' "$tmp/api.key" >"$tmp/bad.toml"
refused_config "a world-readable key file" "server.api_key_file: .*readable by every user" --config "$tmp/bad.toml"
printf '[server]\nallowed_origins = ["http://localhost:3000/app"]\n' >"$tmp/bad.toml"
refused_config "an origin with a path" "server.allowed_origins" --config "$tmp/bad.toml"
echo "edge TCP: OK"
