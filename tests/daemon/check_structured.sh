#!/usr/bin/env bash
# response_format end to end: tests/daemon/structured.py (100 sampled replies under 5 JSON schemas all
# validate, json_object, an unsupported schema refused with 400).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
towerd_setup "$1" "$2" "$3"
command -v python3 >/dev/null || { echo "SKIP: python3 not installed"; exit 77; }
python3 "$(dirname "$0")/structured.py" "$towerd" "$model" "$tmp" || { rc=$?; tail -20 "$tmp/towerd.log"; exit "$rc"; }
