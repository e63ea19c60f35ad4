#!/usr/bin/env bash
# The towers Debian package as a new user meets it: scripts/package.sh builds it (lintian: no
# errors), dpkg-deb shows the files in their places with the config as a conffile, `apt-get install`
# makes user towerd and /run/towerd, /var/lib/towerd; towerd started by hand as user towerd (setpriv;
# systemd need not run) with the shipped config and a model in /var/lib/towerd/models answers on
# /run/towerd/towerd.sock, to root and to `towerctl status`/`towerctl chat`, not to other users;
# `apt-get purge` takes it all away again. The machine is left as it was: the user and group are
# deleted when this test made them.
# Skips (77) when not root, without dpkg/apt, or when a towers package, user towerd's directories or
# a towerd socket are already there (nothing of someone else's is touched).
set -euo pipefail
src="$1"; build="$2"; shared="${TOWERS_SHARED:-$3}"
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "not root (installs a package)"
for t in dpkg dpkg-deb apt-get setpriv curl; do command -v "$t" >/dev/null || skip "$t not found"; done
dpkg-query -W -f='${Status}' towers 2>/dev/null | grep -q "ok installed" && skip "a towers package is installed already"
for p in /var/lib/towerd /run/towerd /etc/towerd; do [ -e "$p" ] && skip "$p exists already"; done
user_made=1; getent passwd towerd >/dev/null && user_made=0
group_made=1; getent group towerd >/dev/null && group_made=0

tmp="$build/test-tmp/check_deb.$$"; mkdir -p "$tmp"; pid=""; installed=0
cleanup() {
  local rc=$?
  [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && { wait "$pid" 2>/dev/null || true; }
  [ "$installed" = 1 ] && { DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq towers >/dev/null 2>&1 || true; }
  [ "$user_made" = 1 ] && getent passwd towerd >/dev/null && { userdel towerd || true; }
  [ "$group_made" = 1 ] && getent group towerd >/dev/null && { groupdel towerd || true; }
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -f "$tmp/towerd.log" ] && { echo "--- towerd log:"; tail -20 "$tmp/towerd.log"; }; exit 1; }

# 1. Build and lint (package.sh fails on any lintian error).
TOWERS_BUILD_DIR="$build" TOWERS_DEB_DIR="$tmp/deb" "$src/scripts/package.sh" >"$tmp/package.log" 2>&1 \
  || { tail -40 "$tmp/package.log"; fail "scripts/package.sh failed"; }
deb="$(ls "$tmp"/deb/towers_*.deb)"
echo "built $(basename "$deb"); lintian: $(grep -c '^[EWI]:' "$build/package/lintian.log" || true) tags," \
     "$(grep -c '^E:' "$build/package/lintian.log" || true) errors"
grep '^[EW]:' "$build/package/lintian.log" || true

# 2. What the package holds.
listing="$(dpkg-deb -c "$deb")"
# The unit is in /lib/systemd/system, where bookworm's debhelper integrates units (debian/rules);
# on merged /usr that is /usr/lib/systemd/system (checked after installing).
for f in ./usr/bin/towerd ./usr/bin/towerctl ./etc/towerd/towerd.toml ./lib/systemd/system/towerd.service \
         ./usr/lib/sysusers.d/towerd.conf ./usr/lib/tmpfiles.d/towerd.conf ./usr/share/man/man1/towerd.1.gz \
         ./usr/share/man/man1/towerctl.1.gz ./usr/share/doc/towers/copyright ./usr/share/doc/towers/changelog.gz; do
  grep -q " $f$" <<<"$listing" || fail "$f is not in the package: $listing"
done
grep -v " root/root " <<<"$listing" && fail "files not owned by root"
grep -qx "/etc/towerd/towerd.toml" <(dpkg-deb -I "$deb" conffiles) || fail "/etc/towerd/towerd.toml is not a conffile"
grep -q "ExecStart=/usr/bin/towerd --config /etc/towerd/towerd.toml" \
  <(dpkg-deb --fsys-tarfile "$deb" | tar -xOf - ./lib/systemd/system/towerd.service) || fail "the unit's ExecStart"
