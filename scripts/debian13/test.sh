#!/usr/bin/env bash
# Builds optcc against Debian 13's LibTorch 2.x and runs its test suite there, in a Debian 13 root made
# with debootstrap on this (Debian 12) machine. The README's default stays Debian 12 + LibTorch 1.13;
# this is how optcc proves it also builds and passes against a current LibTorch.
#
#   scripts/debian13/test.sh [--unit] [--jobs N] [--no-tests] [-- extra ctest args]
#
#   --unit       only the tests labelled `unit` (the whole suite but `slurm` and `hosts` otherwise)
#   --jobs N     build and ctest parallelism (default: nproc)
#   --no-tests   make the root, configure and build only
#   --prepare    make the root and install its packages only
#
# Root, as on CI. The Debian 13 root is cached in OPTCC_DEBIAN13_ROOT (default
# /var/cache/optcc/debian13-root, outside any clone) and reused when present: the first run spends
# about a minute on debootstrap and a few more on packages; later runs only check the packages
# (scripts/deps.sh, the same list as Debian 12's, run inside the root). The root keeps its own ccache,
# so a second build of an unchanged tree is quick. The build goes to build-debian13/ in this checkout
# (ignored by git). Inside the root the checkout is bind-mounted at /optcc; /proc, /sys and /dev are
# mounted for the build and the tests and unmounted on every exit (also on Ctrl-C or an error).
# The Slurm integration test (label `slurm`) needs daemons this root does not run, and the multi-host
# test (label `hosts`) network namespaces made outside it: both are left out here; Debian 12's
# `make test` runs them.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/../.." && pwd)"
. "$REPO/scripts/debian13/root.sh"
JOBS="$(nproc)"
UNIT=0
TESTS=1
PREPARE=0
CTEST_EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --unit) UNIT=1 ;;
    --jobs) JOBS="$2"; shift ;;
    --no-tests) TESTS=0 ;;
    --prepare) PREPARE=1 ;;
    --) shift; CTEST_EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "debian13/test.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
debian13_require_root debian13/test.sh
t_start=$(date +%s)
debian13_enter "$REPO"

t_pkg=$(date +%s)
debian13_packages
torch_version=$(in_root dpkg-query -W -f='${Version}' libtorch-dev)
echo "debian13: packages ready in $(( $(date +%s) - t_pkg )) s; libtorch-dev $torch_version"
[ "$PREPARE" = 1 ] && exit 0

t_build=$(date +%s)
# No debug information here (-O2 as RelWithDebInfo, without -g): this build exists to compile and test
# against LibTorch 2.x, and -g makes each of its translation units about 30% slower to compile.
in_root cmake -S /optcc -B /optcc/build-debian13 -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -DNDEBUG" > /dev/null
in_root ccache -z > /dev/null 2>&1 || true  # this build's compiler-cache hits, printed below
in_root cmake --build /optcc/build-debian13 -j "$JOBS"
hits=$(in_root ccache --print-stats 2>/dev/null |
  awk -F'\t' '$1 ~ /^(direct|preprocessed)_cache_hit$/ {h += $2} $1 == "cache_miss" {m += $2}
               END {printf "%d of %d compiles (%.0f%%)", h, h + m, h + m ? 100 * h / (h + m) : 0}')
echo "debian13: build took $(( $(date +%s) - t_build )) s; compiler cache hits: $hits"

if [ "$TESTS" = 1 ]; then
  t_test=$(date +%s)
  labels=(-LE "slurm|hosts")
  [ "$UNIT" = 1 ] && labels=(-L unit)
  in_root ctest --test-dir /optcc/build-debian13 --output-on-failure -j "$JOBS" "${labels[@]}" "${CTEST_EXTRA[@]}"
  echo "debian13: tests (${labels[*]}) took $(( $(date +%s) - t_test )) s"
fi
echo "debian13: LibTorch $torch_version, total $(( $(date +%s) - t_start )) s"
