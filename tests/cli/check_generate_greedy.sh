#!/usr/bin/env bash
# Acceptance: towerctl generate from BOS, greedy, 256 tokens, prints exactly the published sample.
set -euo pipefail
towerctl="$1"; shared="${TOWERS_SHARED:-$2}"
model="$shared/models/stories260K.gguf"; expected="$shared/models/stories260K.greedy-from-bos.txt"
[ -f "$model" ] && [ -f "$expected" ] || { echo "SKIP: $model or $expected not found (set TOWERS_SHARED)"; exit 77; }
out="$(mktemp)"; trap 'rm -f "$out"' EXIT
"$towerctl" generate --model "$model" --prompt "" --max-tokens 256 --temperature 0 --threads 2 >"$out"
cmp "$out" "$expected" && echo "greedy output matches $expected"
# Same text with one thread.
"$towerctl" generate --model "$model" --prompt "" --max-tokens 256 --temperature 0 --threads 1 | cmp - "$expected"
