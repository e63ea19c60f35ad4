#!/usr/bin/env bash
# Conformance: the official OpenAI Node SDK (npm "openai", pinned below) against towerd (stories260K)
# over its Unix socket — chat, streaming with and without usage, seeds (none: a fresh one per request),
# logprobs, penalties and logit_bias, n choices, /v1/completions, /v1/responses (create chained by
# previous_response_id, stream, retrieve, delete), errors (tests/daemon/openai_sdk_client.mjs has the
# checks). The package is installed from the npm registry into a temporary directory; without node and
# npm the check is skipped (exit 77).
#   check_openai_sdk.sh TOWERD SHARED_DIR TMP_ROOT [CHECK...]
set -euo pipefail
. "$(dirname "$0")/lib.sh"
towerd_setup "$1" "$2" "$3"
shift 3
# 6.x: the newest line that still runs on Debian 12's Node 18 (7.x wants Node 22).
OPENAI_NPM_VERSION=6.49.0
node_checks openai_sdk_client.mjs
t0=$(date +%s)
(cd "$npm_dir" && npm install --no-audit --no-fund --loglevel=error --cache "$npm_dir/.cache" "openai@$OPENAI_NPM_VERSION" >/dev/null) \
  || fail "npm install openai@$OPENAI_NPM_VERSION failed"
echo "openai@$OPENAI_NPM_VERSION installed in $(( $(date +%s) - t0 )) s (node $(node --version))"
start
(sock_abs="$(realpath "$sock")" && cd "$npm_dir" && node openai_sdk_client.mjs "$sock_abs" "$@") || fail "the OpenAI SDK checks failed"
stop
