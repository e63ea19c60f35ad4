#!/usr/bin/env bash
# In-process A/B of the simd/ kernels against an older revision: OLD_REV's simd/ is extracted, renamed
# to namespace towers::simd_old and compiled with BUILD's flags for simd/; bench/ab/ab_kernels.cc then
# runs old and new alternately in one process (thread CPU time, best of each) and checks that both
# give the same bytes. For refactors of kernels that must stay bit-identical and no slower.
#   bench/ab/ab_kernels.sh OLD_REV [BUILD_DIR] [reps] [ms_per_batch] [self]   (defaults: build, 15, 4)
# "self" runs the new version against itself: the harness's own bias, to read the A/B ratios against.
# BUILD_DIR must have towers_gguf and towers_simd built (cmake --build BUILD --target towers_gguf towers_simd).
set -euo pipefail
old_rev="$1"; build="$(cd "${2:-build}" && pwd)"; reps="${3:-15}"; ms="${4:-4}"; self="${5:-}"
src="$(git rev-parse --show-toplevel)"
work="$build/ab-$(git -C "$src" rev-parse --short "$old_rev")"
mkdir -p "$work/old" "$work/obj"
if [ ! -d "$work/old/simd" ]; then  # (work is per revision: extracted and compiled once)
  git -C "$src" archive "$old_rev" simd | tar -x -C "$work/old"
  sed -i 's/towers::simd\b/towers::simd_old/g' "$work"/old/simd/*.h "$work"/old/simd/*.cc
fi
# The compiler and flags CMake used for simd/ (from compile_commands.json).
read -r -a cxx < <(python3 - "$build/compile_commands.json" <<'PY'
import json, shlex, sys
for c in json.load(open(sys.argv[1])):
    if c["file"].endswith("simd/ops.cc"):
        args = shlex.split(c["command"])
        keep, skip = [], False
        for a in args:
            if skip: skip = False; continue
            if a in ("-o", "-c"): skip = True; continue
            if a.startswith("-I"): continue
            keep.append(a)
        print(" ".join(keep))
        break
PY
)
compile() {  # compile OUT SRC INCLUDES...
  local out="$1" file="$2"; shift 2
  [ "$out" -nt "$file" ] || "${cxx[@]}" "$@" -c "$file" -o "$out"
}
objs=()
for f in "$work"/old/simd/*.cc; do
  o="$work/obj/old_$(basename "$f" .cc).o"; compile "$o" "$f" -I"$work/old"; objs+=("$o")
done
compile "$work/obj/adapter_old.o" "$src/bench/ab/ab_adapter.cc" -DAB_OLD -I"$work/old" -I"$src"
compile "$work/obj/adapter_new.o" "$src/bench/ab/ab_adapter.cc" -I"$src"
compile "$work/obj/ab_kernels.o" "$src/bench/ab/ab_kernels.cc" -I"$src"
"${cxx[0]}" -o "$work/ab_kernels" "$work/obj/ab_kernels.o" "$work/obj/adapter_new.o" "$work/obj/adapter_old.o" \
  "${objs[@]}" "$build/engine/libtowers_gguf.a" "$build/engine/libtowers_base.a" "$build/simd/libtowers_simd.a" -lhwy -lpcre2-8 -lpthread
echo "old = $old_rev ($(git -C "$src" rev-parse --short "$old_rev")), new = this tree ($build)"
"$work/ab_kernels" "$reps" "$ms" $self
