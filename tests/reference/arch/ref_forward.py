#!/usr/bin/env python3
"""An independent forward pass for the architecture tests: plain numpy in float64, written from the
published Hugging Face model definitions (transformers' modeling_qwen3.py, modeling_gemma2.py,
modeling_gemma3.py), not from Towers' C++. It reads a GGUF file the way llama.cpp's converters write it
(gguf-py's metadata keys and tensor names) with a minimal reader of its own, maps it back to the HF
configuration and weights, and writes the logits of a fixed prompt plus 64 greedy tokens.

    python3 ref_forward.py MODEL.gguf OUT.ref [--ablate TRAIT]

OUT.ref (little-endian): b"TWAR", u32 version 1, u64 FNV-1a-64 of the GGUF file's bytes, u32 n_prompt,
u32 n_vocab, i32 prompt[n_prompt], f32 logits[n_prompt][n_vocab] (every prompt position),
u32 n_greedy, i32 greedy[n_greedy] (argmax decoding after the prompt, recomputed from scratch each step),
f32 decode_logits[n_greedy][n_vocab] (row i: the logits at the position of greedy[i], i.e. what predicts
greedy[i + 1]; the last rows reach far past the window).
--ablate turns one trait off (attn_softcap, final_softcap, window, qk_norm, post_norm, embd_scale, gelu,
rope_local, rope_scale) and only prints how far the prompt's logits move: evidence that the test's
tolerance would see that trait missing.
"""
import struct
import sys

import numpy as np

N_PROMPT = 24
N_GREEDY = 64


# ---- GGUF (v2/v3) reader: metadata and F32/F16 tensors ----
SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class Reader:
    def __init__(self, data):
        self.data, self.at = data, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.data, self.at)[0]
        self.at += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = self.data[self.at:self.at + n].decode("utf-8")
        self.at += n
        return s

    def value(self, t):
        if t in SCALAR:
            return self.take(SCALAR[t])
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.take("<I"), self.take("<Q")
            return [self.value(et) for _ in range(n)]
        raise ValueError(f"unknown GGUF value type {t}")


def read_gguf(path):
    data = open(path, "rb").read()
    r = Reader(data)
    if data[:4] != b"GGUF":
        raise ValueError("not a GGUF file")
    r.at = 4
    version, n_tensors, n_kv = r.take("<I"), r.take("<Q"), r.take("<Q")
    assert version in (2, 3)
    meta = {}
    for _ in range(n_kv):
        key = r.string()
        meta[key] = r.value(r.take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.take("<Q") for _ in range(r.take("<I"))]
        infos.append((name, dims, r.take("<I"), r.take("<Q")))
    align = meta.get("general.alignment", 32)
    base = (r.at + align - 1) // align * align
    tensors = {}
    for name, dims, gtype, off in infos:
        n = int(np.prod(dims))
        dtype = {0: np.float32, 1: np.float16}.get(gtype)
        if dtype is None:
            raise ValueError(f"{name}: ggml type {gtype} (the reference reads F32 and F16 only)")
        a = np.frombuffer(data, dtype=dtype, count=n, offset=base + off).astype(np.float64)
        # ggml's ne[0] is the fastest dimension: [cols, rows] is a numpy (rows, cols), HF's (out, in).
        tensors[name] = a.reshape(list(reversed(dims)))
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return meta, tensors, h


# ---- The HF configuration and weights a GGUF came from ----
def hf_config(meta):
    arch = meta["general.architecture"]
    g = lambda k, d=None: meta.get(f"{arch}.{k}", d)
    c = dict(
        arch=arch,
        hidden_size=g("embedding_length"),
        num_hidden_layers=g("block_count"),
        intermediate_size=g("feed_forward_length"),
        num_attention_heads=g("attention.head_count"),
        num_key_value_heads=g("attention.head_count_kv"),
        rms_norm_eps=g("attention.layer_norm_rms_epsilon"),
        rope_theta=g("rope.freq_base", 10000.0),
    )
    c["head_dim"] = g("attention.key_length", c["hidden_size"] // c["num_attention_heads"])
    # Every released Gemma 2/3 except the 27B has query_pre_attn_scalar == head_dim; the converters do
    # not write it. Qwen3 scales by head_dim ** -0.5.
    c["query_pre_attn_scalar"] = c["head_dim"]
    c["sliding_window"] = g("attention.sliding_window")
    c["attn_logit_softcapping"] = g("attn_logit_softcapping") if arch == "gemma2" else None
    c["final_logit_softcapping"] = g("final_logit_softcapping") if arch == "gemma2" else None
    c["rope_linear_factor"] = g("rope.scaling.factor", 1.0) if g("rope.scaling.type") == "linear" else 1.0
    c["rope_local_base_freq"] = 10000.0  # Gemma3TextConfig's default (not written by the converter)
    c["sliding_window_pattern"] = 6      # Gemma3TextConfig's default
    return c


def is_sliding(c, layer):
    if c["arch"] == "gemma2":  # Gemma2DecoderLayer: is_sliding = not bool(layer_idx % 2)
        return not (layer % 2)
    if c["arch"] == "gemma3":  # Gemma3DecoderLayer: bool((layer_idx + 1) % config.sliding_window_pattern)
        return bool((layer + 1) % c["sliding_window_pattern"])
    return False


# ---- The forward pass ----
def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def gemma_rmsnorm(x, w_gguf, eps):
    # Gemma(2|3)RMSNorm multiplies by (1 + weight); llama.cpp's converter stores weight + 1.
    w_hf = w_gguf - 1.0
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 + w_hf)


