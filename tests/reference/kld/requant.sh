#!/usr/bin/env bash
# KL divergence on files requantized by llama.cpp's llama-quantize (issue 22): our synth writes an F16
# model, llama-quantize turns it into each type, llama-perplexity writes its logits of that file, and
# towerctl perplexity --kl-divergence-base compares ours. Nothing is kept (the files are not rebuildable
# without llama.cpp, so no test reads them); it prints one line per file for bench/README.md.
#   tests/reference/kld/requant.sh LLAMA_CPP_BIN_DIR TOWERCTL [SHARED]
# CHUNKS (default 16): 128-token chunks scored, 63 tokens each (16: 1008 tokens; the share of same top-1
# tokens then has a standard error of ~0.7 points, ~1.4 at 4 chunks).
# LLAMA_CPP_BIN2: a second llama.cpp build (e.g. cmake -DGGML_LLAMAFILE=OFF, or -DGGML_NATIVE=OFF
# -DGGML_AVX512=OFF): each line then also gives llama.cpp's own spread, its second build's logits of the
# same file against the first's (llama-perplexity --kl-divergence), as "llama.cpp2=KL/TOP1". It is the
# floor that rounding alone reaches on a model: two correct kernels that sum in another order.
set -euo pipefail
bin="$1"; towerctl="$2"; shared="${3:-${TOWERS_SHARED:-$(dirname "$0")/../../../../shared}}"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
head -c 40000 "$shared/corpora/tinystories_val_subset.txt" > "$work/text.txt"
read -r -a shapes <<< "${SHAPES:-tiny-llama-256 tiny-mixtral tiny-qwen2moe tiny-olmoe tiny-gemma2-l26}"
read -r -a types <<< "${TYPES:-Q8_0 Q4_0 Q5_1 Q2_K Q3_K_M Q4_K_M Q5_K_M IQ4_NL IQ4_XS}"
chunks="${CHUNKS:-16}"
# BIN_DIR LOG ARGS...: llama-perplexity of BIN_DIR on the quantized file with the KL base file, into LOG.
perplexity() {
  local dir="$1" log="$2"; shift 2
  "$dir/llama-perplexity" -m "$work/q.gguf" -f "$work/text.txt" -c 128 -b 128 --chunks "$chunks" -t 2 -ctk f32 -ctv f32 \
    --kl-divergence-base "$work/q.kld" "$@" > "$log" 2>&1 || { cat "$log"; exit 1; }
}
for shape in "${shapes[@]}"; do
  TOWERS_SHARED=/nonexistent "$towerctl" model synth --shape "$shape" --type f16 -o "$work/f16.gguf" 2>/dev/null
  for type in "${types[@]}"; do
    "$bin/llama-quantize" "$work/f16.gguf" "$work/q.gguf" "$type" 2 > "$work/quantize.log" 2>&1 \
      || { cat "$work/quantize.log"; exit 1; }
    perplexity "$bin" "$work/ppl.log"
    line="$("$towerctl" perplexity -m "$work/q.gguf" -t 2 --kl-divergence-base "$work/q.kld" 2>/dev/null | tail -n 1)"
    spread=""
    if [ -n "${LLAMA_CPP_BIN2:-}" ]; then
      perplexity "$LLAMA_CPP_BIN2" "$work/ppl2.log" --kl-divergence
      spread=" llama.cpp2=$(awk '/^Mean +KLD:/ { k = $3 } /^Same top p:/ { p = $4 } END { printf "%.6f/%.3f", k, p }' "$work/ppl2.log")"
    fi
    echo "requant shape=$shape type=$type ${line#kld model=q }$spread"
  done
done
