#!/usr/bin/env bash
# response_format end to end: tests/daemon/structured.py (100 sampled replies under 5 JSON schemas all
# validate, json_object, an unsupported schema refused with 400).
set -euo pipefail
towerd="$1"; shared="${TOWERS_SHARED:-$2}"; tmp_root="$3"
model="$shared/models/stories260K.gguf"
[ -f "$model" ] || { echo "SKIP: $model not found (set TOWERS_SHARED)"; exit 77; }
command -v python3 >/dev/null || { echo "SKIP: python3 not installed"; exit 77; }
mkdir -p "$tmp_root"
tmp="$(mktemp -d "$tmp_root/structured.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
python3 "$(dirname "$0")/structured.py" "$towerd" "$model" "$tmp" || { rc=$?; tail -20 "$tmp/towerd.log"; exit "$rc"; }
