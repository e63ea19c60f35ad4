#!/usr/bin/env bash
# Installs what Towers needs, from Debian 12 packages only. Safe to run again: only missing packages
# are installed (apt-get update runs only then).
#   scripts/install-deps.sh             building and running towerd and towerctl (scripts/run.sh)
#   scripts/install-deps.sh --package   and building the Debian package (scripts/package.sh)
#   scripts/install-deps.sh --arm64     the ARM64 cross build and its tests under qemu-user
#                                       (scripts/build-arm64.sh, scripts/test-arm64.sh)
#   scripts/install-deps.sh --dev       and everything the tests, fuzzing and benchmarks need
#                                       (scripts/test.sh); includes --package and --arm64
# docs/dependencies.md says what each package is for.
set -euo pipefail
BUILD=(
  build-essential cmake ninja-build pkg-config git
  libhwy-dev liburing-dev libboost-dev libcli11-dev libtomlplusplus-dev
  nlohmann-json3-dev libpcre2-dev libxxhash-dev
  curl python3          # scripts/run.sh: fetches the demo model, polls /healthz, prints the pool
)
PACKAGE=(
  debhelper dpkg-dev fakeroot   # dpkg-buildpackage with debian/
  help2man                      # man pages from --help
  lintian                       # the package's checks
)
DEV=(
  doctest-dev                    # the unit tests
  clang libclang-rt-14-dev       # libFuzzer targets (-DTOWERS_FUZZ=ON) and sanitizer runtimes
  libdnnl-dev                    # optional prefill GEMM (simd/onednn_matmul.cc, [model] onednn_prefill) and bench_onednn
  python3-prometheus-client      # tests/daemon/check_edge_metrics.sh parses /metrics with a real parser
  systemd                        # systemd-analyze: tests/packaging/check_unit_security.sh
  chromium                       # tests/daemon/check_ui.sh loads towerd's page in a real browser (headless)
  zstd                           # tests/cli/check_codec.sh compares the codec with zstd -19 (not linked)
)
# The ARM64 leg (Debian multiarch): a cross compiler, qemu to run the tests, and the :arm64 builds of
# the libraries we link; the header-only ones (Boost, CLI11, nlohmann-json, doctest) are the host's.
# toml++'s CMake config lives in an architecture directory, so it needs its :arm64 package too.
ARM64=(
  g++-aarch64-linux-gnu qemu-user
  libhwy-dev:arm64 liburing-dev:arm64 libpcre2-dev:arm64 libxxhash-dev:arm64 libtomlplusplus-dev:arm64
  doctest-dev
)
usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; }
PKGS=("${BUILD[@]}")
case "${1:-}" in
  "") ;;
  --package) PKGS+=("${PACKAGE[@]}") ;;
  --arm64) PKGS+=("${ARM64[@]}") ;;
  --dev) PKGS+=("${PACKAGE[@]}" "${DEV[@]}" "${ARM64[@]}") ;;
  -h|--help) usage; exit 0 ;;
  *) echo "install-deps: unknown option '$1'" >&2; usage >&2; exit 2 ;;
esac
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# tests/daemon/check_openai_sdk.sh runs the official OpenAI Node SDK (fetched from npm by the test).
# Any node with npm will do: a node from elsewhere (nodesource) already carries npm, and Debian's npm
# package would conflict with it, so Debian's are installed only when no npm is on the PATH.
if [ "${1:-}" = --dev ] && ! command -v npm >/dev/null; then missing+=(nodejs npm); fi
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# The :arm64 packages need the architecture known to dpkg before apt-get update reads its lists.
if [[ " ${missing[*]}" == *":arm64"* ]] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
  $SUDO dpkg --add-architecture arm64
fi
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
