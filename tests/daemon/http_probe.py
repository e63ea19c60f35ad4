#!/usr/bin/env python3
"""A well-behaved client that measures how long towerd takes to answer it.

  http_probe.py ADDRESS [--count N] [--path PATH] [--header 'Name: value' ...] [--timeout S]
Sends N requests (GET PATH, default /healthz), each on a new connection, one after the other, and
prints one JSON line: {"statuses": [...], "max_ms": ..., "median_ms": ...}. A request that gets no
answer within the timeout (default 5 s) counts as status "timeout" and as the timeout's latency.
"""
import argparse
import json
import socket
import statistics
import time


def request(address, path, headers, timeout):
    start = time.monotonic()
    try:
        if ":" in address and not address.startswith("/"):
            host, port = address.rsplit(":", 1)
            s = socket.create_connection((host, int(port)), timeout=timeout)
        else:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(timeout)
            s.connect(address)
        with s:
            head = "GET %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n" % path
            head += "".join(h + "\r\n" for h in headers)
            s.sendall((head + "\r\n").encode())
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        line = data.split(b"\r\n", 1)[0].split()
        status = line[1].decode() if len(line) > 1 else "empty"
    except socket.timeout:
        status = "timeout"
    except OSError as e:
        status = type(e).__name__
    return status, (time.monotonic() - start) * 1000


def main():
    p = argparse.ArgumentParser()
    p.add_argument("address")
    p.add_argument("--count", type=int, default=5)
    p.add_argument("--path", default="/healthz")
    p.add_argument("--header", action="append", default=[])
    p.add_argument("--timeout", type=float, default=5)
    a = p.parse_args()
    results = [request(a.address, a.path, a.header, a.timeout) for _ in range(a.count)]
    ms = [r[1] for r in results]
    print(json.dumps({"statuses": [r[0] for r in results], "max_ms": round(max(ms), 2),
                      "median_ms": round(statistics.median(ms), 2)}), flush=True)


if __name__ == "__main__":
    main()
