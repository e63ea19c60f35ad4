#!/usr/bin/env bash
# KL divergence on files requantized by llama.cpp's llama-quantize (issue 22): our synth writes an F16
# model, llama-quantize turns it into each type, llama-perplexity writes its logits of that file, and
# towerctl perplexity --kl-divergence-base compares ours. Nothing is kept (the files are not rebuildable
# without llama.cpp, so no test reads them); it prints one line per file for bench/README.md.
#   tests/reference/kld/requant.sh LLAMA_CPP_BIN_DIR TOWERCTL [SHARED]
set -euo pipefail
bin="$1"; towerctl="$2"; shared="${3:-${TOWERS_SHARED:-$(dirname "$0")/../../../../shared}}"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
head -c 40000 "$shared/corpora/tinystories_val_subset.txt" > "$work/text.txt"
shapes=(${SHAPES:-tiny-llama-256 tiny-mixtral tiny-qwen2moe tiny-olmoe tiny-gemma2-l26})
types=(${TYPES:-Q8_0 Q4_0 Q5_1 Q2_K Q3_K_M Q4_K_M Q5_K_M IQ4_NL IQ4_XS})
for shape in "${shapes[@]}"; do
  TOWERS_SHARED=/nonexistent "$towerctl" model synth --shape "$shape" --type f16 -o "$work/f16.gguf" 2>/dev/null
  for type in "${types[@]}"; do
    "$bin/llama-quantize" "$work/f16.gguf" "$work/q.gguf" "$type" 2 > "$work/quantize.log" 2>&1 \
      || { cat "$work/quantize.log"; exit 1; }
    "$bin/llama-perplexity" -m "$work/q.gguf" -f "$work/text.txt" -c 128 -b 128 --chunks 4 -t 2 -ctk f32 -ctv f32 \
      --kl-divergence-base "$work/q.kld" > "$work/ppl.log" 2>&1 || { cat "$work/ppl.log"; exit 1; }
    line="$("$towerctl" perplexity -m "$work/q.gguf" -t 2 --kl-divergence-base "$work/q.kld" 2>/dev/null | tail -n 1)"
    echo "requant shape=$shape type=$type ${line#kld model=q }"
  done
done
