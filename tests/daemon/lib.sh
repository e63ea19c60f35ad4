# Shared by the towerd end-to-end checks (sourced): a towerd with stories260K on a temporary socket
# and state dir, started and stopped by the script.
#   towerd_setup TOWERD SHARED TMP_ROOT   sets model, tmp, sock, state, pid; exits 77 without the model
#   start [towerd args...]                starts towerd, waits (bounded) until healthy() passes
#   stop                                  SIGTERM, and the exit status must be 0
#   fail MESSAGE                          prints it and the end of towerd's log, exits 1
#   api CURL_ARGS...                      curl on towerd's socket
#   json PY_EXPR                          evaluates PY_EXPR on the JSON read from stdin (as d)
#   python3 ARGS...                       Debian's /usr/bin/python3 when present (towers_python)
#   node_checks FILE.mjs                  sets npm_dir ($tmp/npm) holding FILE.mjs and node_client.mjs;
#                                         exits 77 without node, npm or curl
# healthy() asks /healthz with curl; a script may redefine it (check_towerctl.sh uses towerctl).
towerd_setup() {
  towerd="$1"; shared="${TOWERS_SHARED:-$2}"; local tmp_root="$3"
  model="$shared/models/stories260K.gguf"
  [ -f "$model" ] || { echo "SKIP: $model not found (set TOWERS_SHARED)"; exit 77; }
  mkdir -p "$tmp_root"; tmp="$(mktemp -d "$tmp_root/towerd.XXXXXX")"
  sock="$tmp/towerd.sock"; state="$tmp/state"; pid=""
  trap cleanup EXIT
}
cleanup() { [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$tmp"; }
fail() { echo "FAIL: $*"; echo "--- towerd log:"; tail -20 "$tmp/log" || true; exit 1; }
api() { curl -s --unix-socket "$sock" "$@"; }
# The checks call Python hundreds of times and need only its standard library: Debian's interpreter
# starts in 0.04 s, a version manager's shim (pyenv, as on CI's machines) in 0.4 s, a minute and more
# of a run.
towers_python=/usr/bin/python3
[ -x "$towers_python" ] || towers_python="$(command -v python3 || echo python3)"
python3() { "$towers_python" "$@"; }
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
healthy() { curl -sf --unix-socket "$sock" http://localhost/healthz >/dev/null 2>&1; }
start() {
  "$towerd" --model "$model" --socket "$sock" --state-dir "$state" --threads 2 "$@" 2>>"$tmp/log" & pid=$!
  for _ in $(seq 100); do   # bounded readiness poll
    healthy && return 0
    kill -0 "$pid" 2>/dev/null || fail "towerd exited during start"
    sleep 0.1
  done
  fail "towerd not ready after 10 s"
}
stop() { kill -TERM "$pid"; wait "$pid" || fail "towerd exited with $? on SIGTERM"; pid=""; }
node_checks() {
  command -v node >/dev/null && command -v npm >/dev/null || { echo "SKIP: node and npm are needed (apt-get install nodejs npm)"; exit 77; }
  command -v curl >/dev/null || { echo "SKIP: curl not installed"; exit 77; }
  npm_dir="$tmp/npm"
  mkdir -p "$npm_dir"
  cp "$(dirname "${BASH_SOURCE[0]}")/$1" "$(dirname "${BASH_SOURCE[0]}")/node_client.mjs" "$npm_dir/"
}
