#!/usr/bin/env python3
"""kill -9 restart loop (issue 11): towerd is killed at random moments while clients define segments
and chat, and restarted on the same state directory, ROUNDS times. A ledger keeps what towerd
acknowledged (a 2xx answer received whole). After every restart:
  - every acknowledged segment is there with its text and parent;
  - every session's transcript is its acknowledged turns, plus at most the one turn that was in
    flight when the daemon died (its user message, whole) — nothing else, nothing invented; less the
    oldest turns a reply said it dropped (a session past the model's context), or the in-flight
    turn, when it is there, dropped;
  - a segment whose PUT was in flight is either absent or whole.
With --cold, a fourth client codes every idle segment (POST /v1/compress, idle_seconds 0) again and
again, so kills also land while segments freeze, sessions go to rest (their text leaves the log) and
wake again (a turn, or the transcript read after each restart).
At the end a reference towerd that never died is given the same segments and sessions and the same
user messages in order (temperature 0); every reply must equal the reply in the killed daemon's
transcripts.

  kill9.py TOWERD MODEL TMPDIR [--rounds N] [--seed S] [--cold]
The seed is printed first; rerun with --seed to replay the same kill moments and operations.
"""
import argparse
import os
import random
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from towerd_client import call, start_towerd, stop_towerd  # noqa: E402

CONFIG = "[cold]\nenabled = false\n"
COLD_CONFIG = "[cold]\nenabled = true\nscan_seconds = 3600\n"
WORDS = ["cat", "dog", "sun", "tree", "ship", "moon", "girl", "boy", "ball", "park", "rain", "cake"]


class Ledger:
    def __init__(self):
        self.lock = threading.Lock()
        self.segments = {}      # name -> (parent, text): acknowledged
        self.sessions = {}      # id -> bot: acknowledged
        self.turns = {}         # session -> [(user, reply, max_tokens)]: acknowledged
        self.dropped = {}       # session -> how many of its oldest turns left its transcript
        self.in_flight = {}     # what was sent and not acknowledged: ("segment", name) -> (parent, text),
                                # ("session", id) -> bot, ("turn", session) -> (user, max_tokens)


def worker(sock, rng, ledger, stop, w, r):
    """Worker w of round r. It chats only on sessions it created (in any round), so one session never
    has two turns in flight."""
    n = 0
    while not stop.is_set():
        n += 1
        op = rng.random()
        with ledger.lock:
            bots = [s for s, (p, _) in ledger.segments.items() if p == "plat"]
            mine = [s for s in ledger.sessions if s.startswith("s%d-" % w)]
        try:
            if op < 0.25 or not bots:
                name = "w%d-%d-%d" % (w, r, n)
                text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 60)))
                key = ("segment", name)
                with ledger.lock:
                    ledger.in_flight[key] = ("plat", text)
                call(sock, "PUT", "/v1/segments/" + name, {"level": "bot", "parent": "plat", "text": text})
                with ledger.lock:
                    ledger.segments[name] = ledger.in_flight.pop(key)
            elif op < 0.4 or not mine:
                sid = "s%d-%d-%d" % (w, r, n)
                bot = rng.choice(bots)
                key = ("session", sid)
                with ledger.lock:
                    ledger.in_flight[key] = bot
                call(sock, "POST", "/v1/sessions", {"bot": bot, "id": sid})
                with ledger.lock:
                    ledger.sessions[sid] = ledger.in_flight.pop(key)
                    ledger.turns[sid] = []
                    ledger.dropped[sid] = 0
            else:
                sid = rng.choice(mine)
                user = "Tell me about the %s and the %s." % (rng.choice(WORDS), rng.choice(WORDS))
                max_tokens = rng.randint(1, 12)
                key = ("turn", sid)
                with ledger.lock:
                    ledger.in_flight[key] = (user, max_tokens)
                r = call(sock, "POST", "/v1/sessions/%s/messages" % sid,
                         {"content": user, "max_tokens": max_tokens, "temperature": 0})
                with ledger.lock:
                    ledger.in_flight.pop(key)
                    ledger.turns[sid].append((user, r["choices"][0]["message"]["content"], max_tokens))
                    ledger.dropped[sid] += r["usage"].get("dropped_turns", 0)
        except Exception:
            return  # the daemon died under this request: it stays in flight


def compressor(sock, stop):
    """Sends every idle segment to the cold tier, and so every whole session to rest, until stopped."""
    while not stop.is_set():
        try:
            call(sock, "POST", "/v1/compress", {"idle_seconds": 0})
        except Exception:
            return  # the daemon died under it


def transcript(sock, sid):
    return [(m["role"], m["content"]) for m in call(sock, "GET", "/v1/sessions/%s/transcript" % sid)["messages"]]


