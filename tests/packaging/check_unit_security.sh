#!/usr/bin/env bash
# The systemd unit's sandbox: systemd-analyze security --offline=yes rates its exposure at most 2.0
# (0 = locked down, 10 = fully exposed), and the settings towerd relies on are kept: no PrivateUsers
# (peer uids for SO_PEERCRED), AF_UNIX allowed (the API), its runtime and state directories.
# Skips (77) where systemd-analyze is absent or too old for --offline.
set -euo pipefail
unit="$1"; limit="${2:-2.0}"
command -v systemd-analyze >/dev/null || { echo "SKIP: systemd-analyze not found (scripts/install-deps.sh --dev installs systemd)"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
rc=0; out="$(systemd-analyze security --offline=yes --no-pager "$unit" 2>&1)" || rc=$?
if grep -q "unrecognized option\|Unknown option" <<<"$out"; then echo "SKIP: systemd-analyze without --offline"; exit 77; fi
line="$(grep "Overall exposure level" <<<"$out")" || fail "no exposure figure (exit $rc): $out"
echo "$line"
exposure="$(sed -n 's/.*: \([0-9.]*\) .*/\1/p' <<<"$line")"
[ -n "$exposure" ] || fail "cannot read the figure in: $line"
awk -v e="$exposure" -v l="$limit" 'BEGIN { exit !(e <= l) }' || {
  grep "✗" <<<"$out" || true
  fail "exposure $exposure is above $limit"
}
grep -q "^ExecStart=/.*/towerd --config /.*/towerd/towerd.toml$" "$unit" || fail "ExecStart is not the installed towerd with its config"
grep -q "^RestrictAddressFamilies=.*AF_UNIX" "$unit" || fail "AF_UNIX must stay allowed"
grep -q "^PrivateUsers=yes" "$unit" && fail "PrivateUsers= would hide peers' uids from SO_PEERCRED"
for key in RuntimeDirectory=towerd StateDirectory=towerd Type=notify User=towerd; do
  grep -q "^$key$" "$unit" || fail "$key missing"
done
echo "ok: exposure $exposure <= $limit"
