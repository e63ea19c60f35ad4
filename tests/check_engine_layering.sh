#!/usr/bin/env bash
# engine/ rooms include only the rooms they stand on (engine/CMakeLists.txt draws the arrows).
# Text and constrained decoding never see the forward pass; the model never sees sampling.
# Usage: check_engine_layering.sh SOURCE_DIR
set -euo pipefail
src="${1:?usage: check_engine_layering.sh SOURCE_DIR}"
declare -A allowed=(
  [base]="base"
  [gguf]="base gguf"
  [text]="base gguf text"
  [constrained]="base gguf text constrained"
  [model]="base gguf text model"
  [generate]="base gguf text constrained model generate"
  [codec]="base gguf text constrained model generate codec"
)
bad=0
for room in "${!allowed[@]}"; do
  for f in "$src"/engine/"$room"/*.{h,cc}; do
    [ -e "$f" ] || continue
    while IFS= read -r used; do
      case " ${allowed[$room]} " in
        *" $used "*) ;;
        *) echo "FAIL: ${f#"$src"/} includes engine/$used/ (room $room stands on: ${allowed[$room]})"; bad=1 ;;
      esac
    done < <(sed -n 's#^\#include "engine/\([a-z_]*\)/.*#\1#p' "$f" | sort -u)
  done
done
# Every include of engine/ names a room (a file moved out of the top level leaves no old path behind).
while IFS= read -r hit; do
  echo "FAIL: $hit: includes an engine header outside a room"; bad=1
done < <(cd "$src" && grep -rnE '#include "engine/[a-z_]+\.h"' --include='*.h' --include='*.cc' \
           engine simd mmapstore daemon cli tests bench 2>/dev/null || true)
for f in "$src"/engine/*.{h,cc}; do
  [ -e "$f" ] && { echo "FAIL: ${f#"$src"/} lies outside a room"; bad=1; }
done
[ "$bad" -eq 0 ] && echo "engine layering: ${#allowed[@]} rooms, every include within its room's rule"
exit "$bad"
