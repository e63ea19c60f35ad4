#!/usr/bin/env bash
# What common client code does (issue 23): fresh seeds without "seed" (replayable from towers.seed),
# "name" on messages, tool_choice "required" whole and streamed alike, one new message per session
# request. tests/daemon/clients.py says what each check asserts.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
towerd_setup "$1" "$2" "$3"
command -v python3 >/dev/null || { echo "SKIP: python3 not installed"; exit 77; }
python3 "$(dirname "$0")/clients.py" "$towerd" "$model" "$tmp" || { rc=$?; tail -20 "$tmp/towerd.log"; exit "$rc"; }
