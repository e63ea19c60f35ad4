#!/usr/bin/env python3
"""response_format end to end (issue 14): towerd on stories260K answers 100 sampled chat completions
(temperature 1, 5 schemas, 5 requests of n = 4 choices each) constrained by a JSON schema; every
choice must parse as JSON and validate against its schema, checked by the small validator below
(written from the JSON Schema spec for the keywords these schemas use; it shares no code with the
engine's schema compiler). Also: json_object gives a JSON object, and a schema towerd cannot compile
is a 400 naming response_format.

  structured.py TOWERD MODEL TMPDIR
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from towerd_client import HttpError, call, start_towerd, stop_towerd  # noqa: E402

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"},
                                      "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3}},
     "required": ["name", "age", "tags"], "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                      "size": {"anyOf": [{"type": "number"}, {"type": "null"}]}, "ok": {"type": "boolean"},
                                      "v": {"const": "x1"}},
     "required": ["color", "size", "ok", "v"], "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": ["string", "null"], "maxLength": 5},
                                      "c": {"type": "boolean"}}, "required": ["b"], "additionalProperties": False},
    {"$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                         "required": ["x", "y"], "additionalProperties": False}},
     "type": "object", "properties": {"points": {"type": "array", "items": {"$ref": "#/$defs/point"}, "minItems": 1, "maxItems": 3}},
     "required": ["points"], "additionalProperties": False},
    {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 8}, "minItems": 2, "maxItems": 4},
]


def type_ok(v, t):
    return {"object": isinstance(v, dict), "array": isinstance(v, list), "string": isinstance(v, str),
            "boolean": isinstance(v, bool), "null": v is None,
            "integer": isinstance(v, int) and not isinstance(v, bool),
            "number": isinstance(v, (int, float)) and not isinstance(v, bool)}[t]


def errors(v, s, root, where="#"):
    """What is wrong with value v under schema s (empty: valid)."""
    if "$ref" in s:
        node = root
        for part in s["$ref"][2:].split("/"):
            node = node[part]
        return errors(v, node, root, where)
    out = []
    if "type" in s:
        ts = s["type"] if isinstance(s["type"], list) else [s["type"]]
        if not any(type_ok(v, t) for t in ts):
            return ["%s: %r is not of type %s" % (where, v, ts)]
    if "enum" in s and v not in s["enum"]:
        out.append("%s: %r not in enum" % (where, v))
    if "const" in s and v != s["const"]:
        out.append("%s: %r is not the const" % (where, v))
    if "anyOf" in s and all(errors(v, sub, root, where) for sub in s["anyOf"]):
        out.append("%s: %r matches no anyOf branch" % (where, v))
    if isinstance(v, str):
        n = len(v)
        if n > s.get("maxLength", n) or n < s.get("minLength", 0):
            out.append("%s: length %d out of bounds" % (where, n))
    if isinstance(v, list):
        if len(v) > s.get("maxItems", len(v)) or len(v) < s.get("minItems", 0):
            out.append("%s: %d items out of bounds" % (where, len(v)))
        for i, x in enumerate(v):
            out += errors(x, s.get("items", {}), root, "%s/%d" % (where, i))
    if isinstance(v, dict):
        props = s.get("properties", {})
        out += ["%s: missing %s" % (where, k) for k in s.get("required", []) if k not in v]
        if s.get("additionalProperties", True) is False:
            out += ["%s: undeclared %s" % (where, k) for k in v if k not in props]
        for k, x in v.items():
            if k in props:
                out += errors(x, props[k], root, "%s/%s" % (where, k))
    return out


def main():
    towerd, model, tmp = sys.argv[1:4]
    p, sock = start_towerd(towerd, model, tmp, 2, "[cold]\nenabled = false\n")
    try:
        valid = total = 0
        finishes = {}
        for si, schema in enumerate(SCHEMAS):
            for r in range(5):
                body = {"messages": [{"role": "user", "content": "Describe it as JSON."}], "temperature": 1, "seed": 100 * si + r,
                        "n": 4, "max_tokens": 256,
                        "response_format": {"type": "json_schema", "json_schema": {"name": "s%d" % si, "schema": schema, "strict": True}}}
                reply = call(sock, "POST", "/v1/chat/completions", body)
                for ch in reply["choices"]:
                    total += 1
                    finishes[ch["finish_reason"]] = finishes.get(ch["finish_reason"], 0) + 1
                    text = ch["message"]["content"]
                    try:
                        problems = errors(json.loads(text), schema, schema)
                    except ValueError as e:
                        problems = ["not JSON: %s" % e]
                    if problems:
                        print("schema %d seed %d: %r: %s" % (si, 100 * si + r, text, "; ".join(problems[:3])))
                    else:
                        valid += 1
        print("json_schema: %d of %d sampled replies validate (finish reasons %s)" % (valid, total, finishes))
        # json_object bounds nothing, so a random model may still be inside a string at max_tokens
        # ("length", as OpenAI ends it too); every reply that stopped by itself must be an object.
        stopped = 0
        for seed in range(8):
            ch = call(sock, "POST", "/v1/chat/completions",
                      {"messages": [{"role": "user", "content": "JSON please."}], "temperature": 1, "seed": seed,
                       "max_tokens": 200, "response_format": {"type": "json_object"}})["choices"][0]
            text = ch["message"]["content"]
            if not text.lstrip().startswith("{"):
                raise SystemExit("FAIL: json_object reply does not start an object: %r" % text)
            if ch["finish_reason"] == "stop":
                stopped += 1
                if not isinstance(json.loads(text), dict):
                    raise SystemExit("FAIL: json_object gave %r" % text)
        print("json_object: 8 replies start an object, %d ended by themselves and parse as one" % stopped)
        try:
            call(sock, "POST", "/v1/chat/completions",
                 {"messages": [{"role": "user", "content": "x"}],
                  "response_format": {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "integer", "multipleOf": 2}}}})
            raise SystemExit("FAIL: an unsupported schema keyword was accepted")
        except HttpError as e:
            if e.status != 400 or "response_format" not in str(e) or "multipleOf" not in str(e):
                raise SystemExit("FAIL: an unsupported schema keyword gave %s" % e)
        if valid != total or total != 100:
            raise SystemExit("FAIL: %d of %d replies validate" % (valid, total))
        print("structured output: OK")
    finally:
        stop_towerd(p)


if __name__ == "__main__":
    main()
