#!/usr/bin/env bash
# Tools on bots and sessions (issue 23): tests/daemon/session_tools.py (a tool loop on a bot session
# whole and streamed, cached_tokens covering the first turn, the tools block shared by sessions, the
# rules for a session's tools, a bot without a session, a restart continuing the session).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
towerd_setup "$1" "$2" "$3"
command -v python3 >/dev/null || { echo "SKIP: python3 not installed"; exit 77; }
python3 "$(dirname "$0")/session_tools.py" "$towerd" "$model" "$tmp" || { rc=$?; tail -20 "$tmp/towerd.log"; exit "$rc"; }
