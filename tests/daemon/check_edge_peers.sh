#!/usr/bin/env bash
# Peer credentials done right (issue 13 item 3): a Unix-socket client is accepted when it is root,
# the daemon's uid, in allowed_uids, or when one of its groups, supplementary ones included (as
# `usermod -aG` adds them), is the socket's group or in allowed_gids. Clients run under throwaway
# users (useradd, removed on exit) with setpriv; a refused one reads a 403, never a reset.
# Needs root; skips otherwise.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
root="$(mktemp -d /tmp/towerd-edge.XXXXXX)"
towerd_setup "$1" "$2" "$root"
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root (creates users and groups, runs clients as them)"; exit 77; }
for c in setpriv useradd groupadd userdel groupdel; do
  command -v "$c" >/dev/null || { echo "SKIP: $c not installed"; exit 77; }
done
. "$(dirname "$0")/edge_lib.sh"
edge_share

# Throwaway groups and users; names unique to this run, removed on exit.
tag="te$$"
sockgrp="${tag}s" allowgrp="${tag}a"
u_sock="${tag}u1" u_allow="${tag}u2" u_none="${tag}u3" u_listed="${tag}u4"
remove_ids() {
  for u in "$u_sock" "$u_allow" "$u_none" "$u_listed"; do userdel "$u" 2>/dev/null || true; done
  for g in "$sockgrp" "$allowgrp"; do groupdel "$g" 2>/dev/null || true; done
}
trap 'cleanup; remove_ids; rm -rf "$root"' EXIT
groupadd "$sockgrp"; groupadd "$allowgrp"
# Primary group "nogroup" for all: only the supplementary groups differ.
useradd -M -N -g nogroup -s /usr/sbin/nologin -G "$sockgrp" "$u_sock"
useradd -M -N -g nogroup -s /usr/sbin/nologin -G "$allowgrp" "$u_allow"
useradd -M -N -g nogroup -s /usr/sbin/nologin "$u_none"
useradd -M -N -g nogroup -s /usr/sbin/nologin "$u_listed"
cat >"$tmp/towerd.toml" <<EOF
[server]
socket_group = "$sockgrp"
socket_mode = "0666"
allowed_gids = [$(getent group "$allowgrp" | cut -d: -f3)]
allowed_uids = [$(id -u "$u_listed")]
EOF
start --config "$tmp/towerd.toml"
[ "$(stat -c %G "$sock")" = "$sockgrp" ] || fail "the socket does not belong to $sockgrp"

# as USER EXPECTED WHAT: GET /healthz as USER (its own groups, from the group database) must be answered EXPECTED.
as() {
  local r
  r="$(setpriv --reuid="$(id -u "$1")" --regid="$(id -g "$1")" --init-groups \
        "$PY" "$tmp/http_probe.py" "$sock" --count 1)"
  [ "$(echo "$r" | json_get 'd["statuses"][0]')" = "$2" ] || fail "$3: expected $2, got $r"
  echo "$3: $2"
}
as "$u_sock" 200 "a supplementary member of socket_group"
as "$u_allow" 200 "a supplementary member of a group in allowed_gids"
as "$u_listed" 200 "a uid in allowed_uids"
as "$u_none" 403 "a user in none of them"
# The process's own group list does not matter: the group database does (what usermod -aG changes).
r="$(setpriv --reuid="$(id -u "$u_sock")" --regid="$(id -g "$u_sock")" --clear-groups \
      "$PY" "$tmp/http_probe.py" "$sock" --count 1)"
[ "$(echo "$r" | json_get 'd["statuses"][0]')" = 200 ] || fail "a member whose process dropped its groups: $r"
# A uid without a passwd entry has only its primary gid.
r="$(setpriv --reuid=4000123 --regid="$(getent group "$allowgrp" | cut -d: -f3)" --clear-groups \
      "$PY" "$tmp/http_probe.py" "$sock" --count 1)"
[ "$(echo "$r" | json_get 'd["statuses"][0]')" = 200 ] || fail "an unknown uid whose primary gid is allowed: $r"
r="$(setpriv --reuid=4000123 --regid=4000123 --clear-groups "$PY" "$tmp/http_probe.py" "$sock" --count 1)"
[ "$(echo "$r" | json_get 'd["statuses"][0]')" = 403 ] || fail "an unknown uid and gid: $r"
grep -q "refused a connection from uid $(id -u "$u_none")" "$tmp/log" || fail "the refusal was not logged"
stop
echo "edge peers: OK"
