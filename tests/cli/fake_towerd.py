#!/usr/bin/env python3
"""A stand-in for towerd's chat endpoint, for towerctl chat's client-side checks.

fake_towerd.py SOCKET LOG: serves HTTP/1.1 on a Unix socket, one request per connection.
  GET /healthz                -> {"status": "ok"}
  POST /v1/chat/completions   -> the last user message decides:
      "long"     streams one chunk "partial", then waits (at most 60 s) for the client to hang up
      "fail"     400 with a towerd-style JSON error
      otherwise  streams "echo: <message>" in two chunks, usage, [DONE]
Each request is one JSON line in LOG ({"method", "path", "body"}); a client that hung up during
"long" adds {"event": "client closed"}.
"""
import json
import os
import select
import socket
import sys


def log(path, obj):
    with open(path, "a") as f:
        f.write(json.dumps(obj) + "\n")


def read_request(conn):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    while len(body) < length:
        body += conn.recv(65536)
    return method, path, body.decode()


def send(conn, status, content_type, body):
    conn.sendall((f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
                  "Connection: close\r\n\r\n").encode() + body.encode())


def event(conn, obj):
    data = obj if isinstance(obj, str) else json.dumps(obj)
    payload = f"data: {data}\n\n".encode()
    conn.sendall(f"{len(payload):x}\r\n".encode() + payload + b"\r\n")


def delta(text):
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


def serve(conn, log_path):
    req = read_request(conn)
    if req is None:
        return
    method, path, body = req
    log(log_path, {"method": method, "path": path, "body": json.loads(body) if body else None})
    if path == "/healthz":
        return send(conn, "200 OK", "application/json", '{"status":"ok"}')
    if path != "/v1/chat/completions":
        return send(conn, "404 Not Found", "application/json", '{"error":{"message":"no such endpoint"}}')
    last = json.loads(body)["messages"][-1]["content"]
    if last == "fail":
        return send(conn, "400 Bad Request", "application/json",
                    '{"error":{"message":"the fake refuses this","type":"invalid_request_error"}}')
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                 b"Connection: close\r\n\r\n")
    if last == "long":
        event(conn, delta("partial"))
        readable, _, _ = select.select([conn], [], [], 60)
        if readable and conn.recv(1) == b"":
            log(log_path, {"event": "client closed"})
        return
    event(conn, delta("echo: "))
    event(conn, delta(last))
    event(conn, {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                 "usage": {"prompt_tokens": 3, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 0}}})
    event(conn, "[DONE]")
    conn.sendall(b"0\r\n\r\n")


def main():
    sock_path, log_path = sys.argv[1], sys.argv[2]
    if os.path.exists(sock_path):
        os.unlink(sock_path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(sock_path)
    server.listen(8)
    while True:
        conn, _ = server.accept()
        with conn:
            try:
                serve(conn, log_path)
            except (BrokenPipeError, ConnectionResetError):
                log(log_path, {"event": "client closed"})


if __name__ == "__main__":
    main()
