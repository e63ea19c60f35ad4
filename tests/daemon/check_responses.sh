#!/usr/bin/env bash
# OpenAI's Responses API on sessions (issue 23): tests/daemon/responses.py (3 chained turns with
# cached_tokens covering every earlier turn, the streamed events' order, GET/DELETE, a restart
# continuing the chain, text.format, store: false, errors that name the field).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
towerd_setup "$1" "$2" "$3"
command -v python3 >/dev/null || { echo "SKIP: python3 not installed"; exit 77; }
python3 "$(dirname "$0")/responses.py" "$towerd" "$model" "$tmp" || { rc=$?; tail -20 "$tmp/towerd.log"; exit "$rc"; }
