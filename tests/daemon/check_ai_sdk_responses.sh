#!/usr/bin/env bash
# The Vercel AI SDK's default OpenAI provider (npm "ai", "@ai-sdk/openai", pinned below), which uses
# POST /v1/responses, against towerd (stories260K): tests/daemon/ai_sdk_responses.mjs. The packages
# are installed from the npm registry into a temporary directory; without node and npm, or when the
# registry cannot be reached, the check is skipped (exit 77).
#   check_ai_sdk_responses.sh TOWERD SHARED_DIR TMP_ROOT
set -euo pipefail
. "$(dirname "$0")/lib.sh"
towerd_setup "$1" "$2" "$3"
AI_NPM_VERSION=6.0.326
AI_SDK_OPENAI_NPM_VERSION=3.0.141
node_checks ai_sdk_responses.mjs
t0=$(date +%s)
(cd "$npm_dir" && npm install --no-audit --no-fund --loglevel=error --cache "$npm_dir/.cache" \
   "ai@$AI_NPM_VERSION" "@ai-sdk/openai@$AI_SDK_OPENAI_NPM_VERSION" >/dev/null) \
  || { echo "SKIP: npm install ai@$AI_NPM_VERSION @ai-sdk/openai@$AI_SDK_OPENAI_NPM_VERSION failed (registry unreachable?)"; exit 77; }
echo "ai@$AI_NPM_VERSION @ai-sdk/openai@$AI_SDK_OPENAI_NPM_VERSION installed in $(( $(date +%s) - t0 )) s (node $(node --version))"
start
(sock_abs="$(realpath "$sock")" && cd "$npm_dir" && node ai_sdk_responses.mjs "$sock_abs") || fail "the AI SDK checks failed"
stop
