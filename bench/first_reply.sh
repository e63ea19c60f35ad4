#!/usr/bin/env bash
# How long a new user waits for the first reply: scripts/run.sh on a clean build directory, without
# ccache, each line of its output stamped with the seconds since the start. The reply is the line
# after "> MESSAGE"; `time` adds the CPU seconds (user + sys) of everything run. Run it with no other
# jobs on the machine: wall times scale with the load (uptime is printed before and after).
#   bench/first_reply.sh [BUILD_DIR]      (default: a temporary directory, removed afterwards)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$(mktemp -d)}"
[ $# -gt 0 ] || trap 'rm -rf "$build"' EXIT
rm -rf "$build"
unset CMAKE_CXX_COMPILER_LAUNCHER CMAKE_C_COMPILER_LAUNCHER
export TOWERS_BUILD_DIR="$build"
uptime
start=$EPOCHREALTIME
{ time "$root/scripts/run.sh" "Once upon a time"; } 2>&1 | while IFS= read -r line; do
  awk -v s="$start" -v n="$EPOCHREALTIME" -v l="$line" 'BEGIN { printf "%8.1f %s\n", n - s, l }'
done
uptime