echo "dpkg-deb -c: $(grep -c '^-' <<<"$listing") files, $(grep -c '^d' <<<"$listing") directories"

# 3. Install.
installed=1
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$deb" >"$tmp/apt.log" 2>&1 || { cat "$tmp/apt.log"; fail "apt-get install"; }
IFS=: read -r _ _ uid _ _ home shell < <(getent passwd towerd) || fail "no user towerd after installing"
[ "$uid" -lt 1000 ] && [ "$home" = /var/lib/towerd ] || fail "user towerd: uid $uid home $home"
[ "$(stat -c '%U:%G %a' /run/towerd)" = "towerd:towerd 750" ] || fail "/run/towerd: $(stat -c '%U:%G %a' /run/towerd)"
[ "$(stat -c '%U:%G %a' /var/lib/towerd)" = "towerd:towerd 750" ] || fail "/var/lib/towerd: $(stat -c '%U:%G %a' /var/lib/towerd)"
[ -f /usr/lib/systemd/system/towerd.service ] || fail "no /usr/lib/systemd/system/towerd.service after installing"
/usr/bin/towerd --version | head -1 | grep -q "^towerd " || fail "towerd --version"
/usr/bin/towerctl --version | head -1 | grep -q "^towerctl " || fail "towerctl --version"

# 4. A model where the shipped config looks for it, then towerd by hand as user towerd.
model=/var/lib/towerd/models/model.gguf
if [ -f "$shared/models/stories260K.gguf" ]; then
  cp "$shared/models/stories260K.gguf" "$model"
else
  echo "($shared/models/stories260K.gguf not found: a synthetic model)"
  /usr/bin/towerctl model synth --shape tiny --type f16 -o "$model" >/dev/null
fi
chmod 0644 "$model"
setpriv --reuid=towerd --regid=towerd --init-groups -- /usr/bin/towerd --config /etc/towerd/towerd.toml --threads 2 \
  2>"$tmp/towerd.log" & pid=$!
sock=/run/towerd/towerd.sock
for _ in $(seq 600); do   # bounded readiness poll (60 s)
  curl -sf --unix-socket "$sock" http://localhost/healthz >"$tmp/health" 2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || fail "towerd exited during start"
  sleep 0.1
done
grep -q '"status":"ok"' "$tmp/health" || fail "towerd is not healthy on $sock"
[ "$(stat -c '%U:%G %a' "$sock")" = "towerd:towerd 660" ] || fail "socket: $(stat -c '%U:%G %a' "$sock")"
/usr/bin/towerctl status | grep -q "towerd *ok" || fail "towerctl status"
reply="$(/usr/bin/towerctl chat --message "Once upon a time" --max-tokens 8 --temperature 0 2>&1)" || fail "towerctl chat: $reply"
[ -n "$reply" ] || fail "towerctl chat printed nothing"
rc=0; err="$(setpriv --reuid=nobody --regid=nogroup --clear-groups -- /usr/bin/towerctl status 2>&1)" || rc=$?
[ "$rc" = 1 ] && grep -q "Permission denied" <<<"$err" || fail "a user outside group towerd reached the socket: $rc $err"
kill -TERM "$pid"; rc=0; wait "$pid" || rc=$?; pid=""
[ "$rc" = 0 ] || fail "towerd exited with $rc on SIGTERM"
[ "$(stat -c %U /var/lib/towerd/towerd.log)" = towerd ] || fail "the state log is not towerd's"
echo "towerd served /healthz, towerctl status and chat on $sock as user towerd (uid $uid)"

# 5. Purge takes everything away.
DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq towers >"$tmp/apt.log" 2>&1 || { cat "$tmp/apt.log"; fail "apt-get purge"; }
installed=0
for p in /usr/bin/towerd /usr/bin/towerctl /etc/towerd /var/lib/towerd /lib/systemd/system/towerd.service; do
  [ -e "$p" ] && fail "$p is left after purge"
done
echo "ok"
