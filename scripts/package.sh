#!/usr/bin/env bash
# Builds the towers Debian package from this tree, then checks it with lintian (any error fails):
# installs the packaging tools (install-deps.sh --package), copies the tree's files (tracked and new,
# not build directories) to $TOWERS_BUILD_DIR/package/towers-VERSION, runs dpkg-buildpackage there
# (binary only, unsigned; debian/rules builds just towerd and towerctl with Debian's hardening flags)
# and leaves the .deb files, .changes and .buildinfo in $TOWERS_DEB_DIR (default build/deb).
#   scripts/package.sh && sudo apt install ./build/deb/towers_*.deb
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${TOWERS_BUILD_DIR:-$root/build}"
out="${TOWERS_DEB_DIR:-$build/deb}"
"$root/scripts/install-deps.sh" --package

version="$(sed -n 's/^project(towers VERSION \([0-9.]*\).*/\1/p' "$root/CMakeLists.txt")"
changelog_version="$(dpkg-parsechangelog -l "$root/debian/changelog" -S Version)"
if [ "$version" != "$changelog_version" ]; then
  echo "package: CMakeLists.txt says version $version, debian/changelog $changelog_version; add a changelog entry (dch -v $version)" >&2
  exit 1
fi
commit="$(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)"

work="$build/package"
src="$work/towers-$version"
rm -rf "$work"
mkdir -p "$src"
if git -C "$root" rev-parse --git-dir >/dev/null 2>&1; then
  # What the tree holds now, committed or not (a file deleted but not yet committed is skipped).
  git -C "$root" ls-files -z --cached --others --exclude-standard |
    (cd "$root" && xargs -0 sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh) |
    tar -C "$root" --null -T - -cf - | tar -C "$src" -xf -
else
  tar -C "$root" --exclude='./build*' --exclude=./.git -cf - . | tar -C "$src" -xf -
fi

echo "package: dpkg-buildpackage in $src (commit $commit)"
(cd "$src" && TOWERS_GIT_COMMIT="$commit" DEB_BUILD_OPTIONS="parallel=$(nproc 2>/dev/null || echo 2) ${DEB_BUILD_OPTIONS:-}" \
  dpkg-buildpackage -b -us -uc) >"$work/build.log" 2>&1 || {
  tail -40 "$work/build.log"
  echo "package: dpkg-buildpackage failed; the whole log: $work/build.log" >&2
  exit 1
}
mkdir -p "$out"
changes="towers_${version}_$(dpkg-architecture -qDEB_HOST_ARCH).changes"
for f in $(sed -n '/^Files:/,$p' "$work/$changes" | awk 'NF == 5 {print $5}') "$changes"; do
  mv -f "$work/$f" "$out/"
done

echo "package: lintian $out/$changes"
lintian --fail-on error --display-info "$out/$changes" | tee "$work/lintian.log" || {
  echo "package: lintian found errors (above)" >&2
  exit 1
}
ls -1 "$out"/*.deb
