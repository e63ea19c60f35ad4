#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: install what building and running need, build towerd
# and towerctl only (the tests are scripts/test.sh's), start towerd on a temporary socket and state
# dir, wait for it, run one streamed chat with `towerctl chat`, print it, stop the daemon. Model:
# $TOWERS_MODEL, else ../shared/models/stories260K.gguf, else a download of stories260K into
# ~/.cache/towers, else (offline) a synthetic model that prints noise.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh" towerd towerctl
build="${TOWERS_BUILD_DIR:-$root/build}"
shared="${TOWERS_SHARED:-$root/../shared}"
message="${1:-Once upon a time}"
model="${TOWERS_MODEL:-}"
if [ -z "$model" ]; then
  model="$shared/models/stories260K.gguf"
  if [ ! -f "$model" ]; then
    model="$HOME/.cache/towers/stories260K.gguf"
    url="https://huggingface.co/ggml-org/models/resolve/main/tinyllamas/stories260K.gguf"
    if [ ! -f "$model" ]; then
      mkdir -p "$(dirname "$model")"
      echo "run: downloading $url"
      if ! curl -fsSL --retry 2 -o "$model.tmp" "$url"; then
        rm -f "$model.tmp"
        echo "run: WARNING: offline (cannot download the model); using a synthetic model whose output is noise" >&2
        model="$HOME/.cache/towers/synth-tiny.gguf"
        "$build/cli/towerctl" model synth --shape tiny --type f16 -o "$model"
      else
        mv "$model.tmp" "$model"
      fi
    fi
  fi
fi
tmp="$(mktemp -d)"; pid=""
trap '[ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
sock="$tmp/towerd.sock"
"$build/daemon/towerd" --config "$root/etc/towerd.toml" --model "$model" --socket "$sock" --state-dir "$tmp/state" \
  2>"$tmp/towerd.log" & pid=$!
for _ in $(seq 300); do
  curl -sf --unix-socket "$sock" http://localhost/healthz >/dev/null 2>&1 && break
  kill -0 "$pid" 2>/dev/null || { cat "$tmp/towerd.log"; exit 1; }
  sleep 0.1
done
echo "towerd is up on $sock (model $(basename "$model"))"
echo "> $message"
# The first chat goes through towerctl: a two-level tower (platform, bot), a new session, one streamed reply.
export TOWERD_SOCKET="$sock"
"$build/cli/towerctl" segments add demo --level platform --text "You are a storyteller." >/dev/null
"$build/cli/towerctl" segments add storyteller --level bot --parent demo --text "Tell short, happy stories." >/dev/null
"$build/cli/towerctl" chat --bot storyteller --message "$message" --temperature 0 --max-tokens 200 --verbose
curl -s --unix-socket "$sock" http://localhost/v1/pool | python3 -c 'import json,sys; d=json.load(sys.stdin); print("pool: %d segments, %d KV bytes, latency p50 %.1f ms" % (d["segments"], d["kv_bytes"], d["latency_ms"]["p50"]))'
kill -TERM "$pid"; wait "$pid"; pid=""
sed -n '$p' "$tmp/towerd.log"
