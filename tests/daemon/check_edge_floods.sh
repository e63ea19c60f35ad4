#!/usr/bin/env bash
# Connections cannot be hoarded (issue 12 item 6). Another local user ("nobody", allowed by
# server.allowed_uids) floods towerd's socket while a normal client (root) measures its latency:
#   (1) 256 idle connections            (2) 256 unfinished request headers (slowloris)
#   (3) 256 connections from a uid that is refused
#   (4) the header deadline: a header trickled line by line, and a silent connection, are closed
#   (5) under ulimit -n 64: the connection limit shrinks to fit, the flood cannot take every slot,
#       and towerd does not spin; (6) with descriptors scarcer still, accept runs out of them and
#       makes room or pauses instead of spinning
# Each time the normal client must be answered within 1 s. The flooding uid gets at most its
# per-uid share; beyond it, its requests are read and answered 503 (refused uids: 403), not reset.
# Needs root (setpriv to other uids); skips otherwise.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
root="$(mktemp -d /tmp/towerd-edge.XXXXXX)"
towerd_setup "$1" "$2" "$root"
trap 'cleanup; rm -rf "$root"' EXIT
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root (runs flooding clients under other uids with setpriv)"; exit 77; }
command -v setpriv >/dev/null || { echo "SKIP: setpriv not installed"; exit 77; }
. "$(dirname "$0")/edge_lib.sh"
edge_share
nobody=(setpriv --reuid=65534 --regid=65534 --clear-groups)
stranger=(setpriv --reuid=65533 --regid=65533 --clear-groups)   # not allowed
per_uid=64

# served_fast LABEL: five requests of the normal client, each answered 200 within 1 s.
served_fast() {
  local r; r="$(probe --count 5)"
  echo "$1: normal client $r"
  [ "$(echo "$r" | json_get 'all(s == "200" for s in d["statuses"])')" = True ] || fail "$1: normal client not served: $r"
  [ "$(echo "$r" | json_get 'd["max_ms"] < 1000')" = True ] || fail "$1: normal client waited over 1 s: $r"
}
# flood_held SUMMARY: the flood kept at most the per-uid share of connections, plus the few (8)
# whose refusal is under way (their request header is awaited for 2 s, then answered 503).
flood_held() {
  echo "$1" | json_get "d.get('open', 0) <= $per_uid + 8" | grep -q True || fail "the flood holds more than its share: $1"
}

cat >"$tmp/towerd.toml" <<EOF
[server]
socket_mode = "0666"
allowed_uids = [65534]
EOF
start --config "$tmp/towerd.toml"

# (1) idle flood
flood_start idle 256 "${nobody[@]}"
served_fast "idle flood"
flood_stop; echo "idle flood: $summary"; flood_held "$summary"

# (2) slowloris; then, with exactly its share of unfinished headers held, the flooding uid's next
# requests are read and answered 503 + Retry-After.
flood_start slowloris 256 "${nobody[@]}"
served_fast "slowloris"
flood_stop; echo "slowloris: $summary"; flood_held "$summary"
flood_start slowloris "$per_uid" "${nobody[@]}"
r="$("${nobody[@]}" "$PY" "$tmp/http_probe.py" "$sock" --count 2 --show-header Retry-After)"
echo "slowloris: the flooding uid's own requests: $r"
[ "$(echo "$r" | json_get 'd["statuses"], d["headers"]')" = "['503', '503'] ['1', '1']" ] || fail "the flooding uid should read 503 + Retry-After, got $r"
flood_stop; echo "slowloris at the per-uid share: $summary"
echo "$summary" | json_get "d.get('open', 0) == $per_uid" | grep -q True || fail "the flood's $per_uid connections were not all held: $summary"

# (3) a refused uid: its request is read and answered 403; a flood of them is never admitted
r="$("${stranger[@]}" "$PY" "$tmp/http_probe.py" "$sock" --count 1)"
[ "$(echo "$r" | json_get 'd["statuses"]')" = "['403']" ] || fail "a refused uid should read a 403, got $r"
refused0="$(metric 'towerd_http_connections_refused_total{reason="peer"}')"
flood_start request 256 "${stranger[@]}"
served_fast "refused-uid flood"
flood_stop; echo "refused-uid flood: $summary"
echo "$summary" | json_get "d.get('200', 0) == 0 and d.get('open', 0) == 0" | grep -q True || fail "a refused uid was served or held a connection: $summary"
[ "$(metric 'towerd_http_connections_refused_total{reason="peer"}')" -ge $((refused0 + 256)) ] || fail "refused connections not counted"
stop

