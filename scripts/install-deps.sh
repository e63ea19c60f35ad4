#!/usr/bin/env bash
# Installs everything Towers needs to build and test, from Debian 12 packages only.
# Safe to run again: apt-get skips what is already installed.
set -euo pipefail
PKGS=(
  build-essential cmake ninja-build pkg-config git
  libdnnl-dev libhwy-dev liburing-dev libboost-dev libcli11-dev libtomlplusplus-dev doctest-dev
  # Added beyond the brief (see docs/dependencies.md for why):
  nlohmann-json3-dev   # JSON: tokenizer.json in tests, the daemon's HTTP API later
  libpcre2-dev         # Unicode-property regexes (\p{L}, \p{N}, lookahead) for BPE pre-tokenizers
  clang libclang-rt-14-dev  # libFuzzer target (-DTOWERS_FUZZ=ON) and sanitizer runtimes
  curl                 # tests/daemon and scripts/run.sh talk to towerd with curl --unix-socket
  libxxhash-dev        # XXH3-64: checksums of segment files, model fingerprints (GB/s, vs ~0.5 for a table CRC)
  zstd                 # tests/cli/check_codec.sh compares the codec with zstd -19 (not linked)
  python3-prometheus-client  # tests/daemon/check_edge_metrics.sh parses /metrics with a real parser
)
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