def rope(x, pos, base, factor, dim):
    # HF's default/linear rotary embedding with rotate_half (x: [T, heads, dim]).
    inv_freq = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)) / factor
    freqs = np.outer(pos, inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]
    half = dim // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rot * sin


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def silu(x):
    return x / (1.0 + np.exp(-x))


def forward(c, W, ids, ablate=None):
    arch, T = c["arch"], len(ids)
    gemma = arch.startswith("gemma")
    d, H, KV, hd, eps = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["rms_norm_eps"]
    norm = (lambda x, w: gemma_rmsnorm(x, w, eps)) if gemma else (lambda x, w: rmsnorm(x, w, eps))
    pos = np.arange(T, dtype=np.float64)
    h = W["token_embd.weight"][ids]
    if gemma and ablate != "embd_scale":
        h = h * np.sqrt(d)  # Gemma*Model: hidden_states * normalizer (hidden_size ** 0.5)
    for l in range(c["num_hidden_layers"]):
        p = f"blk.{l}."
        x = norm(h, W[p + "attn_norm.weight"])
        q = (x @ W[p + "attn_q.weight"].T).reshape(T, H, hd)
        k = (x @ W[p + "attn_k.weight"].T).reshape(T, KV, hd)
        v = (x @ W[p + "attn_v.weight"].T).reshape(T, KV, hd)
        if arch in ("qwen3", "gemma3") and ablate != "qk_norm":
            q, k = norm(q, W[p + "attn_q_norm.weight"]), norm(k, W[p + "attn_k_norm.weight"])
        sliding = is_sliding(c, l)
        if arch == "gemma3" and sliding and ablate != "rope_local":
            base, factor = c["rope_local_base_freq"], 1.0
        else:
            base, factor = c["rope_theta"], c["rope_linear_factor"] if ablate != "rope_scale" else 1.0
        q, k = rope(q, pos, base, factor, hd), rope(k, pos, base, factor, hd)
        k, v = np.repeat(k, H // KV, axis=1), np.repeat(v, H // KV, axis=1)
        scaling = (c["query_pre_attn_scalar"] if gemma else hd) ** -0.5
        s = np.einsum("thd,shd->hts", q, k) * scaling
        cap = c["attn_logit_softcapping"]
        if cap and ablate != "attn_softcap":
            s = np.tanh(s / cap) * cap
        i, j = np.arange(T)[:, None], np.arange(T)[None, :]
        visible = j <= i
        if sliding and ablate != "window":
            visible &= j > i - c["sliding_window"]
        s = np.where(visible[None], s, -np.inf)
        a = np.exp(s - s.max(axis=-1, keepdims=True))
        a /= a.sum(axis=-1, keepdims=True)
        o = np.einsum("hts,shd->thd", a, v).reshape(T, H * hd) @ W[p + "attn_output.weight"].T
        if gemma and ablate != "post_norm":
            o = norm(o, W[p + "post_attention_norm.weight"])
        h = h + o
        x = norm(h, W[p + "ffn_norm.weight"])
        act = gelu_tanh if gemma and ablate != "gelu" else silu
        f = (act(x @ W[p + "ffn_gate.weight"].T) * (x @ W[p + "ffn_up.weight"].T)) @ W[p + "ffn_down.weight"].T
        if gemma and ablate != "post_norm":
            f = norm(f, W[p + "post_ffw_norm.weight"])
        h = h + f
    h = norm(h, W["output_norm.weight"])
    logits = h @ W.get("output.weight", W["token_embd.weight"]).T
    cap = c["final_logit_softcapping"]
    if cap and ablate != "final_softcap":
        logits = np.tanh(logits / cap) * cap
    return logits


def prompt(n_vocab):
    return [(7 + 37 * i + (i * i) % 11) % n_vocab for i in range(N_PROMPT)]


def main():
    args = sys.argv[1:]
    ablate = None
    if "--ablate" in args:
        ablate = args[args.index("--ablate") + 1]
        args = [a for a in args if a not in ("--ablate", ablate)]
    meta, W, fnv = read_gguf(args[0])
    c = hf_config(meta)
    n_vocab = W["token_embd.weight"].shape[0]
    ids = prompt(n_vocab)
    logits = forward(c, W, ids)
    if ablate:
        other = forward(c, W, ids, ablate)
        rel = np.abs(other - logits).max() / np.abs(logits).max()
        print(f"ablate {ablate}: max|dlogit| / max|logit| = {rel:.3g} (the test allows 1e-3)")
        return
    seq = list(ids)
    for _ in range(N_GREEDY):
        seq.append(int(np.argmax(forward(c, W, seq)[-1])))
    decode_logits = forward(c, W, seq)[len(ids):]
    with open(args[1], "wb") as out:
        out.write(b"TWAR" + struct.pack("<IQII", 1, fnv, len(ids), n_vocab))
        out.write(np.asarray(ids, dtype="<i4").tobytes())
        out.write(logits.astype("<f4").tobytes())
        out.write(struct.pack("<I", N_GREEDY) + np.asarray(seq[len(ids):], dtype="<i4").tobytes())
        out.write(decode_logits.astype("<f4").tobytes())
    print(f"{args[1]}: {c['arch']} prompt {len(ids)} tokens, max|logit| {np.abs(logits).max():.4g}, greedy {seq[len(ids):][:8]}...")


if __name__ == "__main__":
    main()
