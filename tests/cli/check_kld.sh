#!/usr/bin/env bash
# Acceptance (issue 22): `towerctl perplexity --kl-divergence-base` against llama.cpp's own logits of the
# same GGUF (tests/reference/kld/: llama-perplexity's files, the GGUF's sha256 in refs.txt). Each model is
# rebuilt with `towerctl model synth` and must hash to the sha256 the reference was made from; then
# mean KL <= 0.01 nats and same top-1 >= 95%. stories260K is read from ../shared (SKIP when absent).
# Also: a file of another vocabulary, a truncated file and a file that is not one are refused by name.
set -euo pipefail
towerctl="$1"; shared="${TOWERS_SHARED:-$2}"; work="$3"
refs="$(cd "$(dirname "$0")/../reference/kld" && pwd)"
mkdir -p "$work"; tmp="$(mktemp -d "$work/kld-XXXXXX")"; trap 'rm -rf "$tmp"' EXIT
failed=0; checked=0
while read -r name source type ctx chunks sha; do
  [[ "$name" == \#* || -z "$name" ]] && continue
  case "$source" in
    shared:*) model="$shared/models/${source#shared:}"
              [ -f "$model" ] || { echo "SKIP: $name: $model not found (set TOWERS_SHARED)"; continue; } ;;
    synth:*) model="$tmp/$name.gguf"
             TOWERS_SHARED=/nonexistent "$towerctl" model synth --shape "${source#synth:}" --type "$type" \
               -o "$model" 2>/dev/null ;;
    *) echo "refs.txt: unknown source $source"; exit 1 ;;
  esac
  actual="$(sha256sum "$model" | cut -d' ' -f1)"
  if [ "$actual" != "$sha" ]; then
    echo "FAIL $name: $model hashes to $actual, the reference was computed from $sha" \
         "(the synthetic model changed: regenerate, tests/reference/kld/README.md)"
    failed=1; continue
  fi
  last="$("$towerctl" perplexity -m "$model" -t 2 --kl-divergence-base "$refs/$name.kld" 2>"$tmp/err" | tail -n 1)" \
    || { cat "$tmp/err"; echo "FAIL $name: towerctl perplexity failed"; failed=1; continue; }
  echo "$last"
  if [[ ! "$last" =~ ^kld\ model=([^ ]+)\ tokens=([0-9]+)\ mean_kld=(-?[0-9.]+)\ same_top_pct=([0-9.]+)$ ]]; then
    echo "FAIL $name: unexpected last line"; failed=1; continue
  fi
  expected_tokens=$(( chunks * (ctx - 1 - ctx / 2) ))
  [ "${BASH_REMATCH[2]}" = "$expected_tokens" ] || { echo "FAIL $name: $expected_tokens tokens expected"; failed=1; }
  awk -v k="${BASH_REMATCH[3]}" -v p="${BASH_REMATCH[4]}" 'BEGIN { exit !(k <= 0.01 && k > -1e-4 && p >= 95) }' \
    || { echo "FAIL $name: mean KL must be <= 0.01 nats and same top-1 >= 95%"; failed=1; }
  checked=$((checked + 1))
done < "$refs/refs.txt"

# Refusals, on tiny-llama-256-f16 (a vocabulary of 512) and tiny-qwen2 (1024).
model="$tmp/tiny-llama-256-f16.gguf"; [ -f "$model" ] || { echo "FAIL: tiny-llama-256-f16 was not built"; exit 1; }
ref="$refs/tiny-llama-256-f16.kld"
other="$tmp/other-vocab.gguf"
TOWERS_SHARED=/nonexistent "$towerctl" model synth --shape tiny-qwen2 --type f16 -o "$other" 2>/dev/null
refuse() {  # refuse WHAT PATTERN ARGS...: the command must fail with a message matching PATTERN
  local what="$1" pattern="$2"; shift 2
  if "$towerctl" perplexity "$@" >/dev/null 2>"$tmp/err"; then echo "FAIL: $what accepted"; failed=1; return; fi
  grep -Eq "$pattern" "$tmp/err" || { echo "FAIL: $what: message does not match '$pattern':"; cat "$tmp/err"; failed=1; }
  echo "refused ($what): $(head -n 1 "$tmp/err")"
}
refuse "another vocabulary" "vocabulary mismatch: the file has 512 tokens, the model 1024" \
  -m "$other" --kl-divergence-base "$ref"
head -c 5000 "$ref" > "$tmp/truncated.kld"
refuse "a truncated file" "truncated" -m "$model" --kl-divergence-base "$tmp/truncated.kld"
refuse "not a logits file" "not a llama.cpp logits file" -m "$model" --kl-divergence-base "$refs/refs.txt"
# A token outside the vocabulary: the first token of the file (offset 20) set to 4096.
cp "$ref" "$tmp/bad-token.kld"
printf '\x00\x10\x00\x00' | dd of="$tmp/bad-token.kld" bs=1 seek=20 conv=notrunc status=none
refuse "a token outside the vocabulary" "token mismatch: chunk 0 position 0 holds token 4096" \
  -m "$model" --kl-divergence-base "$tmp/bad-token.kld"
refuse "--file with --kl-divergence-base" "excludes" -m "$model" --kl-divergence-base "$ref" --file "$ref"
# The check tells models apart: the same architecture with other weights (mixtral's file against olmoe's
# logits, both of 512 tokens) is far outside the bounds.
last="$("$towerctl" perplexity -m "$tmp/tiny-mixtral-f16.gguf" -t 2 --kl-divergence-base "$refs/tiny-olmoe-f16.kld" \
          2>/dev/null | tail -n 1)"
echo "another model's logits: $last"
[[ "$last" =~ mean_kld=([0-9.]+)\ same_top_pct=([0-9.]+)$ ]] \
  && awk -v k="${BASH_REMATCH[1]}" -v p="${BASH_REMATCH[2]}" 'BEGIN { exit !(k > 0.1 && p < 50) }' \
  || { echo "FAIL: another model's logits pass as the same model's"; failed=1; }
[ "$failed" = 0 ] || exit 1
echo "kld checks passed ($checked references)"
