#!/usr/bin/env bash
# The Vercel AI SDK's default OpenAI provider (npm "ai", "@ai-sdk/openai"), which uses
# POST /v1/responses, against towerd (stories260K): tests/daemon/ai_sdk_responses.mjs. The packages
# are installed with `npm ci` from tests/clients/ai_sdk_responses/package-lock.json (every version
# and its integrity pinned) into a temporary directory; without node and npm, or when the registry
# cannot be reached, the check is skipped (exit 77).
#   check_ai_sdk_responses.sh TOWERD SHARED_DIR TMP_ROOT
set -euo pipefail
. "$(dirname "$0")/lib.sh"
towerd_setup "$1" "$2" "$3"
node_checks ai_sdk_responses.mjs
cp "$(dirname "$0")/../clients/ai_sdk_responses/package.json" "$(dirname "$0")/../clients/ai_sdk_responses/package-lock.json" "$npm_dir/"
t0=$(date +%s)
(cd "$npm_dir" && npm ci --no-audit --no-fund --loglevel=error --cache "$npm_dir/.cache" >/dev/null) \
  || { echo "SKIP: npm ci of tests/clients/ai_sdk_responses failed (registry unreachable?)"; exit 77; }
echo "tests/clients/ai_sdk_responses/package-lock.json installed in $(( $(date +%s) - t0 )) s (node $(node --version))"
start
(sock_abs="$(realpath "$sock")" && cd "$npm_dir" && node ai_sdk_responses.mjs "$sock_abs") || fail "the AI SDK checks failed"
stop
