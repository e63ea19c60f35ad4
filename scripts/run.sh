#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: install dependencies, build, and generate text with
# the small real model in ../shared (override the model with TOWERS_MODEL, the prompt with $1).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
shared="${TOWERS_SHARED:-$root/../shared}"
model="${TOWERS_MODEL:-$shared/models/stories260K.gguf}"
prompt="${1:-Once upon a time}"
build="${TOWERS_BUILD_DIR:-$root/build}"
"$build/cli/towerctl" model info "$model"
echo
"$build/cli/towerctl" generate --model "$model" --prompt "$prompt" --max-tokens 200 --temperature 0 --verbose
