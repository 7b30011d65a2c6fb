#!/usr/bin/env bash
# Compiles every CUDA-only source of optcc (the tracked files named *_cuda.cpp) against a CUDA
# LibTorch's headers, on a machine without a GPU, so that the CUDA/NCCL path cannot rot between the
# runs on GPU machines. Run by .ci/run.
#
#   scripts/cuda/compile_check.sh
#
# What it compiles against: Debian 13's `libtorch-cuda-dev` (LibTorch 2.6 built for CUDA 12.4, NCCL
# 2.22; contrib section), unpacked with `apt-get download` + `dpkg -x` into /opt/libtorch-cuda of the
# cached Debian 13 root (scripts/debian13/root.sh): its runtime package needs the `nvidia-cudnn`
# installer, which downloads from NVIDIA, so it is not installed. CUDA's own headers (cuda_runtime.h,
# nccl.h) come from the CUDA toolkit of this machine, CUDA_HOME (default /usr/local/cuda), mounted
# read-only into the root. Each source gets `g++ -fsyntax-only` with LibTorch's CUDA defines
# (USE_CUDA, USE_C10D_NCCL) and OPTCC_WITH_CUDA, as CMake gives it in a CUDA build.
# Not linked: linking needs libtorch_cuda.so, which is in the runtime package this cannot install.
# Needs root. The .deb is kept in the root (/var/cache/optcc-cuda) and reused.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/../.." && pwd)"
. "$REPO/scripts/debian13/root.sh"
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
case "${1:-}" in
  -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "cuda/compile_check.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
esac
debian13_require_root cuda/compile_check.sh
if [ ! -f "$CUDA_HOME/include/cuda_runtime.h" ] || [ ! -f "$CUDA_HOME/include/nccl.h" ]; then
  echo "cuda/compile_check.sh: no CUDA toolkit headers at CUDA_HOME=$CUDA_HOME (cuda_runtime.h and nccl.h)." \
       "Fix: set CUDA_HOME to a CUDA toolkit with NCCL (nvcc on PATH is usually in \$CUDA_HOME/bin)" >&2
  exit 1
fi
mapfile -t sources < <(cd "$REPO" && git ls-files '*_cuda.cpp')
if [ ${#sources[@]} -eq 0 ]; then
  echo "cuda/compile_check.sh: no *_cuda.cpp source is tracked in $REPO: nothing to check is an error" >&2
  exit 1
fi

t_start=$(date +%s)
debian13_enter "$REPO"
debian13_bind "$CUDA_HOME" /usr/local/cuda ro
debian13_packages > /dev/null  # g++, fmt, spdlog, nlohmann-json... (the Debian 12 list)

# libtorch-cuda-dev: conflicts with libtorch-dev, so it is unpacked beside it, never installed.
if [ ! -f "$ROOT/opt/libtorch-cuda/.optcc-unpacked" ]; then
  echo "deb $MIRROR trixie contrib" > "$ROOT/etc/apt/sources.list.d/optcc-contrib.list"
  in_root apt-get update -q > /dev/null
  mkdir -p "$ROOT/var/cache/optcc-cuda"
  rm -f "$ROOT"/var/cache/optcc-cuda/*.deb
  in_root sh -c 'cd /var/cache/optcc-cuda && apt-get download -q libtorch-cuda-dev' > /dev/null 2>&1 || {
    echo "cuda/compile_check.sh: apt-get download libtorch-cuda-dev (Debian 13 contrib) failed" >&2; exit 1; }
  rm -rf "$ROOT/opt/libtorch-cuda"
  in_root sh -c 'dpkg -x /var/cache/optcc-cuda/libtorch-cuda-dev_*.deb /opt/libtorch-cuda'
  touch "$ROOT/opt/libtorch-cuda/.optcc-unpacked"
fi
deb=$(cd "$ROOT/var/cache/optcc-cuda" && ls libtorch-cuda-dev_*.deb)
cuda_version=$(sed -n 's/^#define CUDA_VERSION \([0-9]*\).*/\1/p' "$CUDA_HOME/include/cuda.h" 2>/dev/null || true)
nccl_version=$(sed -n 's/^#define NCCL_VERSION_CODE \([0-9]*\).*/\1/p' "$CUDA_HOME/include/nccl.h" 2>/dev/null || true)
echo "cuda-check: LibTorch headers from $deb; CUDA headers from $CUDA_HOME (CUDA_VERSION ${cuda_version:-?}," \
     "NCCL_VERSION_CODE ${nccl_version:-?})"

inc=/opt/libtorch-cuda/usr/include
flags=(-std=c++17 -fsyntax-only -Wall -Wextra -Wno-unused-parameter -D_GLIBCXX_USE_CXX11_ABI=1
       -DUSE_CUDA -DUSE_C10D_NCCL -DUSE_C10D_GLOO -DUSE_DISTRIBUTED -DOPTCC_WITH_CUDA
       -I/optcc -isystem "$inc" -isystem "$inc/torch/csrc/api/include" -isystem /usr/local/cuda/include)
failed=0
for src in "${sources[@]}"; do
  t0=$(date +%s)
  if in_root g++ "${flags[@]}" "/optcc/$src"; then
    echo "cuda-check: $src compiles ($(( $(date +%s) - t0 )) s)"
  else
    echo "cuda-check: $src FAILED to compile against the CUDA LibTorch headers" >&2
    failed=$((failed + 1))
  fi
done
echo "cuda-check: ${#sources[@]} CUDA-only sources, $failed failed, $(( $(date +%s) - t_start )) s"
[ "$failed" -eq 0 ]
