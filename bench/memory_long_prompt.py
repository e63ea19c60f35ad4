#!/usr/bin/env python3
"""What one long prompt costs in RAM (issue 22, "8B memory"): towerd's resident set before and after a
prompt of N tokens (and its peak, VmHWM, reset just before the prompt), against the KV llama.cpp
allocates for the same context with its defaults (F16 K and V: 2 x n_layer x n_head_kv x head_dim x
2 B a token, its log's "KV self size"). The growth is the prompt's KV: its lease tail while it is
computed ([model] tail_format), then the segment it is sealed into (the transcript format). One
request, session-less, max_tokens 1.

    python3 bench/memory_long_prompt.py --towerd build/daemon/towerd --towerctl build/cli/towerctl \\
        --model M.gguf [--tokens 4096] [--tail f32|f16] [--threads 2]

Last line: memory model=NAME prompt_tokens=N tail=F growth_mb=G peak_growth_mb=P llama_cpp_f16_kv_mb=K
"""
import argparse
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from towerd_client import call, start_towerd, stop_towerd  # noqa: E402


def status_kb(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def llama_cpp_f16_kv_bytes_per_token(towerctl, model):
    info = subprocess.run([towerctl, "model", "info", model], capture_output=True, text=True, check=True).stdout
    m = re.search(r"n_layer (\d+), n_head (\d+), n_head_kv (\d+).*head_dim (\d+)", info)
    if not m:
        raise SystemExit("cannot read the model's shape from towerctl model info:\n" + info[:500])
    n_layer, n_head_kv, head_dim = int(m.group(1)), int(m.group(3)), int(m.group(4))
    return 2 * n_layer * n_head_kv * head_dim * 2


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--towerd", required=True)
    ap.add_argument("--towerctl", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--tail", choices=["f32", "f16"], default="f16")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    per_token = llama_cpp_f16_kv_bytes_per_token(a.towerctl, a.model)
    tmp = tempfile.mkdtemp(prefix="memory_long_prompt.")
    config = '[model]\ntail_format = "%s"\n[limits]\nrequest_timeout_seconds = 86400\n' % a.tail
    p, sock = start_towerd(a.towerd, a.model, tmp, a.threads, config)
    try:
        call(sock, "POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 1, "temperature": 0})  # weights in
        rng = random.Random(1)
        words = ["river", "stone", "lantern", "garden", "thunder", "velvet", "harbor", "meadow", "copper", "falcon"]
        prompt = " ".join(rng.choice(words) for _ in range(a.tokens))  # ~1 token a word
        base_kb = status_kb(p.pid, "VmRSS")
        with open("/proc/%d/clear_refs" % p.pid, "w") as f:
            f.write("5")  # VmHWM := VmRSS
        t0 = time.monotonic()
        r = call(sock, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 1, "temperature": 0}, timeout=86400)
        seconds = time.monotonic() - t0
        after_kb, peak_kb = status_kb(p.pid, "VmRSS"), status_kb(p.pid, "VmHWM")
        n = r["usage"]["prompt_tokens"]
    finally:
        stop_towerd(p)
        shutil.rmtree(tmp, ignore_errors=True)
    mb = lambda kb: kb / 1024.0
    llama = per_token * n / 2**20
    print("%d prompt tokens in %.1f s; towerd RSS %.1f MiB before, %.1f after (+%.1f), peak +%.1f; llama.cpp's F16 KV for "
          "the same context: %d B a token, %.1f MiB" % (n, seconds, mb(base_kb), mb(after_kb), mb(after_kb - base_kb),
                                                        mb(peak_kb - base_kb), per_token, llama))
    print("memory model=%s prompt_tokens=%d tail=%s growth_mb=%.0f peak_growth_mb=%.0f llama_cpp_f16_kv_mb=%.0f" %
          (os.path.basename(a.model), n, a.tail, mb(after_kb - base_kb), mb(peak_kb - base_kb), llama))


if __name__ == "__main__":
    main()
