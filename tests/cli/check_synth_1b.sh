#!/usr/bin/env bash
# Acceptance: a synthetic Llama-3.2-1B-shaped Q4_0 file is described by `model info` (its memory plan
# too) and runs `generate`.
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
# The memory plan: K and V of 16 layers x 8 KV heads x 64 dims, 2 bytes each at f16 = 32 KiB a token,
# so a 1 GiB budget holds 32768 tokens at f16 and 16384 at f32 (request tails).
plan="$("$towerctl" model info "$file" --ram-budget 1G)"
grep -Eq "f16 +32.00 KiB +32768  \(request tails with \[model\] tail_format = \"f16\"\)$" <<<"$plan"
grep -Eq "f32 +64.00 KiB +16384  \(request tails\)$" <<<"$plan"
grep -q 'ram_budget = "1G"' <<<"$plan"
if "$towerctl" model info "$file" --ram-budget 5x 2>/dev/null; then echo "a bad --ram-budget was accepted"; exit 1; fi
out="$("$towerctl" generate --model "$file" --prompt "Hello" --max-tokens 3 --temperature 0 --verbose 2>&1)"
echo "$out"
grep -q "generated 3 tokens" <<<"$out"