def check_recovered(sock, ledger, round_no):
    """Compares the restarted daemon with the ledger; folds in-flight items that became durable."""
    def fail(msg):
        raise SystemExit("FAIL (round %d): %s" % (round_no, msg))
    names = {s["name"]: s for s in call(sock, "GET", "/v1/segments")["data"]}
    for name, (parent, text) in ledger.segments.items():
        s = names.get(name)
        if s is None:
            fail("acknowledged segment %s is gone" % name)
        if s["text"] != text or (s["parent"] or "") != parent:
            fail("segment %s came back different: %r" % (name, s))
    for key, val in list(ledger.in_flight.items()):
        kind, name = key
        if kind == "segment" and name in names:
            if names[name]["text"] != val[1]:
                fail("in-flight segment %s came back with other text" % name)
            ledger.segments[name] = val
        if kind == "session":
            try:
                call(sock, "GET", "/v1/sessions/" + name)
                ledger.sessions[name] = val
                ledger.turns[name] = []
                ledger.dropped[name] = 0
            except RuntimeError:
                pass
    for sid in ledger.sessions:
        got = transcript(sock, sid)
        want = []
        for user, reply, _ in ledger.turns[sid][ledger.dropped[sid]:]:
            want += [("user", user), ("assistant", reply)]
        if got == want:
            continue
        # The turn in flight is there: its reply may have dropped more of the oldest turns.
        user, max_tokens = ledger.in_flight.get(("turn", sid), (None, 0))
        more = (len(want) - len(got) + 2) // 2
        if (user is None or len(got) < 2 or more < 0 or got[-2] != ("user", user) or got[-1][0] != "assistant"
                or got[:-2] != want[2 * more:]):
            fail("session %s: transcript %r is not its acknowledged turns %r (in flight: %r)" % (sid, got, want, user))
        ledger.turns[sid].append((user, got[-1][1], max_tokens))
        ledger.dropped[sid] += more
    ledger.in_flight.clear()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("towerd")
    ap.add_argument("model")
    ap.add_argument("tmp")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--cold", action="store_true", help="a client compresses all the time (sessions go to rest)")
    a = ap.parse_args()
    config = COLD_CONFIG if a.cold else CONFIG
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1 << 31)
    print("kill9: seed %d, %d rounds%s (replay: --seed %d)" % (seed, a.rounds, " with sessions going to rest" if a.cold else "", seed), flush=True)
    rng = random.Random(seed)
    work = os.path.join(a.tmp, "killed")
    os.makedirs(work, exist_ok=True)
    ledger = Ledger()
    p, sock = start_towerd(a.towerd, a.model, work, 2, config)
    call(sock, "PUT", "/v1/segments/plat", {"level": "platform", "text": "You are a storyteller."})
    ledger.segments["plat"] = ("", "You are a storyteller.")
    try:
        for r in range(1, a.rounds + 1):
            stop = threading.Event()
            threads = [threading.Thread(target=worker, args=(sock, random.Random(rng.random()), ledger, stop, w, r))
                       for w in range(3)]
            if a.cold:
                threads.append(threading.Thread(target=compressor, args=(sock, stop)))
            for t in threads:
                t.start()
            time.sleep(rng.uniform(0.05, 1.5))  # the random kill moment is the test, not synchronisation
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
            stop.set()
            for t in threads:
                t.join()
            p, sock = start_towerd(a.towerd, a.model, work, 2, config)
            check_recovered(sock, ledger, r)
            print("round %d: %d segments, %d sessions, %d turns acknowledged so far (%d dropped past the context)" %
                  (r, len(ledger.segments), len(ledger.sessions), sum(len(t) for t in ledger.turns.values()),
                   sum(ledger.dropped.values())), flush=True)
        final = {sid: ledger.turns[sid] for sid in ledger.sessions}
    finally:
        stop_towerd(p)
    # The reference: a daemon that never died, given the same history.
    ref_dir = os.path.join(a.tmp, "reference")
    os.makedirs(ref_dir, exist_ok=True)
    p, sock = start_towerd(a.towerd, a.model, ref_dir, 2, CONFIG)
    try:
        call(sock, "PUT", "/v1/segments/plat", {"level": "platform", "text": ledger.segments["plat"][1]})
        for name, (parent, text) in ledger.segments.items():
            if name != "plat":
                call(sock, "PUT", "/v1/segments/" + name, {"level": "bot", "parent": parent, "text": text})
        compared = 0
        for sid, turns in final.items():
            call(sock, "POST", "/v1/sessions", {"bot": ledger.sessions[sid], "id": sid})
            for user, reply, max_tokens in turns:
                r = call(sock, "POST", "/v1/sessions/%s/messages" % sid,
                         {"content": user, "max_tokens": max_tokens, "temperature": 0})
                got = r["choices"][0]["message"]["content"]
                compared += 1
                if got != reply:
                    raise SystemExit("FAIL: session %s, message %r: the killed daemon replied %r, the reference %r"
                                     % (sid, user, reply, got))
        print("kill9: %d rounds, %d segments, %d sessions, %d replies identical to a daemon that never died: OK"
              % (a.rounds, len(ledger.segments), len(final), compared))
    finally:
        stop_towerd(p)


if __name__ == "__main__":
    main()
