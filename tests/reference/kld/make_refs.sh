#!/usr/bin/env bash
# Writes the reference logits files of tests/cli/check_kld.sh with llama.cpp's llama-perplexity and the
# manifest refs.txt (name, model source, type, sha256 of the GGUF the logits were computed from).
#   tests/reference/kld/make_refs.sh LLAMA_CPP_BIN_DIR TOWERCTL [SHARED]
# LLAMA_CPP_BIN_DIR holds llama-perplexity (built as README.md here says, outside this repository).
# Run it only when synth.cc or the list below changes; commit the .kld files and refs.txt it writes.
set -euo pipefail
bin="$1"; towerctl="$2"; shared="${3:-${TOWERS_SHARED:-$(dirname "$0")/../../../../shared}}"
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
corpus="$shared/corpora/tinystories_val_subset.txt"
[ -f "$corpus" ] || { echo "$corpus not found (give SHARED)"; exit 1; }
head -c 40000 "$corpus" > "$work/text.txt"

# name source type ctx chunks: source is shared:FILE (shared/models/FILE) or synth:SHAPE (towerctl model
# synth --shape SHAPE --type TYPE, which llama.cpp c392e50 can run: not qwen3, qwen3moe or gemma3).
# Types whose activations are quantized in 32-element blocks (the 64-wide shapes' fallbacks too) score
# 252 tokens: there our logits and llama.cpp's differ by more (mean KL ~7e-4 against ~2e-6 for F16 and
# the K types; llama.cpp rounds those blocks' scales to f16, we keep them f32), enough to flip the top
# token where a random model's top two are that close (4-6% of tokens), so that 93 tokens put the 95%
# bound within a token or two of chance.
# The other tiny-* shapes are 64 wide, so their super-block types fall back to 32-element ones (synth.cc's
# pick_type, as llama-quantize does); the 256-wide tiny-llama-256 carries the K and IQ4_XS types.
refs=(
  "stories260K shared:stories260K.gguf f32 128 4"
  "tiny-llama-256-f16 synth:tiny-llama-256 f16 64 3"
  "tiny-llama-256-q8_0 synth:tiny-llama-256 q8_0 128 4"
  "tiny-llama-256-q4_0 synth:tiny-llama-256 q4_0 128 4"
  "tiny-llama-256-q5_1 synth:tiny-llama-256 q5_1 128 4"
  "tiny-llama-256-q2_k synth:tiny-llama-256 q2_k 64 3"
  "tiny-llama-256-q3_k_m synth:tiny-llama-256 q3_k_m 64 3"
  "tiny-llama-256-q4_k_m synth:tiny-llama-256 q4_k_m 64 3"
  "tiny-llama-256-q5_k_m synth:tiny-llama-256 q5_k_m 64 3"
  "tiny-llama-256-iq4_nl synth:tiny-llama-256 iq4_nl 128 4"
  "tiny-llama-256-iq4_xs synth:tiny-llama-256 iq4_xs 64 3"
  "tiny-qwen2-f16 synth:tiny-qwen2 f16 64 3"
  "tiny-gemma2-l26-f16 synth:tiny-gemma2-l26 f16 64 3"
  "tiny-gemma2-l26-q4_0 synth:tiny-gemma2-l26 q4_0 128 4"
  "tiny-phi3-f16 synth:tiny-phi3-full-rope f16 64 3"
  "tiny-phi3-q8_0 synth:tiny-phi3-full-rope q8_0 128 4"
  "tiny-mixtral-f16 synth:tiny-mixtral f16 64 3"
  "tiny-mixtral-q4_k_m synth:tiny-mixtral q4_k_m 128 4"
  "tiny-qwen2moe-f16 synth:tiny-qwen2moe f16 64 3"
  "tiny-qwen2moe-q5_1 synth:tiny-qwen2moe q5_1 128 4"
  "tiny-olmoe-f16 synth:tiny-olmoe f16 64 3"
  "tiny-olmoe-iq4_nl synth:tiny-olmoe iq4_nl 128 4"
)
manifest="$work/refs.txt"
echo "# name source type ctx chunks sha256-of-the-gguf (written by make_refs.sh)" > "$manifest"
for ref in "${refs[@]}"; do
  read -r name source type ctx chunks <<<"$ref"
  case "$source" in
    shared:*) model="$shared/models/${source#shared:}" ;;
    synth:*) model="$work/$name.gguf"
             TOWERS_SHARED=/nonexistent "$towerctl" model synth --shape "${source#synth:}" --type "$type" -o "$model" 2>/dev/null ;;
  esac
  sha="$(sha256sum "$model" | cut -d' ' -f1)"
  run="$model"
  if [[ "$source" == synth:tiny-phi3* ]]; then
    # llama.cpp gives Phi-3's chat tokens (<|end|>, ...) attributes when general.name contains "phi3",
    # and fails on a vocabulary without them; it runs a copy whose name says "phi_" (one byte apart,
    # nothing the forward pass reads).
    run="$work/$name.llama.gguf"
    perl -0777 -pe 's/tiny-phi3-/tiny-phi_-/' "$model" > "$run"
    [ "$(cmp -l "$model" "$run" | wc -l)" = 1 ] || { echo "$name: the name patch changed more than one byte"; exit 1; }
  fi
  "$bin/llama-perplexity" -m "$run" -f "$work/text.txt" -c "$ctx" -b "$ctx" --chunks "$chunks" -t 2 \
    -ctk f32 -ctv f32 --kl-divergence-base "$here/$name.kld" > "$work/$name.log" 2>&1 \
    || { cat "$work/$name.log"; echo "llama-perplexity failed on $name"; exit 1; }
  echo "$name $source $type $ctx $chunks $sha" >> "$manifest"
  echo "$name: $(grep -o 'Final estimate.*' "$work/$name.log" || true)"
done
cp "$manifest" "$here/refs.txt"
