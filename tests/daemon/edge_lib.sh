# Shared by the HTTP edge checks (sourced after lib.sh's towerd_setup):
#   PY                       a python3 (the system one when the first on PATH cannot be run by others)
#   edge_share               makes $tmp reachable by other uids and copies the python helpers there
#   wait_for DESC CMD...     polls CMD until it succeeds (10 s deadline; fails the test otherwise)
#   metric NAME              a sample of /metrics, e.g. metric 'towerd_http_timeouts_total{phase="header"}'
#   wait_metric NAME MIN     polls until the sample is >= MIN
#   flood_start MODE N [RUNNER...]   http_flood.py MODE N in the background (RUNNER: e.g. setpriv ...),
#                            returns once its connections are made and towerd has accepted them
#   flood_stop               ends it; sets $summary to its JSON summary line (not in a subshell:
#                            it closes the flood's stdin, which this shell holds)
#   probe ARGS...            http_probe.py on $sock (as root); prints its JSON line
#   json_get EXPR            evaluates EXPR on the JSON read from stdin (d = the object)
PY="$towers_python"
edge_share() {
  chmod 755 "$tmp" "$(dirname "$tmp")"
  cp "$(dirname "${BASH_SOURCE[0]}")/http_flood.py" "$(dirname "${BASH_SOURCE[0]}")/http_probe.py" "$tmp/"
  chmod 644 "$tmp"/http_*.py
}
wait_for() {
  local what="$1"; shift
  for _ in $(seq 200); do
    "$@" && return 0
    sleep 0.05
  done
  fail "timed out waiting for: $what"
}
metric() {
  curl -s --unix-socket "$sock" http://localhost/metrics | awk -v n="$1" '$1 == n { print $2; found = 1 } END { if (!found) print 0 }'
}
metric_at_least() { [ "$(metric "$1")" -ge "$2" ]; }
wait_metric() { wait_for "$1 >= $2" metric_at_least "$1" "$2"; }
flood_start() {
  local mode="$1" count="$2"; shift 2
  local before; before="$(metric towerd_http_connections_accepted_total)"
  rm -f "$tmp/ctl" "$tmp/flood.out"; mkfifo "$tmp/ctl"
  "$@" "$PY" "$tmp/http_flood.py" "$sock" "$mode" "$count" <"$tmp/ctl" >"$tmp/flood.out" 2>&1 &
  flood_pid=$!
  exec 3>"$tmp/ctl"
  wait_for "the flood's connections" grep -q '^ready' "$tmp/flood.out"
  local made; made="$(awk '/^ready/ { print $2 }' "$tmp/flood.out")"
  wait_metric towerd_http_connections_accepted_total "$((before + made))"
}
flood_stop() {
  exec 3>&-
  wait "$flood_pid" || fail "the flood helper failed: $(cat "$tmp/flood.out")"
  summary="$(tail -1 "$tmp/flood.out")"
}
probe() { "$PY" "$tmp/http_probe.py" "$sock" "$@"; }
json_get() { "$PY" -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
