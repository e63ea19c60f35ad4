#!/usr/bin/env bash
# Acceptance: towerctl codec round-trips a slice of the TinyStories corpus through stories260K to the
# exact bytes (one chunk, and chunks of 64 decoded as a batch), prints the documented final lines,
# costs at most 1% + 64 bits over the model's own NLL, and refuses damaged containers and other models.
# Then the reference passage: its record (what it costs a store) is at most 109 bytes and a quarter of
# `zstd -19` of the text (docs/codec.md, "Measurements"; the numbers are printed).
set -euo pipefail
towerctl="$1"; shared="${TOWERS_SHARED:-$2}"; tmp="${3:-/tmp}/check_codec.$$"
model="$shared/models/stories260K.gguf"; corpus="$shared/corpora/tinystories_val_subset.txt"
[ -f "$model" ] && [ -f "$corpus" ] || { echo "SKIP: $model or $corpus not found (set TOWERS_SHARED)"; exit 77; }
mkdir -p "$tmp"; trap 'rm -rf "$tmp"' EXIT

# Whole lines, so the slice is valid UTF-8; a leading space exercises SentencePiece's dummy prefix.
{ printf ' '; head -n 300 "$corpus"; } > "$tmp/in.txt"

# One thread: on a loaded 2-core machine spinning pool workers only slow a model this small down.
enc_re='^codec tokens=([0-9]+) bytes_in=([0-9]+) bytes_out=([0-9]+) record_bytes=([0-9]+) bits_per_token=([0-9.]+) nll_bits=([0-9.]+) overhead_pct=(-?[0-9.]+) encode_tok_s=([0-9.]+)$'
dec_re='^codec decode_tok_s=([0-9.]+) chunks=([0-9]+)$'
for chunk in 0 64; do
  last="$("$towerctl" codec encode --model "$model" --in "$tmp/in.txt" --out "$tmp/c$chunk.tcz" \
          --window 512 --chunk "$chunk" --threads 1 2>/dev/null | tail -n 1)"
  echo "chunk $chunk: $last"
  [[ "$last" =~ $enc_re ]] || { echo "unexpected encode line"; exit 1; }
  tokens="${BASH_REMATCH[1]}"; bytes_in="${BASH_REMATCH[2]}"; bytes_out="${BASH_REMATCH[3]}"; nll="${BASH_REMATCH[6]}"
  [ "$bytes_in" -eq "$(wc -c < "$tmp/in.txt")" ] || { echo "bytes_in is not the input size"; exit 1; }
  [ "$bytes_out" -eq "$(wc -c < "$tmp/c$chunk.tcz")" ] || { echo "bytes_out is not the container size"; exit 1; }
  [ "$tokens" -gt 1000 ] || { echo "too few tokens: $tokens"; exit 1; }
  if [ "$chunk" = 0 ]; then
    # The whole container (header included) costs at most 1% + 64 bits over the model's own NLL.
    awk -v o="$bytes_out" -v l="$nll" 'BEGIN { exit !(8 * o - l <= 0.01 * l + 64) }' \
      || { echo "$((8 * bytes_out)) bits is more than 1% + 64 bits over the NLL of $nll bits"; exit 1; }
  fi
  last="$("$towerctl" codec decode --model "$model" --in "$tmp/c$chunk.tcz" --out "$tmp/out$chunk.txt" \
          --threads 1 2>/dev/null | tail -n 1)"
  echo "chunk $chunk: $last"
  [[ "$last" =~ $dec_re ]] || { echo "unexpected decode line"; exit 1; }
  want=1; [ "$chunk" = 64 ] && want=$(( (tokens + 63) / 64 ))
  [ "${BASH_REMATCH[2]}" -eq "$want" ] || { echo "chunks=${BASH_REMATCH[2]}, expected $want"; exit 1; }
  cmp "$tmp/in.txt" "$tmp/out$chunk.txt" || { echo "round trip is not exact"; exit 1; }
done

# `codec info` names the arithmetic a container was coded with (docs/codec.md, store header flags).
info="$("$towerctl" codec info "$tmp/c0.tcz")"
for want in "kernels fast" "rounding ggml" "packed_set 1"; do
  grep -qx "$want" <<< "$info" || { echo "codec info lacks '$want':"; echo "$info"; exit 1; }
done

# A damaged container is refused (non-zero exit, a message naming the CRC), and so is another model.
cp "$tmp/c0.tcz" "$tmp/bad.tcz"
byte=$(od -An -tu1 -j40 -N1 "$tmp/bad.tcz" | tr -d ' ')
printf "\\x$(printf %02x $(( byte ^ 255 )))" | dd of="$tmp/bad.tcz" bs=1 seek=40 conv=notrunc status=none
if "$towerctl" codec decode --model "$model" --in "$tmp/bad.tcz" --out "$tmp/bad.txt" 2> "$tmp/err.txt"; then
  echo "a damaged container was decoded"; exit 1
fi
grep -q CRC "$tmp/err.txt" || { echo "no CRC error: $(cat "$tmp/err.txt")"; exit 1; }
other="$shared/models/babyllama105.gguf"
if [ -f "$other" ]; then
  if "$towerctl" codec decode --model "$other" --in "$tmp/c0.tcz" --out "$tmp/bad.txt" 2> "$tmp/err.txt"; then
    echo "decoded with another model"; exit 1
  fi
  grep -q "another model" "$tmp/err.txt" || { echo "no fingerprint error: $(cat "$tmp/err.txt")"; exit 1; }
fi

# The reference passage (449 tokens, 843.1 bits of NLL = 105.4 bytes): one segment's record.
passage="$shared/reference/stories260K.passage.txt"
if [ -f "$passage" ]; then
  last="$("$towerctl" codec encode --model "$model" --in "$passage" --out "$tmp/p.tcz" --threads 1 2>/dev/null | tail -n 1)"
  [[ "$last" =~ $enc_re ]] || { echo "unexpected encode line: $last"; exit 1; }
  file="${BASH_REMATCH[3]}"; record="${BASH_REMATCH[4]}"; nll="${BASH_REMATCH[6]}"
  "$towerctl" codec decode --model "$model" --in "$tmp/p.tcz" --out "$tmp/p.txt" --threads 1 > /dev/null 2>&1 \
    || { echo "the passage does not decode"; exit 1; }
  cmp "$passage" "$tmp/p.txt" || { echo "passage round trip is not exact"; exit 1; }
  zstd_bytes=-
  if command -v zstd > /dev/null; then zstd_bytes="$(zstd -19 -c "$passage" | wc -c)"; fi
  echo "passage: $(wc -c < "$passage") bytes of text, NLL $nll bits ($(awk -v l="$nll" 'BEGIN { printf "%.1f", l / 8 }') bytes);" \
       "record $record bytes, standalone file $file bytes; zstd -19 $zstd_bytes bytes"
  [ "$record" -le 109 ] || { echo "the passage's record is $record bytes, more than 109"; exit 1; }
  if [ "$zstd_bytes" != - ]; then
    [ $((4 * record)) -le "$zstd_bytes" ] || { echo "the record is not 4x smaller than zstd -19"; exit 1; }
  else
    echo "(zstd not installed: scripts/install-deps.sh installs it; the 4x comparison was skipped)"
  fi
fi
echo "codec round trips exact"
