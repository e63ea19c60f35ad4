#!/usr/bin/env bash
# The command lines themselves: --version of both binaries (release, commit, SIMD target), and
# towerctl's refusals: exit status 2 and one clear line for usage errors, "did you mean" for a
# mistyped verb (also one level down), --help and --version exiting 0.
set -euo pipefail
towerctl="$1"; towerd="$2"; version="$3"
fail() { echo "FAIL: $*"; exit 1; }
has() { grep -q -- "$2" <<<"$1" || fail "expected '$2' in: $1"; }

for bin in "$towerctl" "$towerd"; do
  name="$(basename "$bin")"
  out="$("$bin" --version)" || fail "$name --version exited $?"
  echo "$out"
  [ "$(sed -n 1p <<<"$out")" = "$name $version" ] || fail "$name --version: first line is not '$name $version'"
  [[ "$(sed -n 2p <<<"$out")" =~ ^commit\ ([0-9a-f]{7,}(-dirty)?|unknown)$ ]] || fail "$name --version: no commit line"
  [[ "$(sed -n 3p <<<"$out")" =~ ^SIMD\ [A-Z0-9_]+ ]] || fail "$name --version: no SIMD line"
  [ "$("$bin" -V)" = "$out" ] || fail "$name -V differs from --version"
done
grep -q "Exit status: 0 done, 1 failed, 2 usage error" <<<"$("$towerctl" --help)" || fail "towerctl --help does not explain the exit status"  # not a pipe: grep -q closing early would SIGPIPE towerctl under pipefail

# expect_usage WANT_IN_STDERR ARGS...: towerctl ARGS must exit 2 with WANT on stderr and nothing on stdout.
expect_usage() {
  local want="$1"; shift
  local rc=0 err
  err="$("$towerctl" "$@" 2>&1 >/dev/null)" || rc=$?
  [ "$rc" = 2 ] || fail "towerctl $*: exit status $rc, want 2 (stderr: $err)"
  has "$err" "$want"
  echo "towerctl $* -> $(head -1 <<<"$err")"
}
expect_usage 'unknown verb "stauts" for towerctl; did you mean "towerctl status"?' stauts
expect_usage 'did you mean "towerctl segments"?' segmnts ls
expect_usage 'did you mean "towerctl segments"?' seg
expect_usage 'unknown verb "lss" for towerctl segments; did you mean "towerctl segments ls"?' segments lss
expect_usage 'did you mean "towerctl model info"?' model inf x.gguf
expect_usage '(verbs: ' frobnicate   # nothing close: the verbs are listed
err="$("$towerctl" frobnicate 2>&1)" || true
grep -q "did you mean" <<<"$err" && fail "a suggestion for a word close to no verb: $err"
expect_usage 'A subcommand is required'
expect_usage 'Run with --help' status --bogus-option
expect_usage 'Run with --help' chat --temperature 7
expect_usage 'Run with --help' chat --session a --bot b
expect_usage 'give a segment name or --idle-for SECONDS' compress --socket /nonexistent
echo "ok"
