#!/usr/bin/env python3
"""What an operator's edit of the platform prompt costs (issue 16's baseline, and its goal when modular
placement lands).

  bench/edit.py --towerd build/daemon/towerd --model M.gguf [--threads 2] [--bots 12] [--bot-words 500]
                [--platform-words 200] [--runs 3]

On a towerd this script starts: a platform of PLATFORM_WORDS words, BOTS bots of BOT_WORDS words under it,
each bot used once by a session (so all of them are computed). Then, RUNS times: the platform's text is
edited (one sentence changed), and it measures
  edit_ms          the PUT of the new platform text (towerd answers once the platform is computed)
  first_token_ms   a new session on one bot asks for one token right after: today the bot is
                   recomputed under the new platform first
  all_bots_s       the first token of a new session on every other bot, one after another (the
                   recompute the first users after an edit wait for)
Prints a table and, last, exactly one line (medians over the runs):
  edit bots=B bot_tokens=T edit_ms=E first_token_ms=F all_bots_s=A
Needs only python3's standard library.
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from towerd_client import Stream, call, start_towerd, stop_towerd  # noqa: E402

VOCAB = ["the", "cat", "sat", "on", "a", "mat", "and", "looked", "at", "sky", "while", "birds", "sang", "songs",
         "under", "green", "trees", "near", "river", "stones"]


def words(n, seed):
    return " ".join(VOCAB[(i * 7 + seed * 13 + (i * i) // 5) % len(VOCAB)] for i in range(n))


def first_token_ms(sock, bot, sid):
    call(sock, "POST", "/v1/sessions", {"bot": bot, "id": sid})
    s = Stream(sock, sid, "Hello there.", 1)
    t = time.monotonic()
    s.run()
    if s.error:
        raise RuntimeError(s.error)
    return ((s.times[0] if s.times else s.end) - t) * 1000, s.usage["prompt_tokens"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--towerd", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bots", type=int, default=12)
    ap.add_argument("--bot-words", type=int, default=500)
    ap.add_argument("--platform-words", type=int, default=200)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    if a.bots < 2 or a.runs < 1 or a.bot_words < 1 or a.platform_words < 10:
        ap.error("--bots must be at least 2, --runs and --bot-words at least 1, --platform-words at least 10")
    tmp = tempfile.mkdtemp(prefix="towers-edit.")
    p = None
    rows = []
    try:
        p, sock = start_towerd(a.towerd, a.model, tmp, a.threads, "[cold]\nenabled = false\n")
        platform = words(a.platform_words, 0)
        call(sock, "PUT", "/v1/segments/plat", {"level": "platform", "text": platform})
        bot_tokens = 0
        for b in range(a.bots):
            r = call(sock, "PUT", "/v1/segments/b%d" % b,
                     {"level": "bot", "parent": "plat", "text": "You are bot %d. " % b + words(a.bot_words, b + 1)})
            bot_tokens = r.get("tokens", bot_tokens) if isinstance(r, dict) else bot_tokens
            first_token_ms(sock, "b%d" % b, "warm-%d" % b)
        for run in range(a.runs):
            edited = platform + " Edit %d: be kind and brief." % run
            t = time.monotonic()
            call(sock, "PUT", "/v1/segments/plat", {"level": "platform", "text": edited})
            edit_ms = (time.monotonic() - t) * 1000
            first, _ = first_token_ms(sock, "b0", "first-%d" % run)
            t = time.monotonic()
            for b in range(1, a.bots):
                first_token_ms(sock, "b%d" % b, "rest-%d-%d" % (run, b))
            all_s = time.monotonic() - t + first / 1000
            rows.append((edit_ms, first, all_s))
            print("run %d: edit %.0f ms, first token on a bot %.0f ms, every bot once %.1f s"
                  % (run + 1, edit_ms, first, all_s), flush=True)
    finally:
        if p:
            stop_towerd(p)
        shutil.rmtree(tmp, ignore_errors=True)
    med = lambda i: statistics.median(r[i] for r in rows)  # noqa: E731
    print("edit bots=%d bot_tokens=%s edit_ms=%.0f first_token_ms=%.0f all_bots_s=%.1f"
          % (a.bots, bot_tokens, med(0), med(1), med(2)))


if __name__ == "__main__":
    main()
