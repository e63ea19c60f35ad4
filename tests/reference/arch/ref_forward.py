#!/usr/bin/env python3
"""An independent forward pass for the architecture tests: plain numpy in float64, written from the
published Hugging Face model definitions (transformers' modeling_qwen3.py, modeling_gemma2.py,
modeling_gemma3.py, modeling_phi3.py, modeling_mixtral.py, modeling_qwen2_moe.py, modeling_qwen3_moe.py,
modeling_olmoe.py), not from Towers' C++. It reads a GGUF file the way llama.cpp's converters write it
(gguf-py's metadata keys and tensor names) with a minimal reader of its own, maps it back to the HF
configuration and weights, and writes the logits of a fixed prompt plus 64 greedy tokens.

    python3 ref_forward.py MODEL.gguf OUT.ref [--ablate TRAIT]

OUT.ref (little-endian): b"TWAR", u32 version 1, u64 FNV-1a-64 of the GGUF file's bytes, u32 n_prompt,
u32 n_vocab, i32 prompt[n_prompt], f32 logits[n_prompt][n_vocab] (every prompt position),
u32 n_greedy, i32 greedy[n_greedy] (argmax decoding after the prompt, recomputed from scratch each step),
f32 decode_logits[n_greedy][n_vocab] (row i: the logits at the position of greedy[i], i.e. what predicts
greedy[i + 1]; the last rows reach far past the window).
--ablate turns one trait off (attn_softcap, final_softcap, window, qk_norm, post_norm, embd_scale, gelu,
rope_local, rope_scale, unpermute, topk_norm (flipped), qk_norm_per_head (olmoe), shared_expert, shared_gate, longrope_long (the
other factor set), attn_factor) and only prints how far the prompt's logits move: evidence that the test's
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
    c["rotary_dim"] = g("rope.dimension_count", c["head_dim"])  # Phi3's partial_rotary_factor * head_dim
    # Mixtures of experts. The experts' width: moe_intermediate_size (qwen MoE converters write it as
    # expert_feed_forward_length); Mixtral and OLMoE write theirs as feed_forward_length.
    c["num_experts"] = g("expert_count", 0)
    c["num_experts_per_tok"] = g("expert_used_count", 0)
    c["moe_intermediate_size"] = g("expert_feed_forward_length", c["intermediate_size"])
    c["shared_expert_intermediate_size"] = g("expert_shared_feed_forward_length")
    # norm_topk_prob: MixtralSparseMoeBlock always renormalises; Qwen3-MoE's released configs set it
    # true, Qwen2-MoE's (Qwen1.5-MoE-A2.7B) and OLMoE's false. A file may say so itself.
    c["norm_topk_prob"] = g("expert_weights_norm", arch in ("llama", "qwen3moe"))
    # Phi-3 LongRoPE: max_position_embeddings, original_max_position_embeddings, long/short factors
    # (read from the tensors below). Phi-4's converter writes sliding_window 0 for "none".
    c["max_position_embeddings"] = g("context_length")
    c["original_max_position_embeddings"] = g("rope.scaling.original_context_length")
    if arch == "phi3" and not c["sliding_window"]:
        c["sliding_window"] = None
    return c


def is_sliding(c, layer):
    if c["arch"] == "phi3":  # Phi3Model: one sliding-window mask for every layer when config.sliding_window is set
        return c["sliding_window"] is not None
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


def rope(x, pos, base, factor, dim, ext_factors=None, attention_factor=1.0):
    # HF's default/linear rotary embedding with rotate_half (x: [T, heads, head_dim]) on the first `dim`
    # dimensions (Phi3's partial rotary: the rest pass through). LongRoPE (_compute_longrope_parameters):
    # inv_freq = 1 / (ext_factors * base^(2i/dim)), cos and sin scaled by attention_factor.
    inv_freq = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)) / factor
    if ext_factors is not None:
        inv_freq = inv_freq / ext_factors
    freqs = np.outer(pos, inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb)[:, None, :] * attention_factor, np.sin(emb)[:, None, :] * attention_factor
    half = dim // 2
    xr, xp = x[..., :dim], x[..., dim:]
    rot = np.concatenate([-xr[..., half:], xr[..., :half]], axis=-1)
    return np.concatenate([xr * cos + rot * sin, xp], axis=-1)


def unpermute(w, n_head):
    # convert_hf_to_gguf.py's LlamaModel.permute interleaves each head's two halves so that llama.cpp's
    # adjacent-pair RoPE equals HF's rotate_half; this is its inverse, giving back HF's q_proj/k_proj.
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def longrope(c, T, ablate):
    # Phi3's rotary embedding with rope_scaling type longrope: the long factors when the sequence is
    # longer than original_max_position_embeddings (HF's dynamic update), attention_factor from the ratio
    # of the context lengths.
    orig, maxpos = c["original_max_position_embeddings"], c["max_position_embeddings"]
    if orig is None:
        return None, 1.0
    scale = maxpos / orig
    attention_factor = np.sqrt(1 + np.log(scale) / np.log(orig)) if scale > 1.0 else 1.0
    use_long = T > orig if ablate != "longrope_long" else not T > orig
    ext = c["rope_factors_long"] if use_long else c["rope_factors_short"]
    return ext, (attention_factor if ablate != "attn_factor" else 1.0)


def swiglu_mlp(x, gate, up, down):
    return (silu(x @ gate.T) * (x @ up.T)) @ down.T


def sparse_moe(c, W, p, x, ablate):
    # The Mixtral/Qwen2-MoE/Qwen3-MoE/OLMoE SparseMoeBlock: softmax over the router's logits, top-k,
    # renormalised when norm_topk_prob; plus Qwen2-MoE's shared expert under its sigmoid gate.
    logits = x @ W[p + "ffn_gate_inp.weight"].T
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    k = c["num_experts_per_tok"]
    top = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
    out = np.zeros_like(x)
    gate, up, down = W[p + "ffn_gate_exps.weight"], W[p + "ffn_up_exps.weight"], W[p + "ffn_down_exps.weight"]
    for t in range(x.shape[0]):
        w = probs[t, top[t]]
        if c["norm_topk_prob"] != (ablate == "topk_norm"):  # the ablation flips it
            w = w / w.sum()
        for j, e in enumerate(top[t]):
            out[t] += w[j] * swiglu_mlp(x[t:t + 1], gate[e], up[e], down[e])[0]
    if c["shared_expert_intermediate_size"] and ablate != "shared_expert":
        shared = swiglu_mlp(x, W[p + "ffn_gate_shexp.weight"], W[p + "ffn_up_shexp.weight"], W[p + "ffn_down_shexp.weight"])
        g = x @ W[p + "ffn_gate_inp_shexp.weight"]  # shared_expert_gate: Linear(hidden, 1)
        gate_value = 1.0 / (1.0 + np.exp(-g)) if ablate != "shared_gate" else np.ones_like(g)
        out = out + gate_value[:, None] * shared
    return out


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
    ext_factors, attention_factor = longrope(c, T, ablate)
    for l in range(c["num_hidden_layers"]):
        p = f"blk.{l}."
        x = norm(h, W[p + "attn_norm.weight"])
        if p + "attn_qkv.weight" in W:  # Phi3Attention's qkv_proj: query, key, value rows in that order
            qkv = x @ W[p + "attn_qkv.weight"].T
            q, k, v = qkv[:, :H * hd], qkv[:, H * hd:(H + KV) * hd], qkv[:, (H + KV) * hd:]
        else:
            wq, wk = W[p + "attn_q.weight"], W[p + "attn_k.weight"]
            if arch == "llama" and ablate != "unpermute":
                wq, wk = unpermute(wq, H), unpermute(wk, KV)
            q, k, v = x @ wq.T, x @ wk.T, x @ W[p + "attn_v.weight"].T
        if p + "attn_q.bias" in W:  # Qwen2(-MoE): q/k/v projections with bias
            q, k, v = q + W[p + "attn_q.bias"], k + W[p + "attn_k.bias"], v + W[p + "attn_v.bias"]
        if arch == "olmoe" and ablate == "qk_norm_per_head":  # the mistake of normalising each head alone
            qn, kn = W[p + "attn_q_norm.weight"].reshape(H, hd), W[p + "attn_k_norm.weight"].reshape(KV, hd)
            q = norm(q.reshape(T, H, hd), qn).reshape(T, H * hd)
            k = norm(k.reshape(T, KV, hd), kn).reshape(T, KV * hd)
        elif arch == "olmoe" and ablate != "qk_norm":  # OlmoeAttention: q_norm/k_norm over the whole projections
            q, k = norm(q, W[p + "attn_q_norm.weight"]), norm(k, W[p + "attn_k_norm.weight"])
        q, k, v = q.reshape(T, H, hd), k.reshape(T, KV, hd), v.reshape(T, KV, hd)
        if arch in ("qwen3", "gemma3", "qwen3moe") and ablate != "qk_norm":
            q, k = norm(q, W[p + "attn_q_norm.weight"]), norm(k, W[p + "attn_k_norm.weight"])
        sliding = is_sliding(c, l)
        if arch == "gemma3" and sliding and ablate != "rope_local":
            base, factor = c["rope_local_base_freq"], 1.0
        else:
            base, factor = c["rope_theta"], c["rope_linear_factor"] if ablate != "rope_scale" else 1.0
        rd = c["rotary_dim"]
        q = rope(q, pos, base, factor, rd, ext_factors, attention_factor)
        k = rope(k, pos, base, factor, rd, ext_factors, attention_factor)
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
        if c["num_experts"]:
            f = sparse_moe(c, W, p, x, ablate)
        elif arch == "phi3":  # Phi3MLP: gate_up_proj's output chunked in two, gate first
            gate, up = np.split(x @ W[p + "ffn_up.weight"].T, 2, axis=-1)
            f = (silu(gate) * up) @ W[p + "ffn_down.weight"].T
        else:
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
    c["rope_factors_long"] = W.get("rope_factors_long.weight")
    c["rope_factors_short"] = W.get("rope_factors_short.weight")
    n_vocab = W["token_embd.weight"].shape[0]
    ids = prompt(n_vocab)
    logits = forward(c, W, ids)
    if ablate:
        other = forward(c, W, ids, ablate)
        rel = np.abs(other - logits).max() / np.abs(logits).max()
        print(f"ablate {ablate}: max|dlogit| / max|logit| = {rel:.4g} (the test allows 1e-3)")
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
