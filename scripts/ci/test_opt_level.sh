#!/usr/bin/env bash
# Measures what compiling the test programs' own sources at -O0 saves (tests/CMakeLists.txt,
# OPTCC_TEST_SOURCES_O0; docs/builds.md, "CI and build times"). One clone of HEAD, two build folders
# in it (Ninja, RelWithDebInfo; inside the clone, as build/ is, so the libraries' compile commands
# match the cache's): tests at the build type's -O2 and tests at -O0. Each first builds what the
# test objects need, through the compiler cache; then every test object (and, at -O0, the tests' own
# precompiled header) is compiled again with the cache off, one compile at a time. Prints the CPU
# seconds (user + system) of each way, and of each source. Builds in /tmp, removes what it made.
#
#   scripts/ci/test_opt_level.sh [ROUNDS]      default: 1 (rounds alternate the order of the two ways)
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
ROUNDS=${1:-1}
work=$(mktemp -d /tmp/optcc-testopt.XXXXXX)
trap 'rm -rf "$work"' EXIT
git clone -q "$REPO" "$work/src"
for way in O2 O0; do
  o0=OFF; [ "$way" = O0 ] && o0=ON
  ln -s "src/build-$way" "$work/$way"
  cmake -S "$work/src" -B "$work/src/build-$way" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOPTCC_TEST_SOURCES_O0=$o0 \
    > "$work/$way.configure.log"
  # The test objects of the unit and integration programs, and the precompiled header they use.
  (cd "$work/$way" && ninja -t targets all | sed -n 's/^\(tests\/\(unit\|integration\)\/CMakeFiles\/[^:]*\.cpp\.o\):.*/\1/p' |
     sort > objects.txt)
  pch=""
  [ "$way" = O0 ] && pch=tests/CMakeFiles/optcc_test_torch_pch.dir/cmake_pch.hxx.gch
  echo "$pch" > "$work/$way/pch.txt"
  (cd "$work/$way" && ninja $(cat objects.txt) > build.log 2>&1) || { tail -20 "$work/$way/build.log"; exit 1; }
done
cpu_of() {  # folder, targets...: CPU seconds of compiling them again, cache off, one at a time
  local dir=$1; shift
  (cd "$dir" && rm -f "$@" && CCACHE_DISABLE=1 /usr/bin/time -f '%U %S' -o time.txt ninja -j 1 "$@" > /dev/null &&
   awk '{printf "%.1f", $1 + $2}' time.txt)
}
for round in $(seq 1 "$ROUNDS"); do
  order="O2 O0"; [ $((round % 2)) -eq 0 ] && order="O0 O2"
  for way in $order; do
    total=0
    pch=$(cat "$work/$way/pch.txt")
    if [ -n "$pch" ]; then
      s=$(cpu_of "$work/$way" "$pch"); total=$(echo "$total + $s" | bc)
      printf 'test_opt_level: round %d %s %-70s %6.1f s\n' "$round" "$way" "the tests' precompiled header" "$s"
    fi
    while read -r obj; do
      s=$(cpu_of "$work/$way" "$obj"); total=$(echo "$total + $s" | bc)
      printf 'test_opt_level: round %d %s %-70s %6.1f s\n' "$round" "$way" "$(basename "$obj" .o)" "$s"
    done < "$work/$way/objects.txt"
    printf 'test_opt_level: round %d %s total %.1f CPU s over %d test sources\n' "$round" "$way" "$total" \
      "$(wc -l < "$work/$way/objects.txt")"
  done
done
