#!/usr/bin/env python3
"""POST /v1/responses end to end (issue 23), against towerd on stories260K:
  - three chained turns through previous_response_id are one session's turns 1, 2, 3 (ids
    resp_<session>_<n>), and each turn's usage.input_tokens_details.cached_tokens covers every
    earlier turn: the previous turn's whole prompt and its reply (all but its last token, which was
    sampled and never evaluated), so only the new input is prefilled;
  - a streamed turn: the typed events in OpenAI's order, each with an "event:" line equal to its
    "type" and sequence_number 0, 1, 2, ...; the deltas join to the completed response's text;
  - GET /v1/responses/{id} gives back each turn's text and the previous_response_id chain;
  - a restart continues the chain (the id is derived from the session's records) with the
    earlier turns still served from segments;
  - text.format json_schema gives JSON that follows the schema;
  - store: false keeps nothing (no session, GET is 404) and takes a whole conversation;
  - DELETE deletes the chain's session; errors are 4xx naming the field (unknown field, tools,
    function_call input items, outputs without previous_response_id, two messages with store, not the latest previous_response_id, other
    instructions on a continued session, instructions with bot, unknown ids).

  responses.py TOWERD MODEL TMPDIR
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from towerd_client import UnixHTTPConnection, call, send, start_towerd, stop_towerd  # noqa: E402

RESP = "/v1/responses"
CONFIG = "[cold]\nenabled = false\n"
STREAM_ORDER = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
                "response.output_text.done", "response.content_part.done", "response.output_item.done"]


def fail(msg):
    raise SystemExit("FAIL: " + msg)


def check(cond, msg):
    if not cond:
        fail(msg)


def text_of(r):
    return "".join(p["text"] for item in r["output"] for p in item["content"] if p["type"] == "output_text")


def error_of(sock, method, path, body=None):
    """(HTTP status, error object) of a request that must fail."""
    c = UnixHTTPConnection(sock)
    resp = send(c, method, path, None if body is None else json.dumps(body))
    data = json.loads(resp.read())
    c.close()
    check(resp.status >= 400, "%s %s %s: expected an error, got %s" % (method, path, json.dumps(body)[:200], json.dumps(data)[:200]))
    return resp.status, data["error"]


def expect_error(sock, body, status, param, code=None, method="POST", path=RESP):
    got, err = error_of(sock, method, path, body)
    check(got == status, "%s: HTTP %d, expected %d (%s)" % (json.dumps(body)[:160], got, status, err))
    check(err["param"] == param, "%s: param %r, expected %r (%s)" % (json.dumps(body)[:160], err["param"], param, err["message"]))
    if code:
        check(err["code"] == code, "%s: code %r, expected %r" % (json.dumps(body)[:160], err["code"], code))


def covers(prev, cur, what):
    """cur's cached tokens cover all of prev's turn: its prompt and its reply but the last token."""
    need = prev["usage"]["input_tokens"] + prev["usage"]["output_tokens"] - 1
    got = cur["usage"]["input_tokens_details"]["cached_tokens"]
    check(got >= need, "%s: cached_tokens %d < %d (the previous turn's prompt %d + reply %d - 1)" %
          (what, got, need, prev["usage"]["input_tokens"], prev["usage"]["output_tokens"]))
    check(cur["usage"]["input_tokens"] > got, "%s: nothing new prefilled?" % what)
    return got


def stream(sock, body):
    """A streamed response: [(event name, data)]."""
    c = UnixHTTPConnection(sock)
    r = send(c, "POST", RESP, json.dumps(dict(body, stream=True)))
    if r.status != 200:
        fail("stream: HTTP %d %s" % (r.status, r.read()[:300]))
    check(r.getheader("Content-Type", "").startswith("text/event-stream"), "stream: content type")
    raw = r.read().decode()
    c.close()
    events = []
    for block in raw.split("\n\n"):
        if not block:
            continue
        lines = block.split("\n")
        check(len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "),
              "stream: a block that is not 'event:' + 'data:': %r" % block[:200])
        events.append((lines[0][len("event: "):], json.loads(lines[1][len("data: "):])))
    return events


def main():
    towerd, model, tmp = sys.argv[1:4]
    p, sock = start_towerd(towerd, model, tmp, 2, CONFIG)
    try:
        base = {"max_output_tokens": 12, "temperature": 0, "instructions": "Tell a short story."}
        # -- three chained turns
        r1 = call(sock, "POST", RESP, dict(base, input="Once upon a time"))
        check(r1["object"] == "response" and r1["status"] in ("completed", "incomplete"), "r1: %s" % r1)
        session = r1["session"]
        check(r1["id"] == "resp_%s_1" % session, "r1 id %s" % r1["id"])
        check(r1["instructions"] == "Tell a short story." and r1["previous_response_id"] is None, "r1 echo")
        check(r1["bot"].startswith("responses."), "r1 bot %s" % r1["bot"])
        check(r1["usage"]["output_tokens"] > 0 and text_of(r1), "r1 has no text")
        r2 = call(sock, "POST", RESP, dict(base, input="The cat", previous_response_id=r1["id"]))
        check(r2["id"] == "resp_%s_2" % session and r2["previous_response_id"] == r1["id"], "r2 id %s" % r2["id"])
        c2 = covers(r1, r2, "turn 2")
        r3 = call(sock, "POST", RESP, {"input": [{"role": "user", "content": [{"type": "input_text", "text": "The dog"}]}],
                                       "previous_response_id": r2["id"], "max_output_tokens": 12, "temperature": 0})
        check(r3["id"] == "resp_%s_3" % session, "r3 id %s" % r3["id"])
        check(r3["instructions"] == "Tell a short story.", "r3 instructions are the session's: %r" % r3["instructions"])
        c3 = covers(r2, r3, "turn 3")
        print("chain: cached_tokens %d of %d (turn 2), %d of %d (turn 3)" %
              (c2, r2["usage"]["input_tokens"], c3, r3["usage"]["input_tokens"]))
        # -- read back
        for r, prev in ((r1, None), (r2, r1["id"]), (r3, r2["id"])):
            g = call(sock, "GET", RESP + "/" + r["id"])
            check(text_of(g) == text_of(r), "GET %s: %r != %r" % (r["id"], text_of(g), text_of(r)))
            check(g["previous_response_id"] == prev and g["status"] == "completed", "GET %s: %s" % (r["id"], g))
            check(g["output"][0]["id"] == r["output"][0]["id"], "GET %s: item id" % r["id"])
        # -- streamed turn 4
        events = stream(sock, {"input": "A bird", "previous_response_id": r3["id"], "max_output_tokens": 12, "temperature": 0})
        names = [e[0] for e in events]
        for i, (name, data) in enumerate(events):
            check(data["type"] == name and data["sequence_number"] == i, "event %d: %s %s" % (i, name, data))
        deltas = [d for n, d in events if n == "response.output_text.delta"]
        check(deltas, "no delta events")
        want = STREAM_ORDER[:4] + ["response.output_text.delta"] * len(deltas) + STREAM_ORDER[4:]
        check(names[:-1] == want and names[-1] in ("response.completed", "response.incomplete"), "event order: %s" % names)
        r4 = events[-1][1]["response"]
        check(r4["id"] == "resp_%s_4" % session, "r4 id %s" % r4["id"])
        check("".join(d["delta"] for d in deltas) == text_of(r4), "deltas != the completed text")
        covers(r3, r4, "turn 4 (streamed)")
        check(text_of(call(sock, "GET", RESP + "/" + r4["id"])) == text_of(r4), "GET r4")
        # -- the AI SDK's shape with stored responses: the whole conversation, earlier replies as item
        # references; it continues the session (only the new message prefilled) when it is that session's
        conv = [{"role": "system", "content": "Tell a short story."}]
        for r, said in ((r1, "Once upon a time"), (r2, "The cat"), (r3, "The dog")):
            conv += [{"role": "user", "content": [{"type": "input_text", "text": said}]},
                     {"type": "item_reference", "id": r["output"][0]["id"]}]
        expect_error(sock, {"input": conv + [{"role": "user", "content": "x"}]}, 400, "previous_response_id")  # r3 is not the latest
        conv += [{"role": "user", "content": [{"type": "input_text", "text": "A bird"}]},
                 {"type": "item_reference", "id": r4["output"][0]["id"]}]
        edited = [dict(m) for m in conv]
        edited[3] = {"role": "user", "content": "The mouse"}
        expect_error(sock, {"input": edited + [{"role": "user", "content": "x"}]}, 400, "input")
        expect_error(sock, {"input": conv[:-1] + [{"type": "item_reference", "id": "msg_nosuch_1"}, {"role": "user", "content": "x"}]},
                     404, "input", "response_not_found")
        r5 = call(sock, "POST", RESP, {"input": conv + [{"role": "user", "content": "The sun"}], "max_output_tokens": 12, "temperature": 0})
        check(r5["id"] == "resp_%s_5" % session and r5["previous_response_id"] == r4["id"], "item references: %s" % r5["id"])
        c5 = covers(r4, r5, "turn 5 (item references)")
        print("item references: turn 5 cached_tokens %d of %d" % (c5, r5["usage"]["input_tokens"]))
        # -- errors
        expect_error(sock, {"input": "x", "temprature": 1}, 400, "temprature", "unknown_parameter")
        expect_error(sock, {"input": "x", "max_tokens": 4}, 400, "max_tokens", "unknown_parameter")
        expect_error(sock, {"input": "x", "max_output_tokens": 0}, 400, "max_output_tokens")
        expect_error(sock, {"input": "x", "tools": [{"type": "web_search"}]}, 400, "tools[0].type", "unsupported_parameter")
        expect_error(sock, {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]}, 400, "input")
        expect_error(sock, {"input": [{"type": "function_call_output", "call_id": "c", "output": "1"}]}, 400, "input")
        expect_error(sock, {"input": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                      {"role": "user", "content": "c"}]}, 400, "input")
        expect_error(sock, {"input": "x", "previous_response_id": r2["id"]}, 400, "previous_response_id")
        expect_error(sock, {"input": "x", "previous_response_id": r5["id"], "instructions": "Be rude."}, 400, "instructions")
        expect_error(sock, {"input": "x", "previous_response_id": "resp_nosuch_1"}, 404, "previous_response_id",
                     "response_not_found")
        expect_error(sock, {"input": "x", "previous_response_id": "resp_%s_9" % session}, 404, "previous_response_id")
        expect_error(sock, {"input": "x", "text": {"format": {"type": "json_schema", "name": "n", "schema": {"not": {}}}}},
                     400, "text.format.schema")
        expect_error(sock, {"input": "x", "model": "gpt-9"}, 404, "model", "model_not_found")
        # a first response that cannot run leaves no session behind
        sessions = len(call(sock, "GET", "/v1/sessions")["data"])
        expect_error(sock, {"input": "Once upon a time " * 1200}, 400, "input", "context_length_exceeded")
        expect_error(sock, {"input": "x", "bot": "nosuch"}, 404, "bot", "segment_not_found")
        check(len(call(sock, "GET", "/v1/sessions")["data"]) == sessions, "a refused first response left a session")
        expect_error(sock, None, 404, None, "response_not_found", "GET", RESP + "/resp_nosuch_1")
        expect_error(sock, None, 405, None, "method_not_allowed", "GET", RESP)
        check(call(sock, "GET", "/v1/sessions/" + session)["messages"] == 10, "the errors changed the session")
        # -- a bot of the hierarchy
        call(sock, "PUT", "/v1/segments/acme", {"level": "platform", "text": "Stories for children."})
        call(sock, "PUT", "/v1/segments/teller", {"level": "bot", "parent": "acme", "text": "You tell stories."})
        expect_error(sock, {"input": "x", "bot": "teller", "instructions": "i"}, 400, "instructions")
        b1 = call(sock, "POST", RESP, {"input": "Once", "bot": "teller", "max_output_tokens": 6, "temperature": 0})
        check(b1["bot"] == "teller" and b1["instructions"] is None, "bot response: %s" % b1)
        check(call(sock, "GET", "/v1/sessions/" + b1["session"])["bot"] == "teller", "bot response's session")
        # -- text.format json_schema
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
        js = call(sock, "POST", RESP, {"input": "Answer", "max_output_tokens": 48, "temperature": 0, "store": False,
                                       "text": {"format": {"type": "json_schema", "name": "a", "schema": schema, "strict": True}}})
        check(js["status"] == "completed", "json_schema reply cut short: %s" % js)
        value = json.loads(text_of(js))
        check(isinstance(value, dict) and set(value) == {"ok"} and isinstance(value["ok"], bool), "json_schema: %r" % value)
        # -- store: false keeps nothing
        before = len(call(sock, "GET", "/v1/sessions")["data"])
        u = call(sock, "POST", RESP, {"store": False, "max_output_tokens": 8, "temperature": 0,
                                      "input": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                                                {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Once"}]})
        check(u["store"] is False and "session" not in u and text_of(u), "store false: %s" % u)
        expect_error(sock, None, 404, None, "response_not_found", "GET", RESP + "/" + u["id"])
        u2 = call(sock, "POST", RESP, {"store": False, "input": "The end", "previous_response_id": r2["id"],
                                       "max_output_tokens": 8, "temperature": 0})
        check(u2["previous_response_id"] == r2["id"] and text_of(u2), "store false from turn 2: %s" % u2)
        check(len(call(sock, "GET", "/v1/sessions")["data"]) == before, "store false made a session")
        check(call(sock, "GET", "/v1/sessions/" + session)["messages"] == 10, "store false changed the session")
        # -- restart: the chain continues, its turns still served from segments
        stop_towerd(p)
        p, sock = start_towerd(towerd, model, tmp, 2, CONFIG)
        r6 = call(sock, "POST", RESP, {"input": "The moon", "previous_response_id": r5["id"], "max_output_tokens": 12,
                                       "temperature": 0})
        check(r6["id"] == "resp_%s_6" % session, "after the restart: %s" % r6["id"])
        c6 = covers(r5, r6, "turn 6 after the restart")
        print("after a restart: turn 6 cached_tokens %d of %d" % (c6, r6["usage"]["input_tokens"]))
        check(text_of(call(sock, "GET", RESP + "/" + r1["id"])) == text_of(r1), "GET r1 after the restart")
        # -- DELETE: the chain's session goes
        d = call(sock, "DELETE", RESP + "/" + r3["id"])
        check(d == {"id": r3["id"], "object": "response", "deleted": True, "session": session}, "DELETE: %s" % d)
        expect_error(sock, None, 404, None, "response_not_found", "GET", RESP + "/" + r1["id"])
        expect_error(sock, {"input": "x", "previous_response_id": r6["id"]}, 404, "previous_response_id", "response_not_found")
        expect_error(sock, None, 404, None, "session_not_found", "GET", "/v1/sessions/" + session)
        print("responses: OK")
    finally:
        stop_towerd(p)


if __name__ == "__main__":
    main()
