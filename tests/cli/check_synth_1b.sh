#!/usr/bin/env bash
# Acceptance: a synthetic Llama-3.2-1B-shaped Q4_0 file is described by `model info` and runs `generate`.
set -euo pipefail
towerctl="$1"; shared="${TOWERS_SHARED:-$2}"; work="$3"
mkdir -p "$work"; file="$work/synth-llama3.2-1b-q4_0.gguf"
trap 'rm -f "$file"' EXIT
TOWERS_SHARED="$shared" "$towerctl" model synth --shape llama3.2-1b --type q4_0 -o "$file"
info="$("$towerctl" model info "$file")"
echo "$info"
grep -q "architecture   llama" <<<"$info"
grep -q "n_embd 2048, n_layer 16, n_head 32, n_head_kv 8 (GQA 4), head_dim 64, n_ff 8192" <<<"$info"
grep -q "vocab          128256 tokens, embeddings tied" <<<"$info"
grep -q "Q4_0×112" <<<"$info"
grep -q "Q6_K×1" <<<"$info"
out="$("$towerctl" generate --model "$file" --prompt "Hello" --max-tokens 3 --temperature 0 --verbose 2>&1)"
echo "$out"
grep -q "generated 3 tokens" <<<"$out"
