#!/usr/bin/env python3
"""What common client code does (issue 23), against towerd on stories260K:
  - seeds: requests without "seed" at temperature 1 draw fresh seeds (four identical requests do not
    all give the same text), each reply names its seed in "towers.seed", and replaying that seed
    gives the same text again; a given seed gives the same text every time and is reported as given;
  - "name" on messages (LangChain sends it on user and tool messages) is accepted on every role and
    changes nothing (the templates have no place for it);
  - tool_choice "required" with the default parallel_tool_calls: for each of 12 seeds the whole
    reply and the streamed one hold the same calls (names and arguments) and finish reason, a reply
    cut by max_tokens still has its calls as tool_calls, and no <tool_call> markup reaches the content;
  - a session request brings the new message alone or after the whole conversation so far (as the
    AI SDK and LangChain send it), which is then the session's: another history (two user messages
    on a one-turn session, a system message, an edited reply) or no new message at the end is
    refused (400, param "messages") and the session keeps its history untouched.

  clients.py TOWERD MODEL TMPDIR
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from towerd_client import HttpError, UnixHTTPConnection, call, send, start_towerd, stop_towerd  # noqa: E402

CHAT = "/v1/chat/completions"
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string", "maxLength": 12},
                                          "unit": {"enum": ["c", "f"]}},
                                          "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "minimum": -9007199254740991, "maximum": 9007199254740991},
                                         "b": {"type": "integer", "minimum": 0, "maximum": 100}},
        "required": ["a", "b"], "additionalProperties": False}}},
]


def fail(msg):
    raise SystemExit("FAIL: " + msg)


def stream(sock, body):
    """A streamed chat completion: (content, calls as [(name, arguments)], finish_reason, towers)."""
    c = UnixHTTPConnection(sock)
    r = send(c, "POST", CHAT, json.dumps(dict(body, stream=True)))
    if r.status != 200:
        fail("stream: HTTP %d %s" % (r.status, r.read()[:300]))
    content, calls, finish, towers = "", {}, None, None
    for raw in r.read().decode().split("\n\n"):
        if not raw.startswith("data: ") or raw == "data: [DONE]":
            continue
        chunk = json.loads(raw[len("data: "):])
        towers = chunk.get("towers", towers)
        for ch in chunk["choices"]:
            delta = ch.get("delta", {})
            content += delta.get("content") or ""
            for tc in delta.get("tool_calls") or []:
                call_ = calls.setdefault(tc["index"], ["", ""])
                call_[0] += tc.get("function", {}).get("name") or ""
                call_[1] += tc.get("function", {}).get("arguments") or ""
            finish = ch.get("finish_reason") or finish
    c.close()
    return content, [tuple(calls[i]) for i in sorted(calls)], finish, towers


def whole(sock, body):
    """A whole chat completion: (content, calls, finish_reason, towers)."""
    r = call(sock, "POST", CHAT, body)
    ch = r["choices"][0]
    m = ch["message"]
    calls = [(t["function"]["name"], t["function"]["arguments"]) for t in m.get("tool_calls") or []]
    return m["content"] or "", calls, ch["finish_reason"], r["towers"]


def main():
    towerd, model, tmp = sys.argv[1:4]
    p, sock = start_towerd(towerd, model, tmp, 2, "[cold]\nenabled = false\n")
    try:
        hi = {"messages": [{"role": "user", "content": "Once upon a time"}], "temperature": 1, "max_tokens": 24}
        # -- seeds
        replies = [whole(sock, hi) for _ in range(4)]
        texts = [r[0] for r in replies]
        seeds = [r[3]["seed"] for r in replies]
        if len(set(texts)) == 1:
            fail("four requests without a seed at temperature 1 gave the same text: %r" % texts[0])
        if len(set(seeds)) != 4 or not all(isinstance(s, int) and 0 <= s < 2 ** 53 for s in seeds):
            fail("drawn seeds are not four distinct integers below 2^53: %r" % seeds)
        for text, seed in zip(texts, seeds):
            again = whole(sock, dict(hi, seed=seed))
            if again[0] != text or again[3]["seed"] != seed:
                fail("replaying towers.seed %d gave %r instead of %r" % (seed, again[0], text))
        fixed = [whole(sock, dict(hi, seed=42)) for _ in range(2)] + [stream(sock, dict(hi, seed=42))]
        if len({r[0] for r in fixed}) != 1 or {r[3]["seed"] for r in fixed} != {42}:
            fail("seed 42 (whole, whole, streamed) gave %r" % [(r[0], r[3]["seed"]) for r in fixed])
        print("seeds: 4 requests without a seed gave %d different texts; each replays from towers.seed; "
              "seed 42 gives one text whole and streamed" % len(set(texts)))

        # -- name on messages
        plain = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                              {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Tell me a story"}],
                 "temperature": 0, "max_tokens": 16}
        named = json.loads(json.dumps(plain))
        for m, n in zip(named["messages"], ["rules", "alice", "bot", "alice"]):
            m["name"] = n
        if whole(sock, named)[0] != whole(sock, plain)[0]:
            fail("\"name\" on messages changed the reply")
        tool_round = {"messages": [{"role": "user", "content": "Weather in Paris?", "name": "alice"},
                                   {"role": "assistant", "content": None, "tool_calls": [
                                       {"id": "call_1", "type": "function",
                                        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"c\"}"}}]},
                                   {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "18 C"}],
                      "tools": TOOLS, "temperature": 0, "max_tokens": 16}
        whole(sock, tool_round)
        try:
            call(sock, "POST", CHAT, dict(plain, messages=[{"role": "user", "content": "x", "name": 3}]))
            fail("a name that is not a string was accepted")
        except HttpError as e:
            if e.status != 400 or "messages[0].name" not in str(e):
                fail("a bad name gave %s" % e)
        print("name: accepted on system, user, assistant and tool messages; the reply is the same without it")

        # -- tool_choice "required" with the default parallel_tool_calls: whole and streamed agree
        finishes = {}
        for seed in range(12):
            body = {"messages": [{"role": "user", "content": "What is the weather in Paris, and 2 + 3?"}],
                    "tools": TOOLS, "tool_choice": "required", "temperature": 1, "seed": seed, "max_tokens": 400}
            w, s = whole(sock, body), stream(sock, body)
            if w[1] != s[1] or w[2] != s[2] or w[0] != s[0]:
                fail("seed %d: whole %r and streamed %r disagree" % (seed, w[:3], s[:3]))
            # A reply cut by max_tokens keeps the calls it began, as a stream of it shows them.
            if w[2] not in ("tool_calls", "length") or not w[1]:
                fail("seed %d: finish %s with calls %r (content %r)" % (seed, w[2], w[1], w[0]))
            if "<tool_call>" in w[0]:
                fail("seed %d: tool call markup in the content: %r" % (seed, w[0]))
            for i, (name, args) in enumerate(w[1]):
                if w[2] == "tool_calls" or i + 1 < len(w[1]):  # the last of a cut reply is unfinished
                    json.loads(args)
                if name not in ("get_weather", "add"):
                    fail("seed %d: unknown tool %s" % (seed, name))
            key = "%d calls, %s" % (len(w[1]), w[2])
            finishes[key] = finishes.get(key, 0) + 1
        print("tool_choice required: 12 seeds, whole and streamed give the same calls and finish reason, "
              "no markup in the content (replies: %s)" % finishes)

        # -- a session request brings the new message, alone or after the session's conversation
        call(sock, "PUT", "/v1/segments/plat", {"level": "platform", "text": "You tell stories."})
        call(sock, "PUT", "/v1/segments/teller", {"level": "bot", "parent": "plat", "text": "Your name is Teller."})
        session = call(sock, "POST", "/v1/sessions", {"bot": "teller"})["id"]
        hi = {"role": "user", "content": "Hi"}
        first = call(sock, "POST", CHAT, {"session": session, "messages": [hi], "max_tokens": 4})
        reply = {"role": "assistant", "content": first["choices"][0]["message"]["content"]}
        for msgs, words in (([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "are not the 2"),
                            ([{"role": "system", "content": "s"}, {"role": "user", "content": "b"}], "are not the 2"),
                            ([hi, dict(reply, content=reply["content"] + "!"), {"role": "user", "content": "b"}], "are not the 2"),
                            ([{"role": "assistant", "content": "a"}], "must end with the new message")):
            try:
                call(sock, "POST", CHAT, {"session": session, "messages": msgs, "max_tokens": 4})
                fail("a session request with messages %r was accepted" % msgs)
            except HttpError as e:
                if e.status != 400 or words not in str(e) or "messages" not in str(e):
                    fail("a session request with messages %r gave %s" % (msgs, e))
        if call(sock, "GET", "/v1/sessions/" + session)["messages"] != 2:
            fail("refused requests changed the session")
        second = call(sock, "POST", CHAT, {"session": session, "messages": [dict(hi, name="alice"), reply,
                                                                            {"role": "user", "content": "And then?"}],
                                            "max_tokens": 4})
        need = first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"] - 1
        if second["usage"]["prompt_tokens_details"]["cached_tokens"] < need:
            fail("the whole conversation: cached_tokens %s < %d" % (second["usage"], need))
        if call(sock, "GET", "/v1/sessions/" + session)["messages"] != 4:
            fail("the whole conversation: not one turn more")
        print("session: another history or no new message is refused with 400 naming the rule (the session unchanged); "
              "the whole conversation continues it (cached_tokens %d of %d)" %
              (second["usage"]["prompt_tokens_details"]["cached_tokens"], second["usage"]["prompt_tokens"]))
        print("clients: OK")
    finally:
        stop_towerd(p)


if __name__ == "__main__":
    main()
