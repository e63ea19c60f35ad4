#!/usr/bin/env python3
"""Holds many connections to towerd the way a hostile local user would, until stdin closes.

  http_flood.py ADDRESS MODE COUNT
    ADDRESS  a Unix socket path, or HOST:PORT
    MODE     idle       connect and send nothing
             slowloris  send the start of a request header and never finish it
             request    send a whole GET /healthz and do not read the answer
Prints "ready N" (N connections made) once every connect returned, then waits for EOF on stdin
and prints one JSON line: how each connection ended (an HTTP status it was answered with, "closed"
without an answer, or "open" still) and "reset" if any answer was cut by a reset.
"""
import json
import socket
import sys

PARTIAL = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n"
WHOLE = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"


def connect(address):
    if ":" in address and not address.startswith("/"):
        host, port = address.rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=5)
    else:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(address)
    return s


def outcome(s):
    """What the server did with this connection so far, without waiting."""
    s.setblocking(False)
    data = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except BlockingIOError:
        if not data:
            return "open"
    except ConnectionResetError:
        return "reset" if not data else status_of(data)
    return status_of(data) if data else "closed"


def status_of(data):
    line = data.split(b"\r\n", 1)[0].split()
    return line[1].decode() if len(line) > 1 and line[0].startswith(b"HTTP/") else "garbage"


def main():
    address, mode, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    payload = {"idle": b"", "slowloris": PARTIAL, "request": WHOLE}[mode]
    conns, failed = [], 0
    for _ in range(count):
        try:
            s = connect(address)
            if payload:
                s.sendall(payload)
            conns.append(s)
        except OSError:
            failed += 1
    print("ready", len(conns), flush=True)
    sys.stdin.read()
    counts = {}
    for s in conns:
        o = outcome(s)
        counts[o] = counts.get(o, 0) + 1
        s.close()
    if failed:
        counts["connect_failed"] = failed
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()