# (4) the header deadline (2 s here): trickling a header line every 0.3 s does not extend it; a
# connection that sends nothing is closed by it too.
cat >"$tmp/towerd.toml" <<EOF
[server]
header_timeout_seconds = 2
EOF
start --config "$tmp/towerd.toml"
"$PY" - "$sock" <<'EOF' || fail "header deadline"
import socket, sys, time
def lifetime(trickle):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sys.argv[1])
    t0 = time.monotonic()
    s.settimeout(0.3)
    if trickle:
        s.sendall(b"GET /healthz HTTP/1.1\r\n")
    while time.monotonic() - t0 < 10:
        try:
            if trickle:
                s.sendall(b"X-Slow: 1\r\n")      # the attacker's pace, one line per 0.3 s
            if s.recv(1) == b"":
                break
        except socket.timeout:
            continue
        except OSError:
            break
    return time.monotonic() - t0
for what, trickle in (("trickled header", True), ("silent connection", False)):
    t = lifetime(trickle)
    print("%s closed after %.2f s (header_timeout_seconds = 2)" % (what, t))
    assert 1.5 < t < 4, what
EOF
[ "$(metric 'towerd_http_timeouts_total{phase="header"}')" -ge 2 ] || fail "header timeouts not counted"
stop

# (5) fd exhaustion: under ulimit -n 64 the connection limit shrinks to fit; then (6) with just 7
# descriptors above what an idle towerd holds, accept does run out of them: it closes an idle
# connection or a refusal, or pauses; the normal client is still served and towerd does not spin.
real_towerd="$towerd"
start_with_ulimit() {
  printf '#!/bin/sh\nulimit -n %s\nexec "%s" "$@"\n' "$1" "$real_towerd" >"$tmp/towerd-ulimit"
  chmod +x "$tmp/towerd-ulimit"
  towerd="$tmp/towerd-ulimit"
  start --config "$tmp/towerd.toml"
  towerd="$real_towerd"
}
cpu_during_flood() {  # prints the percentage of one core towerd used over one second
  local t0 t1
  t0="$(awk '{ print $14 + $15 }' "/proc/$pid/stat")"; sleep 1   # a measuring window, not a synchronisation
  t1="$(awk '{ print $14 + $15 }' "/proc/$pid/stat")"
  echo $(( (t1 - t0) * 100 / $(getconf CLK_TCK) ))
}
cat >"$tmp/towerd.toml" <<EOF
[server]
socket_mode = "0666"
allowed_uids = [65534]
EOF
start_with_ulimit 64
grep -q "lowered to" "$tmp/log" || fail "the connection limit was not fitted to ulimit -n 64"
limit="$(metric towerd_http_connection_limit)"
per_uid=$((limit - limit / 4))
idle_fds="$(ls "/proc/$pid/fd" | wc -l)"
flood_start slowloris 200 "${nobody[@]}"
served_fast "ulimit -n 64, slowloris flood"
cpu="$(cpu_during_flood)"
echo "ulimit -n 64: limit $limit connections ($per_uid per uid), towerd at ${cpu}% of a core while the flood held"
[ "$cpu" -lt 20 ] || fail "towerd spins under the flood: ${cpu}% CPU"
flood_stop; echo "ulimit -n 64: $summary"; flood_held "$summary"
stop

start_with_ulimit $((idle_fds + 7))
flood_start slowloris 200 "${nobody[@]}"
served_fast "ulimit -n $((idle_fds + 7)), slowloris flood"
cpu="$(cpu_during_flood)"
exhausted="$(metric towerd_http_accept_fd_exhausted_total)"
echo "ulimit -n $((idle_fds + 7)): $exhausted accepts ran out of descriptors; towerd at ${cpu}% of a core"
[ "$exhausted" -gt 0 ] || fail "accept never ran out of descriptors: the scenario did not happen"
[ "$cpu" -lt 20 ] || fail "towerd spins out of descriptors: ${cpu}% CPU"
flood_stop; echo "ulimit -n $((idle_fds + 7)): $summary"
served_fast "after the flood"
stop
echo "edge floods: OK"
