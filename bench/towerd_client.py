"""A client of towerd for the benchmarks in bench/ (python3's standard library only): HTTP over the
Unix socket, a streamed session turn that stamps each content chunk, starting a towerd of one's own,
percentiles."""
import http.client
import json
import os
import socket
import subprocess
import threading
import time


class HttpError(RuntimeError):
    """A reply other than 2xx: its status and Retry-After header (None when absent)."""

    def __init__(self, status, retry_after, message):
        super().__init__(message)
        self.status, self.retry_after = status, retry_after


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=900):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


def send(c, method, path, body):
    """Sends a request and returns the response. A towerd that refuses the connection (503 at its
    connection limit) answers and closes before reading the request, so sending may fail with a
    broken pipe while the answer is there to read: read it, as a browser or curl would."""
    try:
        c.request(method, path, body, {"Content-Type": "application/json"})
    except (BrokenPipeError, ConnectionResetError):
        pass
    return c.getresponse()


def call(sock, method, path, body=None, timeout=900):
    c = UnixHTTPConnection(sock, timeout)
    r = send(c, method, path, None if body is None else json.dumps(body))
    data = r.read()
    c.close()
    if r.status >= 300:
        raise HttpError(r.status, r.getheader("Retry-After"), "%s %s: %d %s" % (method, path, r.status, data[:300]))
    return json.loads(data) if data else None


class Stream(threading.Thread):
    """One streamed session turn (POST /v1/sessions/ID/messages). As it runs: `times` holds the arrival
    time of each content chunk. After: `status` (HTTP), `retry_after` (seconds, on 429), `usage`,
    `text`, `error` (None, or what went wrong), `start` and `end`. run() may be called directly."""

    def __init__(self, sock, session, content, max_tokens, temperature=0.0):
        super().__init__(daemon=True)
        self.sock, self.session, self.content = sock, session, content
        self.max_tokens, self.temperature = max_tokens, temperature
        self.times, self.usage, self.error, self.status, self.retry_after = [], None, None, None, None
        self.text, self.start_time, self.end = "", None, None

    def run(self):
        self.start_time = time.monotonic()
        try:
            c = UnixHTTPConnection(self.sock)
            body = {"content": self.content, "max_tokens": self.max_tokens, "temperature": self.temperature,
                    "stream": True, "stream_options": {"include_usage": True}}
            r = send(c, "POST", "/v1/sessions/%s/messages" % self.session, json.dumps(body))
            self.status = r.status
            if r.status != 200:
                self.retry_after = r.getheader("Retry-After")
                raise RuntimeError("%d %s" % (r.status, r.read()[:300]))
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                d = json.loads(line[6:])
                if "error" in d:
                    raise RuntimeError(str(d["error"]))
                if d.get("usage"):
                    self.usage = d["usage"]
                for ch in d.get("choices", []):
                    piece = ch.get("delta", {}).get("content")
                    if piece:
                        self.text += piece
                        self.times.append(time.monotonic())
            c.close()
            if self.usage is None:
                raise RuntimeError("the stream ended without its usage chunk")
        except Exception as e:  # the caller reads .error
            self.error = "session %s: %s" % (self.session, e)
        self.end = time.monotonic()


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


def start_towerd(towerd, model, tmp, threads=2, config="", extra_args=()):
    """Starts towerd on a socket in `tmp` (state in tmp/state, log in tmp/towerd.log) with `config` as
    its TOML; returns (process, socket path) once /healthz answers (bounded: 300 s)."""
    sock = os.path.join(tmp, "towerd.sock")
    conf = os.path.join(tmp, "towerd.toml")
    with open(conf, "w") as f:
        f.write(config)
    log = open(os.path.join(tmp, "towerd.log"), "a")
    p = subprocess.Popen([towerd, "--model", model, "--socket", sock, "--state-dir", os.path.join(tmp, "state"),
                          "--threads", str(threads), "--config", conf, *extra_args],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 300
    while True:  # bounded readiness poll
        try:
            call(sock, "GET", "/healthz")
            return p, sock
        except (OSError, RuntimeError):
            if p.poll() is not None or time.monotonic() > deadline:
                p.kill()
                raise RuntimeError("towerd did not start; see " + log.name)
            time.sleep(0.1)


def rss_bytes(pid):
    """The process's resident set (VmRSS), in bytes."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def stop_towerd(p, grace=60):
    """SIGTERM, then SIGKILL after `grace` seconds (a daemon that does not stop is itself a finding:
    the caller's log says so)."""
    p.terminate()
    try:
        return p.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        print("towerd did not stop within %d s of SIGTERM; killed" % grace, flush=True)
        p.kill()
        p.wait()
        return None
