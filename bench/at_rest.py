#!/usr/bin/env python3
"""What a session at rest costs: N sessions of T turns each on stories260K, then every idle segment
coded cold (POST /v1/compress, idle_seconds 0); RAM (the cache trie, the token ids it holds, the
pool's records of the segments with their coded bytes) and disk (the record log and the segment
files) per session and per transcript token, before and after. Works on any towerd (fields an older
one does not report print as 0). docs/store.md, "The cold tier at rest", has the numbers.

    python3 bench/at_rest.py --towerd build/daemon/towerd [--sessions 200] [--turns 3]
"""
import argparse
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from towerd_client import call, rss_bytes, start_towerd, stop_towerd  # noqa: E402


def dir_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def measure(sock, p, state, sessions):
    pool = call(sock, "GET", "/v1/pool")
    log = os.path.getsize(os.path.join(state, "towerd.log"))
    segs = dir_bytes(os.path.join(state, "segments"))
    return {
        "trie_bytes": pool.get("trie_bytes", 0),
        "token_bytes": pool.get("token_bytes", 0),
        "entry_bytes": pool.get("entry_bytes", 0),
        "at_rest_segments": pool.get("at_rest", {}).get("segments", 0),
        "coded_bytes": pool.get("cold", {}).get("bytes", 0),
        "hot_bytes": pool["hot"]["bytes"],
        "log_bytes": log,
        "segment_file_bytes": segs,
        "rss_bytes": rss_bytes(p.pid),
        "segments": pool["segments"],
    }


def main():
    shared = os.environ.get("TOWERS_SHARED", os.path.join(os.path.dirname(__file__), "..", "..", "shared"))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--towerd", default="build/daemon/towerd")
    ap.add_argument("--model", default=os.path.join(shared, "models", "stories260K.gguf"))
    ap.add_argument("--sessions", type=int, default=200)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=48)
    a = ap.parse_args()
    if not os.path.exists(a.model):
        print("SKIP: %s not found (set TOWERS_SHARED)" % a.model)
        return 0
    tmp = tempfile.mkdtemp(prefix="at-rest.")
    p, sock = start_towerd(a.towerd, a.model, tmp)
    state = os.path.join(tmp, "state")
    try:
        call(sock, "PUT", "/v1/segments/plat", {"level": "platform", "text": "You are a storyteller."})
        call(sock, "PUT", "/v1/segments/bot", {"level": "bot", "parent": "plat", "text": "Tell short stories."})
        for i in range(a.sessions):
            sid = "s%d" % i
            call(sock, "POST", "/v1/sessions", {"bot": "bot", "id": sid})
            for t in range(a.turns):
                call(sock, "POST", "/v1/sessions/%s/messages" % sid,
                     {"content": "Story %d, part %d: once upon a time" % (i, t), "max_tokens": a.max_tokens,
                      "temperature": 0.8, "seed": i * 100 + t})
        tokens = sum(call(sock, "GET", "/v1/sessions/s%d" % i)["transcript_tokens"] for i in range(a.sessions))
        before = measure(sock, p, state, a.sessions)
        compressed = call(sock, "POST", "/v1/compress", {"idle_seconds": 0})
        after = measure(sock, p, state, a.sessions)
    finally:
        stop_towerd(p)
    n = a.sessions
    print("%d sessions x %d turns, %d transcript tokens (%.0f a session); %s segments coded" %
          (n, a.turns, tokens, tokens / n, compressed.get("compressed")))
    print("%-20s %14s %14s %12s %12s" % ("", "before", "after", "B/session", "B/token"))
    for k in before:
        if k == "segments":
            continue
        print("%-20s %14d %14d %12.1f %12.2f" % (k, before[k], after[k], after[k] / n, after[k] / max(tokens, 1)))
    ram = lambda m: m["trie_bytes"] + m["entry_bytes"]  # noqa: E731
    disk = lambda m: m["log_bytes"] + m["segment_file_bytes"]  # noqa: E731
    print("at_rest sessions=%d tokens=%d ram_before=%.1f ram_after=%.1f disk_before=%.1f disk_after=%.1f "
          "(bytes per session: trie + pool entries; record log + segment files)" %
          (n, tokens, ram(before) / n, ram(after) / n, disk(before) / n, disk(after) / n))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
