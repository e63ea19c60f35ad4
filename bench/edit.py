#!/usr/bin/env python3
"""What an operator's edit of the platform prompt costs (issue 16): without modular towers (the
baseline) and with them (--modular).

  bench/edit.py --towerd build/daemon/towerd --model M.gguf [--threads 2] [--bots 12] [--bot-words 500]
                [--platform-words 200] [--runs 3] [--session-turns 6]
                [--modular [--bench-towers build/bench/bench_towers]]

On a towerd this script starts: a platform of PLATFORM_WORDS words, BOTS bots of BOT_WORDS words under it,
each bot used once by a session (so all of them are computed). Then, RUNS times: the platform's text is
edited (a sentence appended), and it measures
  edit_ms          the PUT of the new platform text (towerd answers once the platform is computed)
  first_token_ms   a new session on one bot asks for one token right after
  session's turn   then a session held on another bot before the edits (SESSION_TURNS turns of 60
                   words each, 48-token replies) sends its next message: its first token

Baseline (the default; towerd runs with `[modular] enabled = false`): every bot is recomputed under the
new platform by the first session that needs it, and it also measures
  all_bots_s       the first token of a new session on every other bot, one after another (the
                   recompute the first users after an edit wait for)
and prints a table and, last, exactly one line (medians over the runs):
  edit bots=B bot_tokens=T edit_ms=E first_token_ms=F all_bots_s=A

--modular (towerd runs with `[modular] enabled = true`, `repair_tokens = 16`, `background_exact = true`):
the edit places every bot on the new platform at once (its old KV reused, its first 16 tokens
recomputed) and rebuilds each exactly in the background. After the first token it measures
  background_exact_s  seconds from the PUT's start until GET /v1/segments shows no segment whose
                      "pool" says "modular": true, nor one still waiting to be computed ("tier":
                      "cold"; polled every 50 ms; more than 600 s is an error)
and prints, last, exactly one line (medians over the runs for E, F and X):
  modular edit_ms=E first_token_ms=F background_exact_s=X kl_r16=K top1_r16=P
where K (mean KL in nats) and P (top-1 agreement, %) are what the modular placement costs in quality,
from `bench_towers --edit-drift --repair 16` (its drift model: stories260K on TinyStories text from
$TOWERS_SHARED; --bench-towers names the binary, default <towerd's build dir>/bench/bench_towers).
Before that last line, both modes print
  session transcript_tokens=T turn_after_edit_ms=S
(the median of the session's next turn: without modular towers its transcript is prefilled again under
the new platform; with them it is placed modularly, one 16-token repair). Needs only python3's
standard library.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from towerd_client import Stream, call, start_towerd, stop_towerd  # noqa: E402

VOCAB = ["the", "cat", "sat", "on", "a", "mat", "and", "looked", "at", "sky", "while", "birds", "sang", "songs",
         "under", "green", "trees", "near", "river", "stones"]


def words(n, seed):
    return " ".join(VOCAB[(i * 7 + seed * 13 + (i * i) // 5) % len(VOCAB)] for i in range(n))


def turn_ms(sock, sid, content, max_tokens):
    """Milliseconds to the first token of a turn of session `sid`."""
    s = Stream(sock, sid, content, max_tokens)
    t = time.monotonic()
    s.run()
    if s.error:
        raise RuntimeError(s.error)
    return ((s.times[0] if s.times else s.end) - t) * 1000


def first_token_ms(sock, bot, sid):
    call(sock, "POST", "/v1/sessions", {"bot": bot, "id": sid})
    s = Stream(sock, sid, "Hello there.", 1)
    t = time.monotonic()
    s.run()
    if s.error:
        raise RuntimeError(s.error)
    return ((s.times[0] if s.times else s.end) - t) * 1000, s.usage["prompt_tokens"]


POLL_S = 0.05
EXACT_TIMEOUT_S = 600


def modular_segments(sock):
    """Names of the segments whose KV is a modular placement, or not computed yet (tier cold: this
    script runs towerd without the cold tier, so that is a placement or build waiting): not exact."""
    pools = [(g["name"], g["pool"]) for g in call(sock, "GET", "/v1/segments")["data"] if g.get("pool")]
    if any("modular" not in p for _, p in pools):
        raise RuntimeError("towerd's segments have no pool.modular: a towerd without modular towers?")
    return [name for name, p in pools if p["modular"] is True or p.get("tier") == "cold"]


def wait_exact(sock, since):
    """Seconds from `since` until no segment is modular (polled every POLL_S), and whether any was
    modular at the first look."""
    seen = bool(modular_segments(sock))
    while True:  # bounded: EXACT_TIMEOUT_S
        if not modular_segments(sock):
            return time.monotonic() - since, seen
        if time.monotonic() - since > EXACT_TIMEOUT_S:
            raise RuntimeError("segments still modular %d s after the edit: %s"
                               % (EXACT_TIMEOUT_S, ", ".join(modular_segments(sock))))
        time.sleep(POLL_S)


def edit_drift(bench_towers):
    """(kl, top1) of `bench_towers --edit-drift --repair 16`, as printed."""
    out = subprocess.run([bench_towers, "--edit-drift", "--repair", "16"], check=True, capture_output=True,
                         text=True, timeout=300).stdout
    m = re.search(r"^edit_drift r=16 kl=(\S+) top1=(\S+)$", out, re.M)
    if not m:
        raise RuntimeError("%s --edit-drift printed no edit_drift line: %r" % (bench_towers, out))
    return m.group(1), m.group(2)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--towerd", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bots", type=int, default=12)
    ap.add_argument("--bot-words", type=int, default=500)
    ap.add_argument("--platform-words", type=int, default=200)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--session-turns", type=int, default=6,
                    help="turns of the session held before the edits (0: none)")
    ap.add_argument("--modular", action="store_true",
                    help="modular towers on: time until every bot is exact again, and the drift numbers")
    ap.add_argument("--bench-towers", help="bench_towers binary for --modular's kl_r16 and top1_r16 "
                    "(default: <towerd's build dir>/bench/bench_towers)")
    a = ap.parse_args()
    if a.bots < 2 or a.runs < 1 or a.bot_words < 1 or a.platform_words < 10:
        ap.error("--bots must be at least 2, --runs and --bot-words at least 1, --platform-words at least 10")
    drift = None
    if a.modular:
        bench_towers = a.bench_towers or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(a.towerd))),
                                                      "bench", "bench_towers")
        if not os.access(bench_towers, os.X_OK):
            ap.error("--modular needs bench_towers (not found at %s): pass --bench-towers PATH" % bench_towers)
        drift = edit_drift(bench_towers)  # first: a fraction of a second, and a failure shows before the long part
    tmp = tempfile.mkdtemp(prefix="towers-edit.")
    p = None
    rows, talks, transcript = [], [], 0
    try:
        modular = ("[modular]\nenabled = true\nrepair_tokens = 16\nbackground_exact = true\n" if a.modular
                   else "[modular]\nenabled = false\n")
        p, sock = start_towerd(a.towerd, a.model, tmp, a.threads, "[cold]\nenabled = false\n" + modular)
        platform = words(a.platform_words, 0)
        call(sock, "PUT", "/v1/segments/plat", {"level": "platform", "text": platform})
        bot_tokens = 0
        for b in range(a.bots):
            r = call(sock, "PUT", "/v1/segments/b%d" % b,
                     {"level": "bot", "parent": "plat", "text": "You are bot %d. " % b + words(a.bot_words, b + 1)})
            bot_tokens = r.get("tokens", bot_tokens) if isinstance(r, dict) else bot_tokens
            first_token_ms(sock, "b%d" % b, "warm-%d" % b)
        # A conversation held before the edits, on b1: its next message after each edit.
        call(sock, "POST", "/v1/sessions", {"bot": "b1", "id": "talk"})
        for k in range(a.session_turns):
            turn_ms(sock, "talk", "Part %d. " % (k + 1) + words(60, k), 48)
        transcript = call(sock, "GET", "/v1/sessions/talk")["transcript_tokens"]
        for run in range(a.runs):
            edited = platform + " Edit %d: be kind and brief." % run
            t = time.monotonic()
            call(sock, "PUT", "/v1/segments/plat", {"level": "platform", "text": edited})
            edit_ms = (time.monotonic() - t) * 1000
            first, _ = first_token_ms(sock, "b0", "first-%d" % run)
            talk = turn_ms(sock, "talk", "And then? (%d)" % run, 1) if a.session_turns else float("nan")
            talks.append(talk)
            if a.modular:
                exact_s, seen = wait_exact(sock, t)
                rows.append((edit_ms, first, exact_s))
                print("run %d: edit %.0f ms, first token on a bot %.0f ms, the session's next turn %.0f ms, "
                      "every bot exact again after %.1f s%s"
                      % (run + 1, edit_ms, first, talk, exact_s,
                         "" if seen else " (none was modular when first asked: nothing placed modularly?)"),
                      flush=True)
                continue
            t = time.monotonic()
            for b in range(1, a.bots):
                first_token_ms(sock, "b%d" % b, "rest-%d-%d" % (run, b))
            all_s = time.monotonic() - t + first / 1000
            rows.append((edit_ms, first, all_s))
            print("run %d: edit %.0f ms, first token on a bot %.0f ms, the session's next turn %.0f ms, every bot once %.1f s"
                  % (run + 1, edit_ms, first, talk, all_s), flush=True)
    finally:
        if p:
            stop_towerd(p)
        shutil.rmtree(tmp, ignore_errors=True)
    med = lambda i: statistics.median(r[i] for r in rows)  # noqa: E731
    if a.session_turns:
        print("session transcript_tokens=%d turn_after_edit_ms=%.0f" % (transcript, statistics.median(talks)))
    if a.modular:
        print("modular edit_ms=%.0f first_token_ms=%.0f background_exact_s=%.1f kl_r16=%s top1_r16=%s"
              % (med(0), med(1), med(2), drift[0], drift[1]))
        return
    print("edit bots=%d bot_tokens=%s edit_ms=%.0f first_token_ms=%.0f all_bots_s=%.1f"
          % (a.bots, bot_tokens, med(0), med(1), med(2)))


if __name__ == "__main__":
    main()
