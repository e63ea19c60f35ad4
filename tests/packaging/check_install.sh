#!/usr/bin/env bash
# `DESTDIR=... cmake --install BUILD` puts exactly the package's files in their places: the two
# binaries, the config, the systemd unit (ExecStart naming the installed binary and config),
# sysusers.d and tmpfiles.d files, the man pages (when help2man was found) and the copyright file.
set -euo pipefail
build="$1"; prefix="$2"; bindir="$3"; sysconfdir="$4"; mandir="$5"; docdir="$6"; man="$7"; src="$8"
tmp="$build/test-tmp/check_install.$$"; D="$tmp/root"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
DESTDIR="$D" cmake --install "$build" >"$tmp.log" 2>&1 || { cat "$tmp.log"; rm -f "$tmp.log"; fail "cmake --install failed"; }
rm -f "$tmp.log"
want=("$bindir/towerd" "$bindir/towerctl" "$sysconfdir/towerd/towerd.toml"
      "$prefix/lib/systemd/system/towerd.service" "$prefix/lib/sysusers.d/towerd.conf"
      "$prefix/lib/tmpfiles.d/towerd.conf" "$docdir/copyright")
[ "$man" = 1 ] && want+=("$mandir/man1/towerd.1" "$mandir/man1/towerctl.1")
diff <(printf '%s\n' "${want[@]}" | sort) <(cd "$D" && find . -type f | sed 's|^\.||' | sort) \
  || fail "installed files (>) differ from the expected ones (<)"
for b in towerd towerctl; do
  [ -x "$D$bindir/$b" ] || fail "$b is not executable"
  "$D$bindir/$b" --version | head -1 | grep -q "^$b " || fail "the installed $b does not run"
done
cmp -s "$src/etc/towerd.toml" "$D$sysconfdir/towerd/towerd.toml" || fail "the installed config is not etc/towerd.toml"
unit="$D$prefix/lib/systemd/system/towerd.service"
grep -qx "ExecStart=$bindir/towerd --config $sysconfdir/towerd/towerd.toml" "$unit" || fail "ExecStart: $(grep ExecStart= "$unit")"
grep -Eq '@[A-Z_]+@' "$unit" && fail "unsubstituted @VARIABLE@ in the unit"
grep -q "^u towerd " "$D$prefix/lib/sysusers.d/towerd.conf" || fail "sysusers.d: no user towerd"
for d in /run/towerd /var/lib/towerd; do
  grep -q "^d $d 0750 towerd towerd" "$D$prefix/lib/tmpfiles.d/towerd.conf" || fail "tmpfiles.d: no $d"
done
if [ "$man" = 1 ]; then
  for b in towerd towerctl; do
    grep -q '^\.TH' "$D$mandir/man1/$b.1" || fail "$b.1 is not a man page"
    grep -q -- '\\-\\-version' "$D$mandir/man1/$b.1" || fail "$b.1 lacks the options from --help"
  done
fi
echo "ok: $(printf '%s ' "${want[@]}")"
