#!/usr/bin/env python3
"""POST /v1/embeddings (issue 23), against towerd on stories260K:
  - a vector has the model's n_embd dimensions and unit L2 norm;
  - identical inputs give identical vectors (in one request and across requests), different inputs
    differ;
  - batch order does not change a vector (["a", "b"] and ["b", "a"] give the same two vectors), nor
    does the batch itself (an input alone gives the vector it has in a batch);
  - token ids embed as the text that encodes to them; base64 is the same float32 bytes;
  - usage.prompt_tokens counts every input's tokens; dimensions other than n_embd, bad inputs and
    unknown fields are 400 naming the field.

  embeddings.py TOWERD MODEL TMPDIR
"""
import base64
import json
import math
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from towerd_client import HttpError, call, start_towerd, stop_towerd  # noqa: E402

EMB = "/v1/embeddings"


def fail(msg):
    raise SystemExit("FAIL: " + msg)


def check(cond, msg):
    if not cond:
        fail(msg)


def vectors(sock, inputs, **extra):
    r = call(sock, "POST", EMB, dict({"input": inputs}, **extra))
    check(r["object"] == "list" and [d["index"] for d in r["data"]] == list(range(len(r["data"]))), "reply: %s" % str(r)[:300])
    return [d["embedding"] for d in r["data"]], r


def expect_error(sock, body, param):
    try:
        call(sock, "POST", EMB, body)
    except HttpError as e:
        check(e.status == 400 and ('"param":"%s"' % param) in str(e).replace(" ", ""), "%s: %s" % (body, e))
        return
    fail("accepted: %s" % body)


def main():
    towerd, model, tmp = sys.argv[1:4]
    p, sock = start_towerd(towerd, model, tmp, 2, "[cold]\nenabled = false\n")
    try:
        texts = ["Once upon a time", "The cat sat on the mat.", "Once upon a time"]
        vs, r = vectors(sock, texts)
        d = len(vs[0])
        check(d > 0 and all(len(v) == d for v in vs), "dimensions %s" % [len(v) for v in vs])
        for v in vs:
            check(abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-5, "norm %f" % math.sqrt(sum(x * x for x in v)))
        check(vs[0] == vs[2], "identical inputs differ")
        check(vs[0] != vs[1], "different inputs give the same vector")
        again, _ = vectors(sock, texts[0])
        check(again[0] == vs[0], "the same input alone differs from it in a batch")
        swapped, _ = vectors(sock, [texts[1], texts[0]])
        check(swapped == [vs[1], vs[0]], "batch order changed a vector")
        check(r["usage"]["prompt_tokens"] > 0 and r["usage"]["total_tokens"] == r["usage"]["prompt_tokens"], "usage %s" % r["usage"])
        b64, _ = vectors(sock, texts[:1], encoding_format="base64")
        raw = base64.b64decode(b64[0])
        check(list(struct.unpack("<%df" % d, raw)) == vs[0], "base64 is not the float vector")
        vectors(sock, texts[:1], dimensions=d)
        ids, rid = vectors(sock, [[1, 2, 3], [4, 5]])
        check(rid["usage"]["prompt_tokens"] == 5 and ids[0] != ids[1], "token ids: %s" % rid["usage"])
        one, _ = vectors(sock, [1, 2, 3])
        check(one[0] == ids[0], "an array of ids is one input")
        expect_error(sock, {"input": "x", "dimensions": d + 1}, "dimensions")
        expect_error(sock, {"input": "x", "encoding_format": "int8"}, "encoding_format")
        expect_error(sock, {"input": [{"text": "x"}]}, "input")
        expect_error(sock, {"input": []}, "input")
        expect_error(sock, {"input": [[]]}, "input")
        expect_error(sock, {"input": [10 ** 9]}, "input")
        expect_error(sock, {"input": "x", "pooling": "cls"}, "pooling")
        print("embeddings: %d dimensions, unit norm; identical inputs equal, different differ, batch order and "
              "batching change nothing; base64 = float32; %d prompt tokens for %d inputs" % (d, r["usage"]["prompt_tokens"], len(texts)))
    finally:
        stop_towerd(p)
    print("PASS")


if __name__ == "__main__":
    main()
