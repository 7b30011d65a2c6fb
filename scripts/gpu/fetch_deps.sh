#!/usr/bin/env bash
# Downloads (apt-get download: nothing is installed) the Debian 12 .debs of optcc's build
# dependencies other than LibTorch into scripts/gpu/debs/ (ignored by git), for a GPU machine that
# has Python with a CUDA torch, nvcc, cmake and ninja but no network and none of Debian's -dev
# packages: scripts/gpu/check.sh unpacks them there with `dpkg -x` into a prefix under /tmp.
#
#   scripts/gpu/fetch_deps.sh            download what is missing, check, print the sizes
#
# The list below is scripts/deps.sh's, less what the GPU machine brings or optcc does not need
# there: LibTorch (the machine's pip torch), OpenBLAS, oneDNN and OpenCL (CPU GEMMs; without them
# kernels/ uses ATen, the CUDA path anyway), Gloo's library (inside torch), tools (compiler, cmake,
# git, npm, Python packages). Gloo's headers are shipped: a pip torch has Gloo compiled in but leaves
# its headers out, and c10d's ProcessGroupGloo.hpp includes them (PINNED, below). Each -dev package comes with the runtime libraries it links against.
# Every Depends of a shipped package must be shipped, assumed present on any machine (BASE), or
# named not needed with its reason (NOT_NEEDED): else this script stops, naming it.
# Also writes debs/SHA256SUMS (checked by check.sh before unpacking) and debs/REQUIRES (the
# newest glibc / libstdc++ symbol versions the shipped libraries need; check.sh compares them with
# the machine's). Ends with scripts/gpu/size.sh: what a GPU machine would receive.
# Needs Debian 12's apt lists (run as root: `apt-get update` when they lack a package) and the
# network for packages not downloaded yet; idempotent (a second run downloads nothing).
set -euo pipefail

REPO="$(cd "$(dirname "$0")/../.." && pwd)"
DEBS="${OPTCC_GPU_DEBS:-$REPO/scripts/gpu/debs}"
case "${1:-}" in
  -h|--help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
  "") ;;
  *) echo "gpu/fetch_deps.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
esac

SHIP=(
  libyaml-cpp-dev libyaml-cpp0.7                    # find_package(yaml-cpp)
  libhdf5-dev libhdf5-103-1 libhdf5-cpp-103-1       # find_package(HDF5 COMPONENTS C CXX): results files
  libsz2 libaec0                                    # libhdf5's szip filter (a DT_NEEDED of libhdf5_serial.so)
  libcli11-dev nlohmann-json3-dev                   # header-only
  libfmt-dev libfmt9 libspdlog-dev libspdlog1.10    # spdlog uses the external fmt
  libssl-dev libssl3                                # find_package(OpenSSL): SHA-512 of corpus packages
  libsentencepiece-dev libsentencepiece0            # pkg_check_modules(SENTENCEPIECE REQUIRED): optcc-data
  libjemalloc-dev libjemalloc2                      # pkg-config jemalloc: the heap allocator
  libgtest-dev libgmock-dev                         # find_package(GTest): the test suite
  libbenchmark-dev libbenchmark1debian              # find_package(benchmark): bench_compression
  pkgconf-bin libpkgconf3                           # pkg-config itself, for machines without one
)
# .debs fetched by URL and SHA-256 rather than from this machine's apt (name, URL, SHA-256).
# libgloo-dev: Debian 13's (Gloo of 2023-12), headers only (its library is not used: torch's own
# Gloo is linked); Debian 12's Gloo (2022-05) lacks the Store methods ProcessGroupGloo.hpp overrides.
PINNED=(
  "libgloo-dev_0.0~git20231202.5354032-3+b2_amd64.deb"
  "http://deb.debian.org/debian/pool/main/g/gloo/libgloo-dev_0.0~git20231202.5354032-3+b2_amd64.deb"
  "5fd43a7c594ffa4baccf00ba797c215d4485ab617058fd04b69980dcbddc7cf2"
)
# Depends taken as present on any machine that runs Python with torch (check.sh's preflight names
# any of their libraries it cannot find).
BASE=(libc6 libgcc-s1 libstdc++6 zlib1g libcurl4)
# Depends of shipped packages that optcc's build does not use there, with the reason.
declare -A NOT_NEEDED=(
  [libhdf5-fortran-102]="Fortran binding"
  [libhdf5-hl-fortran-100]="Fortran high-level binding"
  [libhdf5-hl-100]="high-level API (optcc asks for C and CXX only)"
  [libhdf5-hl-cpp-100]="high-level C++ API (optcc asks for C and CXX only)"
  [hdf5-helpers]="h5cc/h5c++ wrappers: check.sh makes FindHDF5 search the libraries instead"
  [zlib1g-dev]="only the h5cc wrapper's link line names -lz; libhdf5_serial.so finds libz.so.1 itself"
  [libaec-dev]="only the h5cc wrapper's link line names -lsz; libsz2 is shipped"
  [libcurl4-openssl-dev]="only the h5cc wrapper's link line names -lcurl; libcurl4 is in BASE"
  [libcurl-dev]="virtual package of libcurl4-openssl-dev"
  [libjpeg-dev]="HDF5 image tools, not linked"
  [catch2]="spdlog's own test framework"
  [googletest]="GoogleTest's sources; libgtest-dev has the built libraries"
  [debconf]="package configuration, unused by dpkg -x"
)

