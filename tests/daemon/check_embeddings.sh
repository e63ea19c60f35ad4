#!/usr/bin/env bash
# POST /v1/embeddings (issue 23): tests/daemon/embeddings.py (unit vectors, identical inputs equal,
# different inputs differ, batch order and batching change nothing, base64, usage, errors by field).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
towerd_setup "$1" "$2" "$3"
command -v python3 >/dev/null || { echo "SKIP: python3 not installed"; exit 77; }
python3 "$(dirname "$0")/embeddings.py" "$towerd" "$model" "$tmp" || { rc=$?; tail -20 "$tmp/towerd.log"; exit "$rc"; }
