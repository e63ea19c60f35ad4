#!/usr/bin/env python3
"""A well-behaved client that measures how long towerd takes to answer it.

  http_probe.py ADDRESS [--count N] [--path PATH] [--header 'Name: value' ...] [--timeout S]
                       [--show-header NAME]
Sends N requests (GET PATH, default /healthz), each on a new connection, one after the other, and
prints one JSON line: {"statuses": [...], "max_ms": ..., "median_ms": ...} (with --show-header,
also "headers": that header's value in each answer). A request that gets no answer within the
timeout (default 5 s) counts as status "timeout" and as the timeout's latency; a connection the
server refused or reset counts as the error's name.
"""
import argparse
import json
import socket
import statistics
import time


def header_value(data, name):
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == name.lower().encode():
            return v.strip().decode()
    return None


def request(address, path, headers, timeout, show):
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
        shown = header_value(data, show) if show else None
    except socket.timeout:
        status, shown = "timeout", None
    except OSError as e:
        status, shown = type(e).__name__, None
    return status, (time.monotonic() - start) * 1000, shown


def main():
    p = argparse.ArgumentParser()
    p.add_argument("address")
    p.add_argument("--count", type=int, default=5)
    p.add_argument("--path", default="/healthz")
    p.add_argument("--header", action="append", default=[])
    p.add_argument("--timeout", type=float, default=5)
    p.add_argument("--show-header")
    a = p.parse_args()
    results = [request(a.address, a.path, a.header, a.timeout, a.show_header) for _ in range(a.count)]
    ms = [r[1] for r in results]
    out = {"statuses": [r[0] for r in results], "max_ms": round(max(ms), 2), "median_ms": round(statistics.median(ms), 2)}
    if a.show_header:
        out["headers"] = [r[2] for r in results]
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
