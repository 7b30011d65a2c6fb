#!/usr/bin/env bash
# Measures the two ways to make compiles cheap across clones (docs/builds.md, "CI and build times"):
# LibTorch's precompiled header with ccache (CMakeLists.txt: base_dir, no hash_dir, pch sloppiness)
# against no precompiled header (-DCMAKE_DISABLE_PRECOMPILE_HEADERS=ON) with the same ccache.
# For each way, two fresh clones of HEAD build one target with Make -j N from an empty compiler cache
# of their own: the first clone cold, the second warm (a new folder, the first clone's cache). Prints
# the four times and each build's cache hits; builds in /tmp, removes what it made.
#
#   scripts/ci/pch_vs_ccache.sh [TARGET] [JOBS]     default: optcc_compression, nproc
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
TARGET=${1:-optcc_compression}
JOBS=${2:-$(nproc)}
work=$(mktemp -d /tmp/optcc-pch.XXXXXX)
trap 'rm -rf "$work"' EXIT
for way in pch nopch; do
  flags=()
  [ "$way" = nopch ] && flags=(-DCMAKE_DISABLE_PRECOMPILE_HEADERS=ON)
  export CCACHE_DIR="$work/ccache-$way"
  for clone in cold warm; do
    src="$work/$way-$clone"
    git clone -q "$REPO" "$src"
    cmake -S "$src" -B "$src/build" -G "Unix Makefiles" -DCMAKE_BUILD_TYPE=RelWithDebInfo "${flags[@]}" > /dev/null
    ccache -z > /dev/null
    t=$(date +%s.%N)
    cmake --build "$src/build" -j "$JOBS" --target "$TARGET" > "$work/$way-$clone.log" 2>&1 ||
      { tail -20 "$work/$way-$clone.log"; exit 1; }
    s=$(echo "$(date +%s.%N) - $t" | bc)
    hits=$(ccache --print-stats | awk -F'\t' '$1 ~ /^(direct|preprocessed)_cache_hit$/ {h += $2}
      $1 == "cache_miss" {m += $2} $1 ~ /^(could_not_use_precompiled_header|unsupported_compiler_option)$/ {u += $2}
      END {printf "hits %d, misses %d, uncacheable (pch or option) %d", h, m, u}')
    printf 'pch_vs_ccache: %-5s %-4s %s: %7.1f s (%s)\n' "$way" "$clone" "$TARGET" "$s" "$hits"
    rm -rf "$src"
  done
done
