#!/usr/bin/env bash
# Issue 23's client suite (tests/clients/suite/suite.mjs): the Vercel AI SDK 6 (@ai-sdk/openai-compatible
# and the default @ai-sdk/openai provider) and LangChain JS 1.x against towerd (stories260K), one
# towerd for all of it. The packages are installed with `npm ci` from tests/clients/suite/package-lock.json
# (every version and its integrity pinned) into a temporary directory; without node and npm, or when
# the registry cannot be reached, the check is skipped (exit 77); LangChain's checks are skipped by
# name on a node older than 20.
#   check_client_suite.sh TOWERD SHARED_DIR TMP_ROOT [CHECK...]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/../daemon/lib.sh"
towerd_setup "$1" "$2" "$3"
shift 3
node_checks node_client.mjs
cp "$here"/suite/package.json "$here"/suite/package-lock.json "$here"/suite/*.mjs "$npm_dir/"
t0=$(date +%s)
(cd "$npm_dir" && npm ci --no-audit --no-fund --loglevel=error --cache "$npm_dir/.cache" >/dev/null) \
  || { echo "SKIP: npm ci of tests/clients/suite failed (registry unreachable?)"; exit 77; }
echo "tests/clients/suite/package-lock.json installed in $(( $(date +%s) - t0 )) s (node $(node --version))"
start
(sock_abs="$(realpath "$sock")" && cd "$npm_dir" && node suite.mjs "$sock_abs" "$@") || fail "the client suite failed"
stop
