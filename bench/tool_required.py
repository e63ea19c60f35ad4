#!/usr/bin/env python3
"""tool_choice "required" with the default parallel_tool_calls on stories260K (issue 23 item 4): for
each towerd given, 12 seeded requests (temperature 1, max_tokens 400) asked whole and streamed; prints
the finish reasons, how many whole/streamed pairs agree (content, calls, finish), how many whole
replies carry <tool_call> markup in their content, and the calls returned. The tools' schemas use no
bounds, so a towerd from before issue 23 compiles them too.

  bench/tool_required.py MODEL TOWERD [TOWERD...]
"""
import copy
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "daemon"))
import clients  # noqa: E402
from towerd_client import start_towerd, stop_towerd  # noqa: E402


def main():
    model, towerds = sys.argv[1], sys.argv[2:]
    tools = copy.deepcopy(clients.TOOLS)
    for k in ("a", "b"):
        tools[1]["function"]["parameters"]["properties"][k] = {"type": "integer"}
    for towerd in towerds:
        with tempfile.TemporaryDirectory() as tmp:
            p, sock = start_towerd(towerd, model, tmp, 2, "[cold]\nenabled = false\n")
            try:
                finishes, agree, markup, calls = {}, 0, 0, 0
                for seed in range(12):
                    body = {"messages": [{"role": "user", "content": "What is the weather in Paris, and 2 + 3?"}],
                            "tools": tools, "tool_choice": "required", "temperature": 1, "seed": seed, "max_tokens": 400}
                    w, s = clients.whole(sock, body), clients.stream(sock, body)
                    agree += w[:3] == s[:3]
                    markup += "<tool_call>" in w[0]
                    calls += len(w[1])
                    finishes[w[2]] = finishes.get(w[2], 0) + 1
                print("%s: finish %s, whole == streamed %d/12, markup in the content %d/12, %d calls"
                      % (towerd, finishes, agree, markup, calls))
            finally:
                stop_towerd(p)


if __name__ == "__main__":
    main()
