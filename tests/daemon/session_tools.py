#!/usr/bin/env python3
"""Tools on bots and sessions (issue 23), against towerd on stories260K:
  - a multi-step tool loop on a bot session: a request with tools and tool_choice "required" gives
    tool_calls (finish_reason "tool_calls"); the next request brings the tool result (a "tool"
    message) and no tools (the session keeps its own) and gets the final answer; its cached_tokens
    cover the whole first turn (its prompt and its reply but the last, sampled token);
  - the same turns streamed on a twin session give the same calls and the same answer;
  - a third session of the bot with the same tools has the tools' segments served from the pool on
    its first turn (cached_tokens past the bot's chain): the tools block is shared;
  - GET /v1/sessions/ID?transcript=1 gives the tools and the turns as the chat API writes them
    (the assistant's tool_calls with the ids the results answered, the tool message);
  - a session's tools are fixed by its first turn: other tools are 400 param "tools", and so are
    tools on a session that had turns without them; several user messages are still 400 "messages";
  - a bot without a session takes tools too (the same segments);
  - POST /v1/sessions/ID/messages on a session with tools decodes the reply as chat completions
    does: tool_choice "required" gives tool_calls (finish_reason "tool_calls"); "tools" there is 400;
  - a client that sends the whole conversation with `session` on every step (the AI SDK, LangChain:
    the user message, the reply's tool_calls with their arguments re-serialised, the tool results)
    continues the session as if it sent only the new messages; a history that is not the session's
    is 400 "messages"; the Responses API likewise takes the whole conversation with the reply's
    function_call items (call_<session>_<turn>_<k>) before their outputs;
  - the Responses API on the same sessions: a first response with tools and tool_choice "required"
    has a function_call item (call_id call_<session>_1_0); the next, with previous_response_id and a
    function_call_output item, is the answer, its cached_tokens covering the first turn; streamed,
    the function call's typed events (output_item.added, function_call_arguments.delta/.done,
    output_item.done) give the same call; GET gives the function_call item back;
  - an edit of the bot does not stop its tool session;
  - after a restart the session continues: the transcript (tool calls, results, tools) is back and
    its next reply equals the one a session that never restarted gives for the same turns.

  session_tools.py TOWERD MODEL TMPDIR
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from towerd_client import HttpError, UnixHTTPConnection, call, send, start_towerd, stop_towerd  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import clients  # noqa: E402

CHAT = "/v1/chat/completions"
CONFIG = "[cold]\nenabled = false\n"
TOOLS = clients.TOOLS[:1]  # get_weather (city, unit), as the session-less checks use it
OTHER_TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]


def fail(msg):
    raise SystemExit("FAIL: " + msg)


def check(cond, msg):
    if not cond:
        fail(msg)


def stream(sock, body):
    """A streamed chat completion as the whole one looks: {content, calls [(name, arguments)], finish,
    usage}."""
    c = UnixHTTPConnection(sock)
    r = send(c, "POST", CHAT, json.dumps(dict(body, stream=True, stream_options={"include_usage": True})))
    if r.status != 200:
        fail("stream: HTTP %d %s" % (r.status, r.read()[:300]))
    content, calls, finish, usage = "", {}, None, None
    for raw in r.read().decode().split("\n\n"):
        if not raw.startswith("data: ") or raw == "data: [DONE]":
            continue
        chunk = json.loads(raw[len("data: "):])
        check("error" not in chunk, "stream: %s" % chunk)
        usage = chunk.get("usage") or usage
        for ch in chunk["choices"]:
            delta = ch.get("delta", {})
            content += delta.get("content") or ""
            for tc in delta.get("tool_calls") or []:
                entry = calls.setdefault(tc["index"], ["", "", ""])
                entry[0] = tc.get("id") or entry[0]
                entry[1] += tc.get("function", {}).get("name") or ""
                entry[2] += tc.get("function", {}).get("arguments") or ""
            finish = ch.get("finish_reason") or finish
    c.close()
    return {"content": content or None, "ids": [calls[i][0] for i in sorted(calls)],
            "calls": [(calls[i][1], calls[i][2]) for i in sorted(calls)], "finish": finish, "usage": usage}


def whole(sock, body):
    r = call(sock, "POST", CHAT, body)
    m = r["choices"][0]["message"]
    tcs = m.get("tool_calls") or []
    return {"content": m["content"], "ids": [t["id"] for t in tcs],
            "calls": [(t["function"]["name"], t["function"]["arguments"]) for t in tcs],
            "finish": r["choices"][0]["finish_reason"], "usage": r["usage"]}


def cached(r):
    return r["usage"]["prompt_tokens_details"]["cached_tokens"]


def expect_error(sock, body, status, param, words):
    try:
        call(sock, "POST", CHAT, body)
    except HttpError as e:
        check(e.status == status and ('"param":"%s"' % param) in str(e).replace(" ", "") and words in str(e),
              "%s: %s (expected %d, param %s, %r)" % (json.dumps(body)[:160], e, status, param, words))
        return
    fail("accepted: %s" % json.dumps(body)[:200])


def tool_loop(sock, session, reply):
    """Turn 1 (tools, a required call) and turn 2 (its result, the answer) on `session`; `reply` is
    whole or stream. Returns (turn 1, turn 2)."""
    t1 = reply(sock, {"session": session, "messages": [{"role": "user", "content": "Weather in Paris?"}],
                      "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False, "temperature": 0,
                      "max_tokens": 200})
    check(t1["finish"] == "tool_calls" and len(t1["calls"]) >= 1, "turn 1: no tool call: %s" % t1)
    check(t1["calls"][0][0] == "get_weather", "turn 1: called %s" % t1["calls"][0][0])
    args = json.loads(t1["calls"][0][1])
    check(set(args) == {"city", "unit"} and args["unit"] in ("c", "f"), "turn 1: arguments %r" % args)
    results = [{"role": "tool", "tool_call_id": i, "content": "18 degrees and sunny"} for i in t1["ids"]]
    t2 = reply(sock, {"session": session, "messages": results, "tool_choice": "none", "temperature": 0, "max_tokens": 12})
    check(t2["finish"] in ("stop", "length") and t2["content"] and not t2["calls"], "turn 2: %s" % t2)
    need = t1["usage"]["prompt_tokens"] + t1["usage"]["completion_tokens"] - 1
    check(cached(t2) >= need, "turn 2: cached_tokens %d < %d (turn 1's prompt %d + reply %d - 1)" %
          (cached(t2), need, t1["usage"]["prompt_tokens"], t1["usage"]["completion_tokens"]))
    check(t2["usage"]["prompt_tokens"] > cached(t2), "turn 2: nothing new prefilled?")
    return t1, t2


def check_transcript(sock, session, t1, t2, what):
    s = call(sock, "GET", "/v1/sessions/%s?transcript=1" % session)
    check(s["tools"] == TOOLS, "%s: tools %s" % (what, s.get("tools")))
    msgs = s["transcript"]
    check([m["role"] for m in msgs] == ["user", "assistant"] + ["tool"] * len(t1["ids"]) + ["assistant"],
          "%s: roles %s" % (what, [m["role"] for m in msgs]))
    calls = msgs[1].get("tool_calls") or []
    check([(c["function"]["name"], c["function"]["arguments"]) for c in calls] == t1["calls"],
          "%s: the assistant's tool_calls %s != %s" % (what, calls, t1["calls"]))
    check([c["id"] for c in calls] == t1["ids"], "%s: call ids %s != %s" % (what, [c["id"] for c in calls], t1["ids"]))
    check(msgs[2]["tool_call_id"] == t1["ids"][0] and msgs[2]["content"] == "18 degrees and sunny", "%s: %s" % (what, msgs[2]))
    answer = msgs[2 + len(t1["ids"])]["content"]
    check(answer == t2["content"], "%s: answer %r != %r" % (what, answer, t2["content"]))


def as_client_sends(t1):
    """Turn 1's reply as a client puts it back into the conversation: its arguments parsed and
    serialised again (JSON.stringify spacing, not the model's)."""
    return {"role": "assistant", "content": t1["content"],
            "tool_calls": [{"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(json.loads(a), separators=(",", ":"))}}
                           for i, (n, a) in zip(t1["ids"], t1["calls"])]}


def session_messages_with_tools(sock):
    """The Towers endpoint POST /v1/sessions/ID/messages on a session whose first turn brought tools."""
    s = call(sock, "POST", "/v1/sessions", {"bot": "guide"})["id"]
    whole(sock, {"session": s, "messages": [{"role": "user", "content": "Hello"}], "tools": TOOLS, "tool_choice": "none",
                 "temperature": 0, "max_tokens": 4})
    path = "/v1/sessions/%s/messages" % s
    r = call(sock, "POST", path, {"content": "Weather in Paris?", "tool_choice": "required", "parallel_tool_calls": False,
                                  "temperature": 0, "max_tokens": 200})
    calls = r["choices"][0]["message"].get("tool_calls") or []
    check(r["choices"][0]["finish_reason"] == "tool_calls" and len(calls) == 1 and calls[0]["function"]["name"] == "get_weather",
          "messages endpoint: %s" % r["choices"][0])
    check(set(json.loads(calls[0]["function"]["arguments"])) == {"city", "unit"}, "messages endpoint: %s" % calls[0])
    try:
        call(sock, "POST", path, {"content": "x", "tools": TOOLS})
        fail("messages endpoint: tools accepted")
    except HttpError as e:
        check(e.status == 400 and '"param":"tools"' in str(e).replace(" ", ""), "messages endpoint, tools: %s" % e)
    print("POST /v1/sessions/ID/messages on a session with tools: tool_choice required gives %s; tools 400" %
          calls[0]["function"]["arguments"])


def whole_conversation_loop(sock):
    """The tool loop as the AI SDK sends it on a session: every step the whole conversation so far."""
    s = call(sock, "POST", "/v1/sessions", {"bot": "guide"})["id"]
    question = {"role": "user", "content": "Weather in Paris?", "name": "alice"}
    step = {"session": s, "tools": TOOLS, "parallel_tool_calls": False, "temperature": 0, "max_tokens": 200}
    t1 = whole(sock, dict(step, messages=[question], tool_choice="required"))
    check(t1["finish"] == "tool_calls", "whole conversation, step 1: %s" % t1)
    results = [{"role": "tool", "tool_call_id": i, "content": "18 degrees and sunny", "name": "get_weather"} for i in t1["ids"]]
    conv = [question, as_client_sends(t1)] + results
    edited = [dict(question, content="Weather in Rome?")] + conv[1:]
    expect_error(sock, dict(step, messages=edited, tool_choice="none"), 400, "messages", "are not the")
    t2 = whole(sock, dict(step, messages=conv, tool_choice="none", max_tokens=12))
    need = t1["usage"]["prompt_tokens"] + t1["usage"]["completion_tokens"] - 1
    check(t2["content"] and cached(t2) >= need, "whole conversation, step 2: %s (cached must be >= %d)" % (t2, need))
    t3 = whole(sock, dict(step, messages=conv + [{"role": "assistant", "content": t2["content"]}, {"role": "user", "content": "Thanks"}],
                          tool_choice="none", max_tokens=8))
    check(t3["content"] is not None, "whole conversation, turn 3: %s" % t3)
    msgs = call(sock, "GET", "/v1/sessions/%s?transcript=1" % s)["transcript"]
    check([m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant", "user", "assistant"], "whole conversation: %s" % msgs)
    print("whole conversation on a session: step 2 cached_tokens %d of %d; an edited history 400" %
          (cached(t2), t2["usage"]["prompt_tokens"]))


RESP = "/v1/responses"
RESP_TOOLS = [dict(t["function"], type="function") for t in TOOLS]


def response_stream(sock, body):
    """A streamed response: [(event name, data)]."""
    c = UnixHTTPConnection(sock)
    r = send(c, "POST", RESP, json.dumps(dict(body, stream=True)))
    if r.status != 200:
        fail("responses stream: HTTP %d %s" % (r.status, r.read()[:300]))
    events = []
    for block in r.read().decode().split("\n\n"):
        if block:
            lines = block.split("\n")
            events.append((lines[0][len("event: "):], json.loads(lines[1][len("data: "):])))
    c.close()
    return events


def calls_of(response):
    return [(i["name"], i["arguments"]) for i in response["output"] if i["type"] == "function_call"]


def responses_tool_loop(sock):
    first = {"input": "Weather in Paris?", "instructions": "You help travellers.", "tools": RESP_TOOLS,
             "tool_choice": "required", "parallel_tool_calls": False, "temperature": 0, "max_output_tokens": 200}
    r1 = call(sock, "POST", RESP, first)
    session = r1["session"]
    fcs = [i for i in r1["output"] if i["type"] == "function_call"]
    check(r1["status"] == "completed" and fcs, "responses turn 1: no function_call item: %s" % r1["output"])
    check(fcs[0]["call_id"] == "call_%s_1_0" % session and fcs[0]["id"] == "fc_%s_1_0" % session and
          fcs[0]["name"] == "get_weather", "responses turn 1: item %s" % fcs[0])
    check(set(json.loads(fcs[0]["arguments"])) == {"city", "unit"}, "responses turn 1: arguments %s" % fcs[0]["arguments"])
    check(r1["tools"] == RESP_TOOLS, "responses turn 1: tools echoed %s" % r1["tools"])
    r2 = call(sock, "POST", RESP, {"previous_response_id": r1["id"], "tool_choice": "none", "temperature": 0,
                                   "max_output_tokens": 12,
                                   "input": [{"type": "function_call_output", "call_id": f["call_id"], "output": "18 degrees"}
                                             for f in fcs]})
    text = "".join(p["text"] for i in r2["output"] if i["type"] == "message" for p in i["content"])
    check(text and not calls_of(r2), "responses turn 2: %s" % r2["output"])
    need = r1["usage"]["input_tokens"] + r1["usage"]["output_tokens"] - 1
    got = r2["usage"]["input_tokens_details"]["cached_tokens"]
    check(got >= need, "responses turn 2: cached_tokens %d < %d" % (got, need))
    g = call(sock, "GET", RESP + "/" + r1["id"])
    check(calls_of(g) == calls_of(r1) and g["tools"] == RESP_TOOLS, "GET %s: %s" % (r1["id"], g))
    events = response_stream(sock, first)
    names = [n for n, _ in events]
    done = events[-1][1]["response"]
    check(names[-1] == "response.completed" and calls_of(done) == calls_of(r1),
          "streamed: %s != %s (%s)" % (calls_of(done), calls_of(r1), names[-1]))
    added = [d for n, d in events if n == "response.output_item.added"]
    check([a["item"]["type"] for a in added] == [i["type"] for i in done["output"]], "streamed items %s" % added)
    deltas = "".join(d["delta"] for n, d in events if n == "response.function_call_arguments.delta")
    args_done = [d["arguments"] for n, d in events if n == "response.function_call_arguments.done"]
    check(args_done == [a for _, a in calls_of(done)] and deltas == "".join(args_done), "streamed arguments %r %r" % (deltas, args_done))
    for i, (n, d) in enumerate(events):
        check(d["type"] == n and d["sequence_number"] == i, "event %d: %s" % (i, n))
    print("responses: function_call %s, turn 2 cached_tokens %d of %d, streamed events %s" %
          (calls_of(r1)[0], got, r2["usage"]["input_tokens"], sorted(set(names))))
    # The AI SDK's second step: no previous_response_id, the whole conversation with the reply's
    # function_call items (arguments re-serialised) and their outputs.
    f1 = call(sock, "POST", RESP, first)
    fcs = [i for i in f1["output"] if i["type"] == "function_call"]
    conv = [{"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]}]
    conv += [{"type": "function_call", "call_id": f["call_id"], "name": f["name"],
              "arguments": json.dumps(json.loads(f["arguments"]), separators=(",", ":"))} for f in fcs]
    conv += [{"type": "function_call_output", "call_id": f["call_id"], "output": "18 degrees"} for f in fcs]
    f2 = call(sock, "POST", RESP, {"input": conv, "instructions": "You help travellers.", "tools": RESP_TOOLS, "tool_choice": "none",
                                   "temperature": 0, "max_output_tokens": 12})
    need = f1["usage"]["input_tokens"] + f1["usage"]["output_tokens"] - 1
    check(f2["id"] == "resp_%s_2" % f1["session"] and f2["previous_response_id"] == f1["id"] and
          f2["usage"]["input_tokens_details"]["cached_tokens"] >= need, "responses, whole conversation: %s" % f2)
    conv[0] = {"role": "user", "content": "Weather in Rome?"}
    f1b = call(sock, "POST", RESP, first)
    conv = conv[:1] + [dict(c, call_id=c["call_id"].replace(f1["session"], f1b["session"])) for c in conv[1:]]
    try:
        call(sock, "POST", RESP, {"input": conv, "instructions": "You help travellers.", "temperature": 0, "max_output_tokens": 4})
        fail("responses: a conversation that is not the session's was accepted")
    except HttpError as e:
        check(e.status == 400 and '"param":"input"' in str(e).replace(" ", ""), "responses, edited conversation: %s" % e)
    # The calls as item references (fc_<session>_<turn>_<k>), as a stored conversation may name them.
    g1 = call(sock, "POST", RESP, first)
    gcs = [i for i in g1["output"] if i["type"] == "function_call"]
    refs = [{"role": "user", "content": "Weather in Paris?"}] + [{"type": "item_reference", "id": f["id"]} for f in gcs]
    g2 = call(sock, "POST", RESP, {"input": refs + [{"type": "function_call_output", "call_id": f["call_id"], "output": "18 degrees"}
                                                    for f in gcs],
                                   "instructions": "You help travellers.", "temperature": 0, "max_output_tokens": 4})
    check(g2["id"] == "resp_%s_2" % g1["session"], "responses, function calls by item_reference: %s" % g2["id"])
    try:
        call(sock, "POST", RESP, {"input": refs[:1] + [{"type": "item_reference", "id": gcs[0]["id"][:-1] + "9"}],
                                  "instructions": "You help travellers.", "max_output_tokens": 4})
        fail("responses: a reference to a function call that does not exist was accepted")
    except HttpError as e:
        check(e.status == 404 and "response_not_found" in str(e), "responses, unknown fc_ reference: %s" % e)
    print("responses: the whole conversation with function_call items (or their item references) continues the session "
          "(cached_tokens %d)" % f2["usage"]["input_tokens_details"]["cached_tokens"])


def main():
    towerd, model, tmp = sys.argv[1:4]
    p, sock = start_towerd(towerd, model, tmp, 2, CONFIG)
    try:
        call(sock, "PUT", "/v1/segments/plat", {"level": "platform", "text": "You help travellers."})
        call(sock, "PUT", "/v1/segments/guide", {"level": "bot", "parent": "plat", "text": "Your name is Guide."})
        chain = call(sock, "GET", "/v1/segments/plat")["tokens"] + call(sock, "GET", "/v1/segments/guide")["tokens"]
        a = call(sock, "POST", "/v1/sessions", {"bot": "guide"})["id"]
        b = call(sock, "POST", "/v1/sessions", {"bot": "guide"})["id"]
        a1, a2 = tool_loop(sock, a, whole)
        b1, b2 = tool_loop(sock, b, stream)
        check(a1["calls"] == b1["calls"], "whole %s != streamed %s" % (a1["calls"], b1["calls"]))
        check(a2["content"] == b2["content"], "whole answer %r != streamed %r" % (a2["content"], b2["content"]))
        print("tool loop on a bot session: call %s, answer %r; turn 2 cached_tokens %d of %d; streamed twin equal" %
              (a1["calls"][0], a2["content"], cached(a2), a2["usage"]["prompt_tokens"]))
        # The tools block is shared: a third session's first turn finds it in the pool (past the chain).
        c = call(sock, "POST", "/v1/sessions", {"bot": "guide"})["id"]
        c1 = whole(sock, {"session": c, "messages": [{"role": "user", "content": "Weather in Rome?"}],
                          "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False, "temperature": 0,
                      "max_tokens": 200})
        check(cached(c1) > chain, "a new session with the same tools: cached_tokens %d, the bot's chain is %d tokens" %
              (cached(c1), chain))
        print("tools block shared: a new session's first turn has %d cached tokens (bot chain %d)" % (cached(c1), chain))
        check_transcript(sock, a, a1, a2, "transcript")
        # Rules: tools are the session's, fixed by its first turn.
        expect_error(sock, {"session": a, "messages": [{"role": "user", "content": "x"}], "tools": OTHER_TOOLS},
                     400, "tools", "other tools")
        plain = call(sock, "POST", "/v1/sessions", {"bot": "guide"})["id"]
        whole(sock, {"session": plain, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
        expect_error(sock, {"session": plain, "messages": [{"role": "user", "content": "x"}], "tools": TOOLS},
                     400, "tools", "turns without tools")
        expect_error(sock, {"session": a, "messages": [{"role": "user", "content": "x"}, {"role": "user", "content": "y"}]},
                     400, "messages", "are not the")
        check(call(sock, "GET", "/v1/sessions/" + a)["messages"] == 4, "refused requests changed the session")
        print("rules: other tools 400 (tools), tools after plain turns 400 (tools), two user messages 400 (messages)")
        # A bot without a session.
        nb = whole(sock, {"bot": "guide", "messages": [{"role": "user", "content": "Weather in Oslo?"}],
                          "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False, "temperature": 0,
                      "max_tokens": 200})
        check(nb["finish"] == "tool_calls" and nb["calls"][0][0] == "get_weather", "bot without session: %s" % nb)
        check(cached(nb) > chain, "bot without session: cached_tokens %d <= chain %d (the tools' segments not shared)" %
              (cached(nb), chain))
        responses_tool_loop(sock)
        whole_conversation_loop(sock)
        session_messages_with_tools(sock)
        # Restart: the session continues as its twin did without one (b, the same turns, before it).
        third = {"messages": [{"role": "user", "content": "And tomorrow?"}], "temperature": 0, "max_tokens": 24}
        b3 = whole(sock, dict(third, session=b))
        stop_towerd(p)
        p, sock = start_towerd(towerd, model, tmp, 2, CONFIG)
        check_transcript(sock, a, a1, a2, "after restart")
        a3 = whole(sock, dict(third, session=a))
        check(a3["calls"] == b3["calls"] and a3["content"] == b3["content"], "after restart %s != %s" % (a3, b3))
        check(call(sock, "GET", "/v1/sessions/" + a)["messages"] == 6, "turn 3 not recorded")
        print("restart: transcript and tools back; turn 3 %s equals the twin's" %
              (a3["calls"] if a3["calls"] else repr(a3["content"])))
        # An edit of the bot: the session goes on, on the new text (its tools' segments under it).
        call(sock, "PUT", "/v1/segments/guide", {"level": "bot", "parent": "plat", "text": "Your name is Guide. Be brief."})
        a4 = whole(sock, {"session": a, "messages": [{"role": "user", "content": "Thanks"}], "temperature": 0, "max_tokens": 8})
        check(a4["usage"]["prompt_tokens"] > a3["usage"]["prompt_tokens"], "after the bot's edit: %s" % a4)
        check(call(sock, "GET", "/v1/sessions/" + a)["messages"] == 8, "turn 4 not recorded")
        print("bot edited: the session's turn 4 ran on the new text (prompt %d tokens)" % a4["usage"]["prompt_tokens"])
    finally:
        stop_towerd(p)
    print("PASS")


if __name__ == "__main__":
    main()