command -v apt-get >/dev/null 2>&1 || {
  echo "gpu/fetch_deps.sh: no apt-get here; run this on the Debian 12 build machine (the GPU machine only unpacks)" >&2
  exit 1; }
arch=$(dpkg --print-architecture)
if [ "$arch" != amd64 ]; then
  echo "gpu/fetch_deps.sh: this machine's architecture is $arch; the GPU machine is x86_64 (amd64): fetch on an amd64 machine" >&2
  exit 1
fi

# Candidate version and architecture of every package, from one apt-cache call (each call reads
# the whole cache: about 0.6 s).
declare -A version=() pkg_arch=()
read_candidates() {
  local p v a
  version=(); pkg_arch=()
  while read -r p v a; do version[$p]="$v"; pkg_arch[$p]="$a"; done < <(
    apt-cache show --no-all-versions "${SHIP[@]}" 2>/dev/null |
      awk '/^Package: /{p=$2} /^Version: /{v=$2} /^Architecture: /{a=$2} /^$/{if (p != "") print p, v, a; p=""}
           END{if (p != "") print p, v, a}')
}
read_candidates
# apt lists: refresh once when a package has no candidate (a fresh machine).
missing_lists=()
for p in "${SHIP[@]}"; do [ -n "${version[$p]:-}" ] || missing_lists+=("$p"); done
if [ ${#missing_lists[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "gpu/fetch_deps.sh: apt knows no version of ${missing_lists[*]}; run as root (it then runs apt-get update) or run 'apt-get update' first" >&2
    exit 1
  fi
  echo "gpu/fetch_deps.sh: apt-get update (no candidate for ${missing_lists[*]})"
  apt-get update -q > /dev/null
  read_candidates
  for p in "${missing_lists[@]}"; do
    [ -n "${version[$p]:-}" ] || { echo "gpu/fetch_deps.sh: package $p is not in this machine's apt sources (Debian 12 main expected)" >&2; exit 1; }
  done
fi

mkdir -p "$DEBS"
declare -A want=()   # package -> .deb file name
to_get=()
for p in "${SHIP[@]}"; do
  v="${version[$p]}"
  f="${p}_${v//:/%3a}_${pkg_arch[$p]}.deb"
  want[$p]="$f"
  [ -f "$DEBS/$f" ] || to_get+=("$p=$v")
done
# Drop what the list no longer names (or older versions of what it names).
for f in "$DEBS"/*.deb; do
  [ -e "$f" ] || continue
  keep=0
  for p in "${SHIP[@]}"; do [ "$(basename "$f")" = "${want[$p]}" ] && keep=1; done
  for ((i = 0; i < ${#PINNED[@]}; i += 3)); do [ "$(basename "$f")" = "${PINNED[i]}" ] && keep=1; done
  if [ "$keep" = 0 ]; then echo "gpu/fetch_deps.sh: removing $(basename "$f") (not in the list, or an older version)"; rm -f "$f"; fi
done
if [ ${#to_get[@]} -gt 0 ]; then
  echo "gpu/fetch_deps.sh: downloading ${#to_get[@]} packages into $DEBS"
  # apt-get download as root warns that the _apt user cannot write here: harmless.
  (cd "$DEBS" && apt-get download -q "${to_get[@]}" 2>&1 | grep -v -e '^W: Download is performed unsandboxed' -e '^Get:' -e '^Fetched' || true)
  for p in "${SHIP[@]}"; do
    [ -f "$DEBS/${want[$p]}" ] || { echo "gpu/fetch_deps.sh: apt-get download $p did not produce $DEBS/${want[$p]} (network? apt sources?)" >&2; exit 1; }
  done
fi

for ((i = 0; i < ${#PINNED[@]}; i += 3)); do
  f="$DEBS/${PINNED[i]}"
  if [ ! -f "$f" ]; then
    echo "gpu/fetch_deps.sh: downloading ${PINNED[i]}"
    curl -sSfL -o "$f.part" "${PINNED[i + 1]}" || { echo "gpu/fetch_deps.sh: cannot download ${PINNED[i + 1]} (network?)" >&2; exit 1; }
    mv "$f.part" "$f"
  fi
  echo "${PINNED[i + 2]}  ${PINNED[i]}" | (cd "$DEBS" && sha256sum --quiet -c -) ||
    { echo "gpu/fetch_deps.sh: ${PINNED[i]} does not have the pinned SHA-256 ${PINNED[i + 2]}; removed it, run again" >&2; rm -f "$f"; exit 1; }
done

# Every Depends/Pre-Depends alternative list needs one member that is shipped, BASE or NOT_NEEDED.
declare -A known=()
for p in "${SHIP[@]}" "${BASE[@]}"; do known[$p]=1; done
for p in "${!NOT_NEEDED[@]}"; do known[$p]=1; done
unlisted=()
for p in "${SHIP[@]}"; do
  deps=$(dpkg-deb -f "$DEBS/${want[$p]}" Depends Pre-Depends | sed 's/^[A-Za-z-]*: //' | tr '\n' ',')
  IFS=',' read -r -a groups <<< "$deps"
  for g in "${groups[@]}"; do
    g=$(echo "$g" | sed 's/([^)]*)//g; s/:any//g; s/ //g')
    [ -n "$g" ] || continue
    ok=0
    IFS='|' read -r -a alts <<< "$g"
    for alt in "${alts[@]}"; do [ -n "${known[$alt]:-}" ] && ok=1; done
    [ "$ok" = 1 ] || unlisted+=("$g (Depends of $p)")
  done
done
if [ ${#unlisted[@]} -gt 0 ]; then
  printf 'gpu/fetch_deps.sh: a dependency is neither shipped, BASE nor NOT_NEEDED: %s\n' "${unlisted[@]}" >&2
  echo "gpu/fetch_deps.sh: fix: add it to SHIP (with its runtime libraries), BASE or NOT_NEEDED (with the reason) in $0" >&2
  exit 1
fi

# Checksums, and the newest symbol versions of glibc / libstdc++ the shipped shared libraries need.
pinned_files=()
for ((i = 0; i < ${#PINNED[@]}; i += 3)); do pinned_files+=("${PINNED[i]}"); done
(cd "$DEBS" && sha256sum "${want[@]}" "${pinned_files[@]}" > SHA256SUMS)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for p in "${SHIP[@]}"; do dpkg -x "$DEBS/${want[$p]}" "$tmp"; done
newest() {  # prefix: the highest <prefix>X.Y[.Z] named in the dynamic symbol tables
  find "$tmp" -type f \( -name '*.so.*' -o -path '*/bin/*' \) -print0 |
    xargs -0 objdump -T 2>/dev/null | grep -o "$1[0-9][0-9.]*" | sort -u -V | tail -1
}
{
  echo "# written by scripts/gpu/fetch_deps.sh: the newest versioned symbols the shipped libraries need"
  echo "GLIBC $(newest GLIBC_ | sed 's/GLIBC_//')"
  echo "GLIBCXX $(newest GLIBCXX_ | sed 's/GLIBCXX_//')"
  echo "CXXABI $(newest CXXABI_ | sed 's/CXXABI_//')"
} > "$DEBS/REQUIRES"

total=0
printf '%-24s %-24s %10s\n' package version bytes
for p in "${SHIP[@]}"; do
  f="$DEBS/${want[$p]}"
  s=$(stat -c %s "$f")
  total=$((total + s))
  printf '%-24s %-24s %10s\n' "$p" "$(dpkg-deb -f "$f" Version)" "$s"
done
echo "gpu/fetch_deps.sh: ${#SHIP[@]} packages, $(awk -v b="$total" 'BEGIN{printf "%.2f", b/1048576}') MiB of .debs in ${DEBS#$REPO/};" \
     "the libraries need $(grep -v '^#' "$DEBS/REQUIRES" | paste -sd' ')"
echo "gpu/fetch_deps.sh: not shipped (BASE, assumed present): ${BASE[*]}"
[ "${OPTCC_GPU_SKIP_SIZE:-0}" = 1 ] || bash "$REPO/scripts/gpu/size.sh"  # check.sh --dry-run prints it itself
