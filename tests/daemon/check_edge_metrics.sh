#!/usr/bin/env bash
# /metrics survives hostile callers and parses (issue 13 item 5): after requests with quotes,
# backslashes, encoded newlines, 300 distinct unknown paths and invented methods, the exposition is
# read by a real parser (python3-prometheus-client's text_string_to_metric_families), the request
# counters have a bounded set of label series, counters are integers, histograms (request duration,
# time to first token, inter-token latency) have their buckets, _sum and _count, and the token
# counters match what the generations reported.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
towerd_setup "$1" "$2" "$3"
command -v curl >/dev/null || { echo "SKIP: curl not installed"; exit 77; }
. "$(dirname "$0")/edge_lib.sh"
for py in /usr/bin/python3 python3; do
  "$py" -c 'import prometheus_client' 2>/dev/null && { PY="$py"; break; }
done
"$PY" -c 'import prometheus_client' 2>/dev/null || { echo "SKIP: python3-prometheus-client not installed"; exit 77; }
start
api() { curl -s --unix-socket "$sock" "$@"; }

# Two generations, their usage recorded for the token counters.
for i in 1 2; do
  api http://localhost/v1/chat/completions -d "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell story $i\"}],\"max_tokens\":24,\"temperature\":0}" \
    | json_get 'd["usage"]["prompt_tokens"], d["usage"]["completion_tokens"]' >>"$tmp/usage"
done
# Hostile callers: raw bytes in the request line, and many distinct unknown paths.
"$PY" - "$sock" <<'EOF'
import socket, sys
def raw(line):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sys.argv[1])
    s.sendall(line + b"\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    while s.recv(65536):
        pass
    s.close()
for line in (b'GET /v1/"quoted"\\back HTTP/1.1', b"GET /a%0Ab%22c HTTP/1.1", b"BREW /v1/pot HTTP/1.1",
             b"GET /v1/sessions/x%22y/messages HTTP/1.1", b'GET /metrics"} 1\n HTTP/1.1'):
    raw(line)
for i in range(300):
    raw(b"GET /nothing/%d HTTP/1.1" % i)
EOF
api http://localhost/metrics >"$tmp/metrics"
"$PY" - "$tmp/metrics" "$tmp/usage" <<'EOF'
import re, sys
from prometheus_client.parser import text_string_to_metric_families
text = open(sys.argv[1]).read()
families = {f.name: f for f in text_string_to_metric_families(text)}
def fail(msg):
    print("FAIL:", msg); sys.exit(1)
# Route and method labels are bounded: 300 unknown paths are one "other" series per method/status.
series = [s for s in families["towerd_requests"].samples if s.name == "towerd_requests_total"]
routes = {s.labels["route"] for s in series}
if len(series) > 12: fail("request counters have %d series: %s" % (len(series), sorted(routes)))
other = sum(s.value for s in series if s.labels["route"] == "other")
if other < 300: fail("the unknown paths were not counted under route=\"other\" (%d)" % other)
if not {s.labels["method"] for s in series} <= {"GET", "POST", "PUT", "DELETE", "HEAD", "other"}: fail("method labels")
# Counters print as integers, never 1.23e+06.
for line in text.splitlines():
    if re.match(r"^towerd_\w+_total(\{.*\})? ", line) and not re.search(r" \d+$", line):
        fail("counter not printed as an integer: " + line)
# Histograms: buckets up to +Inf, _sum, _count; the request histogram by route.
for name in ("towerd_request_duration_seconds", "towerd_time_to_first_token_seconds", "towerd_inter_token_latency_seconds"):
    f = families.get(name)
    if f is None or f.type != "histogram": fail(name + " is not a histogram")
    kinds = {s.name[len(name):] for s in f.samples}
    if kinds != {"_bucket", "_sum", "_count"}: fail(name + " has " + str(kinds))
    if not any(s.labels.get("le") == "+Inf" for s in f.samples): fail(name + " lacks le=+Inf")
    if sum(s.value for s in f.samples if s.name == name + "_count") == 0: fail(name + " observed nothing")
# Token counters agree with the generations' usage.
usage = [tuple(map(int, l.split())) for l in open(sys.argv[2])]
def value(name):
    return next(s.value for f in families.values() for s in f.samples if s.name == name)
if value("towerd_prompt_tokens_total") != sum(u[0] for u in usage): fail("prompt tokens")
if value("towerd_tokens_predicted_total") != sum(u[1] for u in usage): fail("predicted tokens")
for name in ("towerd_kv_bytes", "towerd_sessions", "towerd_queue_length", "towerd_http_connections"):
    if name not in families: fail(name + " missing")
print("metrics: %d families parsed; %d request series for %d distinct routes; tokens %s" %
      (len(families), len(series), len(routes), usage))
EOF
stop
echo "edge metrics: OK"
