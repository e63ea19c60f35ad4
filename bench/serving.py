#!/usr/bin/env python3
"""Serving under load: the goals of issue 12, measured against a towerd this script starts.

  bench/serving.py --towerd build/daemon/towerd --towerctl build/cli/towerctl --model M.gguf
                   [--threads 2] [--streams 8] [--gen 256] [--put-words 2000] [--probes 5]

With the model and thread count given, in one run:
  1. baseline   `towerctl bench --batch STREAMS` (no daemon running): aggregate decode tok/s of
                STREAMS sequences in one model step, the best the scheduler could do.
  2. streams    STREAMS streamed chat sessions on different bots, each GEN tokens at temperature 0:
                aggregate decode tok/s while all of them decode, inter-token latency (ITL) p50/p99
                (gaps between content chunks of one stream).
  3. put        the same streams, and once they all decode, a segment PUT of PUT_WORDS words
                (~1 token each) — model work of its own, scheduled in prefill chunks beside the
                decodes: ITL p99 of the streams while the PUT runs, against step 2.
  4. ttft       the same streams, and PROBES new sessions on an existing bot, one after another,
                each asking for one token: time to first token p50/p99.
  5. storm      the same streams, and STORM session creations sent at once (each a durable record):
                ITL p99 while they run, against step 2.
  6. compact    the same streams, and sessions created and deleted until the state log (its
                `[state] compact_bytes` set to 64K here) is compacted: ITL p99 until towerd's log says
                "compacted the state log", against step 2.
Prints a table and, last, exactly one line:
  serving streams=S agg_tps=A baseline_tps=B agg_ratio=R itl_p99_ms=I itl_p99_put_ms=P put_ratio=Q ttft_p50_ms=T storm_ratio=U compact_ratio=V
Goals (issue 12): agg_ratio >= 0.8, put_ratio <= 2, ttft_p50_ms < 300; (issue 25: the catalog never
holds its lock across a disk write) put_ratio, storm_ratio and compact_ratio <= 1.5.
Needs only python3's standard library; the daemon runs on a Unix socket in a temporary directory.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from towerd_client import Stream, call, pct, start_towerd, stop_towerd  # noqa: E402


def words(n, seed):
    vocab = ["the", "cat", "sat", "on", "a", "mat", "and", "looked", "at", "sky", "while", "birds", "sang", "songs"]
    return " ".join(vocab[(i * 7 + seed * 13 + i // 5) % len(vocab)] for i in range(n))


def gaps(streams, t0, t1):
    """Inter-chunk gaps (ms) of every stream that overlap [t0, t1]. Overlap, not containment: a phase
    shorter than one gap (100 session creations take ~0.13 s, a gap ~0.16 s) is inside the gaps it
    could delay, and containment would count none of them."""
    g = []
    for s in streams:
        g += [(b - a) * 1000 for a, b in zip(s.times, s.times[1:]) if b >= t0 and a <= t1]
    return g


def with_streams(sock, n, gen, tag, during=None):
    """n concurrent streams (sessions s-TAG-i on bots b0..b(n-1)). Once every stream has its first chunk,
    `during()` runs (its result and [start, end] are returned). Then all streams are awaited."""
    streams = []
    for i in range(n):
        sid = "s-%s-%d" % (tag, i)
        call(sock, "POST", "/v1/sessions", {"bot": "b%d" % i, "id": sid})
        streams.append(Stream(sock, sid, "Tell me a long story about number %d." % i, gen))
    for s in streams:
        s.start()
    deadline = time.monotonic() + 600
    while not all(s.times or s.end for s in streams):  # bounded poll: every stream decoding
        if time.monotonic() > deadline:
            raise RuntimeError("streams did not start within 600 s")
        time.sleep(0.005)
    t_all = time.monotonic()
    result, t0, t1 = None, t_all, t_all
    if during:
        t0 = time.monotonic()
        result = during()
        t1 = time.monotonic()
    for s in streams:
        s.join()
        if s.error:
            raise RuntimeError(s.error)
    return streams, t_all, result, (t0, t1)


def baseline(a):
    out = subprocess.run([a.towerctl, "bench", "--model", a.model, "--threads", str(a.threads), "--prompt", "16",
                          "--gen", "32", "--runs", "3", "--batch", str(a.streams)],
                         check=True, capture_output=True, text=True).stdout
    m = re.search(r"\btg=([0-9.]+)", out)
    if not m:
        raise RuntimeError("towerctl bench printed no tg=: " + out[-300:])
    return float(m.group(1))


def measure(a):
    base = baseline(a)
    print("baseline: towerctl bench --batch %d: %.1f tok/s" % (a.streams, base), flush=True)
    tmp = tempfile.mkdtemp(prefix="towers-serving.")
    p = None
    try:
        # Room for the streams and one more (the TTFT probes), whatever the default max_batch is.
        config = ("[limits]\nmax_batch = %d\nmax_sessions = 100000\n[cold]\nenabled = false\n[state]\ncompact_bytes = \"64K\"\n"
                  % (a.streams + 1))
        p, sock = start_towerd(a.towerd, a.model, tmp, a.threads, config)
        call(sock, "PUT", "/v1/segments/plat", {"level": "platform", "text": "You are a helpful storyteller."})
        for i in range(a.streams + 1):
            call(sock, "PUT", "/v1/segments/b%d" % i, {"level": "bot", "parent": "plat", "text": "You are bot %d. " % i + words(40, i)})

        streams, t_all, _, _ = with_streams(sock, a.streams, a.gen, "plain")
        t_done = min(s.times[-1] for s in streams)
        tokens = 0.0
        for s in streams:
            per_chunk = s.usage["completion_tokens"] / max(1, len(s.times))
            tokens += per_chunk * sum(1 for t in s.times if t_all <= t <= t_done)
        agg = tokens / max(1e-9, t_done - t_all)
        itl = gaps(streams, t_all, t_done)
        print("streams: %d x %d tokens: aggregate %.1f tok/s (%.2f x baseline), ITL p50 %.1f ms p99 %.1f ms"
              % (a.streams, a.gen, agg, agg / base, pct(itl, 50), pct(itl, 99)), flush=True)

        text = words(a.put_words, 99)
        put = lambda: call(sock, "PUT", "/v1/segments/big", {"level": "bot", "parent": "plat", "text": text})  # noqa: E731
        streams2, _, info, (t0, t1) = with_streams(sock, a.streams, a.gen, "put", put)
        itl_put = gaps(streams2, t0, t1)
        put_tokens = info.get("tokens", "?") if isinstance(info, dict) else "?"
        print("put: a %s-token segment PUT took %.1f s beside the streams; ITL while it ran: p50 %.1f ms p99 %.1f ms (%d gaps)"
              % (put_tokens, t1 - t0, pct(itl_put, 50), pct(itl_put, 99), len(itl_put)), flush=True)

        def probes():
            ttft = []
            for k in range(a.probes):
                sid = "probe-%d" % k
                call(sock, "POST", "/v1/sessions", {"bot": "b%d" % a.streams, "id": sid})
                s = Stream(sock, sid, "Hello there.", 1)
                t = time.monotonic()
                s.run()
                if s.error:
                    raise RuntimeError(s.error)
                ttft.append(((s.times[0] if s.times else s.end) - t) * 1000)
            return ttft
        _, _, ttft, _ = with_streams(sock, a.streams, a.gen, "ttft", probes)
        print("ttft: new session on an existing bot with %d streams decoding: p50 %.0f ms p99 %.0f ms (%d probes)"
              % (a.streams, pct(ttft, 50), pct(ttft, 99), len(ttft)), flush=True)
        def storm():
            errors = []

            def create(k):
                try:
                    call(sock, "POST", "/v1/sessions", {"bot": "b0", "id": "storm-%d" % k})
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(str(e))
            threads = [threading.Thread(target=create, args=(k,)) for k in range(a.storm)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if errors:
                raise RuntimeError("%d of %d session creations failed: %s" % (len(errors), a.storm, errors[0]))
        streams3, _, _, (t0, t1) = with_streams(sock, a.streams, a.gen, "storm", storm)
        itl_storm = gaps(streams3, t0, t1)
        print("storm: %d session creations at once took %.2f s beside the streams; ITL p50 %.1f ms p99 %.1f ms (%d gaps)"
              % (a.storm, t1 - t0, pct(itl_storm, 50), pct(itl_storm, 99), len(itl_storm)), flush=True)

        towerd_log = os.path.join(tmp, "towerd.log")

        def compactions():
            with open(towerd_log, errors="replace") as f:
                return f.read().count("compacted the state log")

        def churn_until_compacted():
            before, k = compactions(), 0
            while compactions() == before:  # bounded: towerd compacts on its periodic tick
                if k >= 20000:
                    raise RuntimeError("no compaction after %d session create/delete pairs" % k)
                sid = "churn-%d" % k
                call(sock, "POST", "/v1/sessions", {"bot": "b0", "id": sid})
                call(sock, "DELETE", "/v1/sessions/" + sid)
                k += 1
            return k
        streams4, _, churned, (t0, t1) = with_streams(sock, a.streams, a.gen, "compact", churn_until_compacted)
        itl_compact = gaps(streams4, t0, t1)
        print("compact: %d session create/delete pairs until a compaction, %.2f s beside the streams; ITL p50 %.1f ms "
              "p99 %.1f ms (%d gaps)" % (churned, t1 - t0, pct(itl_compact, 50), pct(itl_compact, 99), len(itl_compact)),
              flush=True)

        base_p99 = pct(itl, 99)
        print("serving streams=%d agg_tps=%.1f baseline_tps=%.1f agg_ratio=%.2f itl_p99_ms=%.1f itl_p99_put_ms=%.1f "
              "put_ratio=%.2f ttft_p50_ms=%.0f storm_ratio=%.2f compact_ratio=%.2f"
              % (a.streams, agg, base, agg / base, base_p99, pct(itl_put, 99), pct(itl_put, 99) / base_p99,
                 pct(ttft, 50), pct(itl_storm, 99) / base_p99, pct(itl_compact, 99) / base_p99), flush=True)
        return 0
    finally:
        if p:
            stop_towerd(p)
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--towerd", required=True)
    ap.add_argument("--towerctl", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--gen", type=int, default=256)
    ap.add_argument("--put-words", type=int, default=2000)
    ap.add_argument("--probes", type=int, default=5)
    ap.add_argument("--storm", type=int, default=100, help="session creations sent at once in the storm phase")
    a = ap.parse_args()
    raise SystemExit(measure(a))


if __name__ == "__main__":
    main()
