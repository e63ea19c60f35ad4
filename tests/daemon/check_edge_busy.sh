#!/usr/bin/env bash
# Handlers never wait for another request's model work (issue 12): while four clients keep the model
# busy with streamed generations, /healthz, /metrics, /v1/pool and the GETs of segments and sessions answer in
# under 10 ms (median of 20 each), and defining a segment (model work of its own, run between steps)
# answers in well under a second instead of after the generations. A client that disconnects,
# streamed or not, cancels its generation: it ends "cancelled", and ran at most one model step after
# towerd noticed (towerd_steps_after_cancel_max: the scheduler's own count, whatever the machine's
# speed; the scheduler looks at every client's socket before each step, so noticing takes at most one
# step once the client has closed). How many tokens it made before the client closed depends on how
# fast the client was, so it is printed, not checked.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
towerd_setup "$1" "$2" "$3"
command -v curl >/dev/null || { echo "SKIP: curl not installed"; exit 77; }
. "$(dirname "$0")/edge_lib.sh"
cp "$(dirname "$0")/http_probe.py" "$tmp/"
start
api() { curl -s --unix-socket "$sock" "$@"; }
api -X PUT http://localhost/v1/segments/plat -d '{"level":"platform","text":"You are a storyteller."}' >/dev/null
api -X PUT http://localhost/v1/segments/comm -d '{"level":"community","parent":"plat","text":"We like dragons."}' >/dev/null
api -X PUT http://localhost/v1/segments/bot -d '{"level":"bot","parent":"comm","text":"You are Bot."}' >/dev/null
api http://localhost/v1/sessions -d '{"bot":"bot","id":"s0"}' >/dev/null
# No end of sequence (token 2 of stories260K's vocabulary): the generation lasts until its context is
# full, so the client's disconnect comes first even on a machine busy with other work.
long='{"messages":[{"role":"user","content":"Tell me a long story"}],"max_tokens":1500,"temperature":1,"seed":SEED,"stream":true,"logit_bias":{"2":-100}}'
active() { api http://localhost/healthz | json_get 'd["active"]'; }
busy() { [ "$(active)" -ge 1 ]; }
idle() { [ "$(active)" = 0 ]; }

# Four clients keep the model busy, each streaming one generation after another until told to stop.
cat >"$tmp/load.py" <<'EOF'
import json, socket, sys, threading
stop = threading.Event()
done = [0] * 4
def client(i):
    body = json.dumps({"messages": [{"role": "user", "content": "Tell me a long story"}], "max_tokens": 500,
                       "temperature": 1, "seed": i, "stream": True}).encode()
    while not stop.is_set():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(sys.argv[1])
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        got = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
        s.close()
        if b"data: [DONE]" in got:
            done[i] += 1
threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
for t in threads: t.start()
sys.stdin.read()
stop.set()
for t in threads: t.join()
print("streams completed:", sum(done))
EOF
mkfifo "$tmp/load.ctl"
"$PY" "$tmp/load.py" "$sock" <"$tmp/load.ctl" >"$tmp/load.out" 2>&1 &
load_pid=$!
exec 4>"$tmp/load.ctl"
wait_for "the model busy" busy
for path in /healthz /metrics /v1/pool /v1/segments /v1/segments/plat /v1/sessions /v1/sessions/s0; do
  r="$(probe --count 20 --path "$path")"
  echo "model busy: GET $path $r"
  [ "$(echo "$r" | json_get 'all(s == "200" for s in d["statuses"])')" = True ] || fail "GET $path: $r"
  [ "$(echo "$r" | json_get 'd["median_ms"] < 10')" = True ] || fail "GET $path is slow while the model is busy: $r"
done
t="$(curl -s -o /dev/null -w '%{http_code} %{time_total}' --unix-socket "$sock" -X PUT http://localhost/v1/segments/plat2 \
      -d '{"level":"platform","text":"You are a poet who writes about the sea."}')"
echo "model busy: PUT /v1/segments/plat2 (a prefill of its own) -> $t s"
[ "${t%% *}" = 200 ] || fail "PUT /v1/segments/plat2: $t"
awk -v s="${t#* }" 'BEGIN { exit !(s < 1) }' || fail "defining a segment waited for the generations: $t s"
busy || fail "the model was idle by the end of the measurements; nothing was measured under load"
exec 4>&-
wait "$load_pid" || fail "the load clients failed: $(cat "$tmp/load.out")"
echo "model busy: $(cat "$tmp/load.out")"
grep -q "streams completed: [1-9]" "$tmp/load.out" || fail "no stream of the load completed"
wait_for "the model idle" idle

# Disconnects cancel: streamed (after the first token) and not streamed (right after sending).
cancelled() { metric 'towerd_generations_total{finish="cancelled"}'; }
for mode in stream whole; do
  c0="$(cancelled)"; p0="$(metric towerd_tokens_predicted_total)"
  "$PY" - "$sock" "$mode" "${long/SEED/9}" <<'EOF'
import json, socket, sys
path, mode, body = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
body["stream"] = mode == "stream"
data = json.dumps(body).encode()
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(path)
s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
          b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
if mode == "stream":
    got = b""
    while b'"content":"' not in got.split(b'"role":"assistant"', 1)[-1]:   # the first token's text
        chunk = s.recv(4096)
        if not chunk:
            sys.exit("the stream ended before its first token")
        got += chunk
s.close()
EOF
  wait_metric 'towerd_generations_total{finish="cancelled"}' $((c0 + 1))
  wait_for "the model idle" idle
  n=$(( $(metric towerd_tokens_predicted_total) - p0 ))
  after="$(metric towerd_steps_after_cancel_max)"
  echo "client gone ($mode): generation cancelled after $n tokens, $after model step(s) after towerd noticed"
  [ "$after" -le 1 ] || fail "a disconnected client's generation ran $after model steps after its disconnect was noticed"
done
[ "$(metric towerd_cancelled_sequences_total)" -ge 2 ] || fail "the cancelled sequences were not counted"
[ "$(metric towerd_http_client_disconnects_total)" -ge 2 ] || fail "client disconnects not counted"
stop
echo "edge busy: OK"
