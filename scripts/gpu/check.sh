#!/usr/bin/env bash
# optcc's check on a GPU machine (one GPU, Python with a CUDA torch, nvcc, cmake, ninja, no
# network, none of Debian's -dev packages): builds optcc there against the machine's torch and the
# Debian 12 .debs of scripts/gpu/debs/ (unpacked with dpkg -x into a prefix under /tmp, no root),
# then runs four steps, each under a time limit, each logging to OUT/<step>.log with one line in
# OUT/summary.md; a failed step is recorded and the next one still runs:
#   bench  optcc bench step on cuda for a 350M GPT (preset gpt-335m) and a 1.3B GPT (24 layers,
#          h 2048, 16 heads), each in bf16 and in fp32 (TF32 off): MFU = model GFLOP/s / the GPU's
#          dense peak in that precision (scripts/gpu/peaks.tsv, looked up by the GPU's name; the
#          peaks used are printed); model.attention auto (the fused kernel on a GPU), and the 1.3B
#          model once more with model.attention explicit (1.3b-explicit); each log ends with the
#          20 operations of one profiled step with the most GPU self time (bench step --profile)
#   fig14  bench_compression's Fig. 14 set on cuda:0 (OPTCC_BENCH_DEVICE=cuda) -> OUT/fig14-cuda.json,
#          then the same compressor in PyTorch-Python on the same GPU (reference_lowrank.py)
#          -> OUT/fig14-reference.json
#   ranks  experiments/demo.yaml on 2 ranks (dp 2, Gloo over CUDA tensors, one GPU) against 1 rank:
#          the training loss of every step from both results files, the largest relative
#          difference (needs the carried data/corpus.bin/.idx/.json)
#   unit   builds the test executables, then ctest -L unit (tests that need what this machine
#          lacks skip themselves with the reason)
#
#   scripts/gpu/check.sh OUT [--phase all|build|steps] [--steps bench,fig14,ranks,unit] [--deadline S] [--pack]
#   scripts/gpu/check.sh --dry-run
#
# --phase build: preflight, unpack, configure, build optcc and bench_compression (OUT/preflight.log,
# configure.log, build.log); the unit step builds the rest. --phase steps: the steps on that build.
# all (default) does both. --deadline S: a step whose time limit would end more than S seconds
# after the script started is not run ("not run (deadline)", counted as failed), so one device
# call ends in time; run those steps in a second call (--phase steps --steps ...) while the
# machine is warm. --pack: at the end, OUT's files other than summary.md go into OUT/logs.tar.gz
# (a device call returns at most 8 files). Exit: 0 when every step passed, 1 when one failed or
# was not run, 2 for a usage error.
# --dry-run (CI, no GPU): checks the kit's files and the texts it parses, fetches the .debs if
# missing (fetch_deps.sh), unpacks them into a temporary prefix, runs the CMake configure only
# against it and this machine's LibTorch (Debian's libtorch-dev), checks that every dependency
# came from the prefix, and prints what would travel (size.sh). Seconds (about a minute more when
# it must download the .debs).
# Environment: OPTCC_TORCH_PREFIX (LibTorch's CMake prefix; default: python3's torch),
# OPTCC_GPU_PREFIX (default /tmp/optcc-gpu-prefix), OPTCC_GPU_BUILD (default build-gpu),
# OPTCC_GPU_JOBS (default 16), OPTCC_GPU_BENCH_PRECISIONS (default "bf16 fp32": train.precision of
# the bench runs, each measured against its peaks.tsv column: fp32 without TF32, bf16),
# OPTCC_GPU_LOSS_TOL (largest relative difference of a step's training loss, 2 ranks against 1,
# accepted; default 1e-3),
# OPTCC_GPU_T_<STEP> (a step's time limit in s: CONFIGURE BUILD BUILD_TESTS UNIT BENCH_350M
# BENCH_1B3 FIG14 REFERENCE RANK1 RANK2), OPTCC_GPU_DEVICE (default cuda; cpu rehearses the steps' script on a CPU machine).
set -euo pipefail

REPO="$(cd "$(dirname "$0")/../.." && pwd)"
KIT="$REPO/scripts/gpu"
DEBS="${OPTCC_GPU_DEBS:-$KIT/debs}"
MULTIARCH=x86_64-linux-gnu
JOBS="${OPTCC_GPU_JOBS:-16}"
LOSS_TOL="${OPTCC_GPU_LOSS_TOL:-1e-3}"
# Time limits, seconds. The steps' sum (unit + bench + fig14 + ranks) is the GPU-time bound: 480 s.
T_CONFIGURE=${OPTCC_GPU_T_CONFIGURE:-240} T_BUILD=${OPTCC_GPU_T_BUILD:-540} T_UNIT=${OPTCC_GPU_T_UNIT:-140}
T_BENCH_350M=${OPTCC_GPU_T_BENCH_350M:-60} T_BENCH_1B3=${OPTCC_GPU_T_BENCH_1B3:-90} T_FIG14=${OPTCC_GPU_T_FIG14:-90}
T_REFERENCE=${OPTCC_GPU_T_REFERENCE:-60} T_RANK1=${OPTCC_GPU_T_RANK1:-45} T_RANK2=${OPTCC_GPU_T_RANK2:-55}
T_BUILD_TESTS=${OPTCC_GPU_T_BUILD_TESTS:-400}
BENCH_PRECISIONS="${OPTCC_GPU_BENCH_PRECISIONS:-bf16 fp32}"  # each model in each; MFU against that column
DEADLINE=0  # --deadline S (0: none)
DEV="${OPTCC_GPU_DEVICE:-cuda}"
RANK_STEPS=30
FIG14_FILTER='fig14/.*/r[0-9]+(/real_time)?$'  # paper/README.md's filter; on CUDA names end in /real_time

say() { echo "gpu-check: $*"; }
die() { echo "gpu-check: $*" >&2; exit 1; }
usage() { awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; }

# --- shared by --dry-run and the GPU run ------------------------------------------------------

# peak_for NAME PRECISION -> "TFLOPS<TAB>pattern<TAB>source" of the first peaks.tsv row whose pattern
# is a case-insensitive substring of NAME; nothing when no row matches.
peak_for() {
  awk -F'\t' -v name="$(echo "$1" | tr '[:upper:]' '[:lower:]')" -v prec="$2" '
    /^#/ || NF < 5 { next }
    $1 == "pattern" { for (i = 1; i <= NF; i++) if ($i == prec) c = i; next }
    c && index(name, tolower($1)) { print $c "\t" $1 "\t" $NF; exit }' "$KIT/peaks.tsv"
}

soname_of() {
  { objdump -p "$1" 2>/dev/null || readelf -d "$1" 2>/dev/null; } |
    sed -n 's/.*SONAME[^a-zA-Z0-9]*\([^] ]*\).*/\1/p' | head -1
}

# unpack_debs PREFIX: checks the .debs against SHA256SUMS, unpacks them into PREFIX (dpkg-deb, else
# ar + tar), and links into PREFIX/runtime the libraries whose SONAME this machine cannot resolve
# (only those go on LD_LIBRARY_PATH: the machine's own copies of the others stay in use).
unpack_debs() {
  local prefix="$1" deb member n=0 f so cache
  [ -f "$DEBS/SHA256SUMS" ] || die "no $DEBS/SHA256SUMS. Fix: run scripts/gpu/fetch_deps.sh on the Debian 12 machine and carry scripts/gpu/debs"
  (cd "$DEBS" && sha256sum --quiet -c SHA256SUMS) ||
    die "a .deb in $DEBS does not match its SHA256SUMS line (a partial copy?). Fix: run scripts/gpu/fetch_deps.sh again"
  rm -rf "$prefix"
  mkdir -p "$prefix/runtime"
  for deb in "$DEBS"/*.deb; do
    if command -v dpkg-deb > /dev/null 2>&1; then
      dpkg-deb -x "$deb" "$prefix"
    else
      member=$(ar t "$deb" | grep '^data\.tar') || die "$deb: no data.tar member (not a .deb?)"
      case "$member" in
        *.xz) ar p "$deb" "$member" | tar -xJ -C "$prefix" ;;
        *.zst) ar p "$deb" "$member" | tar --zstd -x -C "$prefix" ;;
        *.gz) ar p "$deb" "$member" | tar -xz -C "$prefix" ;;
        *) die "$deb: cannot unpack $member without dpkg-deb" ;;
      esac
    fi
    n=$((n + 1))
  done
  cache=$({ ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null; } | awk 'NR > 1 {print $1}' | sort -u)
  while IFS= read -r -d '' f; do
    so=$(soname_of "$f")
    [ -n "$so" ] || continue
    grep -qxF "$so" <<< "$cache" || ln -sf "$f" "$prefix/runtime/$so"
  done < <(find "$prefix/usr/lib" -type f -name 'lib*.so*' -print0)
  say "unpacked $n .debs into $prefix; libraries this machine lacks ($(ls "$prefix/runtime" | wc -l)), linked" \
      "from $prefix/runtime: $(ls "$prefix/runtime" | tr '\n' ' ')"
}

# configure PREFIX BUILD LOG [cmake args]: CMake + Ninja with pkg-config reading only the prefix
# (PKG_CONFIG_SYSROOT_DIR maps the .pc files' /usr into it) and FindHDF5 searching the libraries
# (the h5cc wrapper is not shipped: its link line would ask for -lcurl -lsz -lz dev links).
configure() {
  local prefix="$1" build="$2" log="$3"
  shift 3
  export PKG_CONFIG_LIBDIR="$prefix/usr/lib/$MULTIARCH/pkgconfig:$prefix/usr/share/pkgconfig"
  export PKG_CONFIG_PATH="" PKG_CONFIG_SYSROOT_DIR="$prefix"
  timeout -k 10 "$T_CONFIGURE" cmake -S "$REPO" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DPKG_CONFIG_EXECUTABLE="$prefix/usr/bin/pkgconf" \
    -DHDF5_C_COMPILER_EXECUTABLE=/bin/false -DHDF5_CXX_COMPILER_EXECUTABLE=/bin/false \
    -DCMAKE_C_STANDARD_INCLUDE_DIRECTORIES="$prefix/usr/include/$MULTIARCH" \
    -DCMAKE_CXX_STANDARD_INCLUDE_DIRECTORIES="$prefix/usr/include/$MULTIARCH" \
    "$@" > "$log" 2>&1
}

# verify_found BUILD PREFIX: every dependency the kit ships must have been found in PREFIX.
verify_found() {
  local cache="$1/CMakeCache.txt" prefix="$2" bad=0 var val where
  for var in yaml-cpp_DIR CLI11_DIR fmt_DIR spdlog_DIR nlohmann_json_DIR GTest_DIR benchmark_DIR \
             HDF5_C_INCLUDE_DIR HDF5_CXX_INCLUDE_DIR HDF5_hdf5_LIBRARY_RELEASE HDF5_hdf5_cpp_LIBRARY_RELEASE \
             OPENSSL_INCLUDE_DIR OPENSSL_CRYPTO_LIBRARY pkgcfg_lib_SENTENCEPIECE_sentencepiece \
             pkgcfg_lib_JEMALLOC_jemalloc PKG_CONFIG_EXECUTABLE; do
    val=$(sed -n "s|^$var:[A-Z]*=||p" "$cache" | head -1)
    case "$val" in
      "$prefix"/*) where="in the prefix" ;;
      "") where="NOT SET"; bad=1 ;;
      *) where="OUTSIDE the prefix"; bad=1 ;;
    esac
    printf '  %-40s %-18s %s\n' "$var" "$where" "${val/#$prefix/<prefix>}"
  done
  printf '  %-40s %-18s %s\n' Torch_DIR "(LibTorch)" "$(sed -n 's|^Torch_DIR:[A-Z]*=||p' "$cache")"
  [ "$bad" = 0 ] || echo "gpu-check: a dependency was not found in $prefix (list above); see the configure log" >&2
  # Other package configs found outside the prefix: LibTorch's own and the optional CPU GEMM's are
  # expected; anything else is a dependency the kit does not ship (an error in the dry run).
  local other
  other=$(grep -E '^[A-Za-z0-9_.+-]+_DIR:PATH=/' "$cache" | grep -v "=$prefix/" | sed 's/_DIR:PATH=.*//' | grep -v '_INCLUDE$' |
          grep -vxE 'Torch|Caffe2|gflags|glog|Protobuf|dnnl|MKL|MKLDNN|kineto|CUDNN|nvtx3' | paste -sd' ' || true)
  if [ -n "$other" ]; then
    echo "gpu-check: package configs found outside the prefix, not LibTorch's: $other. Fix: ship them (SHIP in" \
         "scripts/gpu/fetch_deps.sh) and list them in verify_found, or add them to its LibTorch list" >&2
    [ "${DRY:-0}" = 1 ] && bad=1
  fi
  return "$bad"
}

# --- --dry-run ----------------------------------------------------------------------------------

dry_run() {
  local t0 f tmp peak
  DRY=1
  t0=$(date +%s)
  for f in fetch_deps.sh size.sh check.sh peaks.tsv README.md reference_lowrank.py loss_parity.py; do
    [ -f "$KIT/$f" ] || die "kit file scripts/gpu/$f is missing"
  done
  for f in fetch_deps.sh size.sh check.sh; do bash -n "$KIT/$f" || die "scripts/gpu/$f: bash syntax error"; done
  for f in reference_lowrank.py loss_parity.py; do
    python3 -c 'import ast, sys; ast.parse(open(sys.argv[1]).read())' "$KIT/$f" || die "scripts/gpu/$f: Python syntax error"
  done
  for f in "NVIDIA H200:67:H200" "NVIDIA GH200 480GB:67:GH200" "NVIDIA H100 PCIe:51:H100 PCIe" \
           "NVIDIA A100-SXM4-80GB:19.5:A100" "NVIDIA L40S:91.6:L40S"; do
    peak=$(peak_for "${f%%:*}" fp32)
    [ "$(cut -f1,2 <<< "$peak")" = "$(cut -d: -f2,3 <<< "$f" | tr : '\t')" ] ||
      die "scripts/gpu/peaks.tsv: '${f%%:*}' gives '$(cut -f1,2 <<< "$peak" | tr '\t' ' ')', expected fp32 $(cut -d: -f2,3 <<< "$f" | tr : ' ') (row order or a value changed)"
  done
  # The texts the GPU run parses, and the config keys it sets, as optcc prints / reads them.
  grep -qF 'model {:.1f} GFLOP/s | best GEMM {:.1f} GFLOP/s' "$REPO/harness/main.cpp" ||
    die "harness/main.cpp no longer prints 'model {:.1f} GFLOP/s | best GEMM {:.1f} GFLOP/s' (bench step): update bench_step() in scripts/gpu/check.sh"
  grep -qF 'step {:.1f} ms | {:.0f} tokens/s | model' "$REPO/harness/main.cpp" ||
    die "harness/main.cpp no longer prints 'step {:.1f} ms | {:.0f} tokens/s | model' (bench step): update bench_one() in scripts/gpu/check.sh"
  grep -qF '"--precision"' "$REPO/harness/main.cpp" ||
    die "optcc bench step has no --precision: bench_one() in scripts/gpu/check.sh passes it"
  grep -qF '"--profile"' "$REPO/harness/main.cpp" ||
    die "optcc bench step has no --profile: bench_one() in scripts/gpu/check.sh passes it (the top-kernels table)"
  grep -qF '{"loss", ColumnType::kFloat64' "$REPO/harness/train/run_records.cpp" ||
    die "harness/train/run_records.cpp has no /train loss column: scripts/gpu/loss_parity.py reads it"
  grep -qE 'std::string device = ' "$REPO/harness/config/config.h" ||
    die "harness/config/config.h has no parallel.device: check.sh sets --set parallel.device=cuda"
  say "kit files, peaks.tsv lookups and the parsed texts of optcc: ok"

  if [ ! -f "$DEBS/SHA256SUMS" ] || ! (cd "$DEBS" && sha256sum --quiet -c SHA256SUMS > /dev/null 2>&1); then
    say "the .debs are missing or stale: running scripts/gpu/fetch_deps.sh"
    OPTCC_GPU_SKIP_SIZE=1 bash "$KIT/fetch_deps.sh"
  fi
  DRY_TMP=$(mktemp -d /tmp/optcc-gpu-dry.XXXXXX)
  trap 'rm -rf "$DRY_TMP"' EXIT
  tmp="$DRY_TMP"
  unpack_debs "$tmp/prefix"
  local t1
  t1=$(date +%s)
  # Only the kit's prefix on CMAKE_PREFIX_PATH (searched before the system's /usr); LibTorch is
  # Debian's, found in /usr. verify_found then proves each dependency came from the prefix.
  local log=/tmp/optcc-gpu-dry-configure.log  # kept for CI's logs
  if ! configure "$tmp/prefix" "$tmp/build" "$log" -DCMAKE_PREFIX_PATH="$tmp/prefix/usr"; then
    tail -30 "$log" >&2
    die "CMake configure against the unpacked prefix failed (log above; all of it in $log)"
  fi
  say "configure against the prefix: $(( $(date +%s) - t1 )) s (log: $log); $(grep -m1 'optcc: LibTorch' "$log" | sed 's/^-- //')"
  verify_found "$tmp/build" "$tmp/prefix" || die "dry run failed: a dependency came from outside the kit's prefix"
  bash "$KIT/size.sh"
  say "dry run ok in $(( $(date +%s) - t0 )) s"
}

# --- the GPU run --------------------------------------------------------------------------------

FAILED=0
record() {  # step status seconds details
  printf '| %s | %s | %s | %s |\n' "$1" "$2" "$3" "$4" >> "$OUT/summary.md"
  say "$1: $2 (${3} s) $4"
  case "$2" in ok|skipped*) ;; *) FAILED=$((FAILED + 1)) ;; esac
}

# timed LIMIT LOG cmd...: runs cmd with a time limit (its whole process group), appending to LOG.
timed() {
  local limit="$1" log="$2"
  shift 2
  echo "\$ $*" >> "$log"
  timeout -k 10 "$limit" "$@" >> "$log" 2>&1
}
status_of() { case "$1" in 0) echo ok ;; 124|137) echo "TIMEOUT (${2} s)" ;; *) echo "FAILED (exit $1)" ;; esac; }

preflight() {
  local log="$OUT/preflight.log" glibc need have cxx problems=()
  {
    echo "host $(hostname), $(uname -srm), $(nproc) cores"
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv 2>&1 || echo "nvidia-smi failed"
    echo "python3: $(python3 --version 2>&1)"
    python3 - <<'PY' 2>&1 || true
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      "device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-",
      "cxx11_abi", torch.compiled_with_cxx11_abi())
print("cmake_prefix_path", torch.utils.cmake_prefix_path)
PY
    echo "nvcc: $( (nvcc --version || /usr/local/cuda/bin/nvcc --version) 2>&1 | tail -1)"
    echo "nccl.h: $( { ls /usr/local/cuda/include/nccl.h /usr/include/nccl.h 2>/dev/null
                       python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "include", "nccl.h"))' 2>/dev/null; } | paste -sd' ')"
    echo "cmake: $(cmake --version 2>&1 | head -1); ninja: $(ninja --version 2>&1); c++: $(c++ --version 2>&1 | head -1)"
    echo "CXX=${CXX:-unset}: $( ("${CXX:-g++}" --version || true) 2>&1 | head -1); g++ on PATH: $(command -v g++ || echo none)"
    echo "glibc: $(ldd --version 2>&1 | head -1)"
    cat "$DEBS/REQUIRES"
  } > "$log" 2>&1
  [ "$(uname -m)" = x86_64 ] || problems+=("not x86_64: the .debs are amd64")
  grep -q 'cxx11_abi False' "$log" && problems+=("torch uses the pre-C++11 ABI (torch < 2.7 pip wheels) but Debian's libraries use the C++11 ABI: linking fails. Fix: torch >= 2.7, or OPTCC_TORCH_PREFIX=<a cxx11-abi LibTorch>")
  if ! grep -q '^torch ' "$log"; then
    problems+=("python3 cannot import torch (set OPTCC_TORCH_PREFIX to a LibTorch's CMake prefix instead)")
  elif ! grep -q 'available True' "$log"; then
    problems+=("torch sees no GPU (torch.cuda.is_available() is False)")
  fi
  glibc=$(ldd --version 2>&1 | head -1 | grep -o '[0-9]\+\.[0-9]\+$' || true)
  need=$(awk '$1 == "GLIBC" {print $2}' "$DEBS/REQUIRES")
  if [ -n "$glibc" ] && [ "$(printf '%s\n%s\n' "$need" "$glibc" | sort -V | head -1)" != "$need" ]; then
    problems+=("glibc $glibc is older than the $need the .debs need")
  fi
  cxx=$(c++ -print-file-name=libstdc++.so.6 2>/dev/null || true)
  have=$(strings "$cxx" 2>/dev/null | grep -E '^GLIBCXX_[0-9.]+$' | sed 's/GLIBCXX_//' | sort -V | tail -1 || true)
  need=$(awk '$1 == "GLIBCXX" {print $2}' "$DEBS/REQUIRES")
  echo "libstdc++: $cxx, newest GLIBCXX_$have" >> "$log"
  if [ -n "$have" ] && [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]; then
    problems+=("libstdc++ (GLIBCXX_$have) is older than the GLIBCXX_$need the .debs need")
  fi
  PREFLIGHT_PROBLEMS=$(IFS=';'; echo "${problems[*]+"${problems[*]}"}" | sed 's/;/; /g')
  [ ${#problems[@]} -eq 0 ]
}

missing_libraries() {  # libraries the prefix's libraries need that neither the prefix nor the machine has
  local f
  while IFS= read -r -d '' f; do
    ldd "$f" 2>/dev/null | awk -v lib="$(basename "$f")" '/not found/ {print $1 " (needed by " lib ")"}'
  done < <(find "$PREFIX/usr/lib" -type f -name 'lib*.so.*' -print0) | sort -u | paste -sd' '
}

phase_build() {
  local t rc torch missing nvcc
  t=$(date +%s)
  if preflight; then
    record preflight ok $(( $(date +%s) - t )) "$(grep -m1 '^torch ' "$OUT/preflight.log" || echo 'torch: see preflight.log')"
  else
    record preflight FAILED $(( $(date +%s) - t )) "$PREFLIGHT_PROBLEMS (preflight.log)"
    if grep -q 'cxx11_abi False' "$OUT/preflight.log" && [ -z "${OPTCC_TORCH_PREFIX:-}" ]; then
      record build "skipped: C++ ABI mismatch" 0 "see the preflight line"
      return
    fi
  fi
  t=$(date +%s)
  unpack_debs "$PREFIX" >> "$OUT/preflight.log" 2>&1
  export LD_LIBRARY_PATH="$PREFIX/runtime${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"  # pkgconf, ld, the tests
  missing=$(missing_libraries)
  [ -z "$missing" ] || echo "libraries neither shipped nor on this machine: $missing" >> "$OUT/preflight.log"
  record unpack ok $(( $(date +%s) - t )) "$(ls "$DEBS"/*.deb | wc -l) .debs -> $PREFIX; runtime: $(ls "$PREFIX/runtime" | wc -l) libs${missing:+; MISSING: $missing}"

  torch="${OPTCC_TORCH_PREFIX:-$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)}"
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  local cuda_args=()
  if [ -x "$nvcc" ]; then
    cuda_args=(-DCMAKE_CUDA_COMPILER="$nvcc" -DCUDAToolkit_ROOT="$(dirname "$(dirname "$nvcc")")")
    export PATH="$(dirname "$nvcc"):$PATH"
  fi
  local cap
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 || true)
  [ -z "$cap" ] || export TORCH_CUDA_ARCH_LIST="$cap"
  t=$(date +%s)
  rc=0
  configure "$PREFIX" "$BUILD" "$OUT/configure.log" -DCMAKE_PREFIX_PATH="$PREFIX/usr;$torch" "${cuda_args[@]}" \
    -DCMAKE_POLICY_VERSION_MINIMUM=3.5 || rc=$?
  if [ "$rc" = 0 ]; then
    verify_found "$BUILD" "$PREFIX" >> "$OUT/configure.log" 2>&1 || rc=$?
  fi
  record configure "$(status_of "$rc" "$T_CONFIGURE")" $(( $(date +%s) - t )) "$( [ "$rc" = 0 ] &&
    grep -m1 'optcc: LibTorch' "$OUT/configure.log" | sed 's/^-- //' ||
    grep -m1 -A3 -e 'CMake Error' -e 'OUTSIDE the prefix' -e 'NOT SET' "$OUT/configure.log" | tr '\n' ' ' | cut -c1-300)"
  [ "$rc" = 0 ] || { record build "skipped: configure failed" 0 "see configure.log"; return; }
  t=$(date +%s)
  rc=0
  timed "$T_BUILD" "$OUT/build.log" cmake --build "$BUILD" -j "$JOBS" --target optcc bench_compression || rc=$?
  record build "$(status_of "$rc" "$T_BUILD")" $(( $(date +%s) - t )) \
    "$( [ "$rc" = 0 ] && "$BUILD/optcc" --version 2>&1 | head -1 ||
    { grep -m1 -B2 -E 'error|undefined reference' "$OUT/build.log" | tr '\n' ' ' | cut -c1-300; echo " (build.log)"; })"
}

# build_tests: the test executables, which the build phase left out (the unit step needs them).
build_tests() {
  local t rc=0
  t=$(date +%s)
  timed "$T_BUILD_TESTS" "$OUT/build-tests.log" cmake --build "$BUILD" -j "$JOBS" || rc=$?
  record "build tests" "$(status_of "$rc" "$T_BUILD_TESTS")" $(( $(date +%s) - t )) \
    "$( [ "$rc" = 0 ] && echo "every target (cmake --build, -j $JOBS)" ||
    { grep -m1 -B2 -E 'error|undefined reference' "$OUT/build-tests.log" | tr '\n' ' ' | cut -c1-300; echo " (build-tests.log)"; })"
  return "$rc"
}

unit_step() {
  local t rc=0 line skipped
  fits unit $((T_BUILD_TESTS + T_UNIT)) || return 0
  build_tests || { record unit "skipped: the tests did not build" 0 "see build-tests.log"; FAILED=$((FAILED + 1)); return; }
  t=$(date +%s)
  timed "$T_UNIT" "$OUT/unit.log" ctest --test-dir "$BUILD" -L unit -j "$JOBS" --timeout 120 --output-on-failure || rc=$?
  line=$(grep -E 'tests passed, [0-9]+ tests? failed out of' "$OUT/unit.log" | tail -1)
  skipped=$(grep -c '(Skipped)' "$OUT/unit.log" || true)
  record unit "$(status_of "$rc" "$T_UNIT")" $(( $(date +%s) - t )) \
    "${line:-no ctest summary}; skipped $skipped (unit.log)"
  backtraces
}

# backtraces: for the first 3 tests that ctest reports as SEGFAULT, the stack of the crash
# (cuda-gdb, which also debugs programs without GPU code, else gdb) -> OUT/backtraces.txt.
backtraces() {
  local dbg name cmd n=0
  dbg=$(command -v cuda-gdb || command -v gdb || true)
  [ -n "$dbg" ] || return 0
  while read -r name; do
    [ "$n" -lt 3 ] || break
    # 65 s each at most; within --deadline (the call's own limit), else none
    [ "$DEADLINE" = 0 ] || [ $(( $(date +%s) - T_START + 65 )) -le "$DEADLINE" ] || break
    n=$((n + 1))
    cmd=$(ctest --test-dir "$BUILD" -N -V -R "^${name}\$" 2>/dev/null | sed -n 's/^[0-9]*: Test command: //p' | head -1)
    [ -n "$cmd" ] || continue
    { echo "=== $name: $cmd"
      eval "set -- $cmd"  # ctest prints the command with its arguments in double quotes
      timeout -k 5 60 "$dbg" -batch -ex run -ex bt -ex "info sharedlibrary" --args "$@" 2>&1 | tail -120
    } >> "$OUT/backtraces.txt"
  done < <(sed -n 's/^[[:space:]]*[0-9]* - \([^ ]*\) (SEGFAULT).*/\1/p' "$OUT/unit.log")
  [ ! -f "$OUT/backtraces.txt" ] || say "backtraces of $n crashing tests: backtraces.txt"
}

# fits STEP LIMIT: true when the step's limit ends before --deadline; else records it as not run.
fits() {
  local end=$(( $(date +%s) - T_START + $2 ))
  [ "$DEADLINE" = 0 ] || [ "$end" -le "$DEADLINE" ] && return 0
  record "$1" "not run (deadline)" 0 "its limit ($2 s) would end at $end s, past --deadline $DEADLINE s"
  grep -qw "$CUR_STEP" <<< "${NOT_RUN[*]-}" || NOT_RUN+=("$CUR_STEP")
  return 1
}

# bench_one NAME PRECISION LIMIT [--set ...]: one `optcc bench step` on the device in that
# train.precision, MFU against that precision's peak (PEAK_<precision>, from peaks.tsv).
bench_one() {
  local name="$1" prec="$2" limit="$3" t rc=0 log="$OUT/bench-$1-$2.log" model gemm step dev tok mfu peak att
  shift 3
  fits "bench $name $prec" "$limit" || return 0
  peak=$(eval echo "\${PEAK_$prec:-1e-9}")
  t=$(date +%s)
  timed "$limit" "$log" "$BUILD/optcc" bench step --config experiments/bench-mini.yaml --steps 10 --warmup 2 \
    --precision "$prec" --profile 20 --set parallel.device="$DEV" --set model.vocab_size=50257 "$@" || rc=$?
  model=$(sed -n 's/.*| model \([0-9.]*\) GFLOP\/s.*/\1/p' "$log" | tail -1)
  gemm=$(sed -n 's/.*| best GEMM \([0-9.]*\) GFLOP\/s.*/\1/p' "$log" | tail -1)
  step=$(sed -n 's/.*  step \([0-9.]*\) ms |.*/\1/p' "$log" | tail -1)
  tok=$(sed -n 's/.* ms | \([0-9]*\) tokens\/s |.*/\1/p' "$log" | tail -1)
  dev=$(sed -n 's/.* device=\([^ ]*\) .*/\1/p' "$log" | tail -1)
  att=$(sed -n 's/.* attention=\([a-z]*\).*/\1/p' "$log" | tail -1)
  if [ "$rc" = 0 ] && [ -n "$model" ]; then
    mfu=$(awk -v m="$model" -v p="$peak" 'BEGIN{printf "%.1f", 100 * m / (p * 1000)}')
    [ "${dev#"$DEV"}" != "$dev" ] || rc=3
    record "bench $name $prec" "$( [ "$rc" = 0 ] && echo ok || echo "FAILED (ran on ${dev:-?}, not $DEV)")" $(( $(date +%s) - t )) \
      "device ${dev:-?}; attention ${att:-?}; step $step ms; $tok tokens/s; model $model GFLOP/s = MFU $mfu % of $peak TFLOP/s $prec; best GEMM $gemm GFLOP/s = $(awk -v g="$gemm" -v p="$peak" 'BEGIN{printf "%.1f", 100 * g / (p * 1000)}') % of peak"
  else
    local st
    st=$(status_of "$rc" "$limit")
    [ "$rc" != 0 ] || st="FAILED (no 'model ... GFLOP/s' in the output)"
    record "bench $name $prec" "$st" $(( $(date +%s) - t )) "$(tail -2 "$log" | tr '\n' ' ' | cut -c1-300)"
  fi
}

bench_step() {
  local gpu row prec
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 ||
        python3 -c 'import torch; print(torch.cuda.get_device_name(0))' 2>/dev/null || true)
  for prec in $BENCH_PRECISIONS; do
    row=$(peak_for "$gpu" "$prec")
    if [ -z "$row" ]; then
      record "peak $prec" "FAILED (no peak)" 0 "GPU '$gpu' has no $prec value in scripts/gpu/peaks.tsv: add it (datasheet, dense $prec)"
      continue
    fi
    eval "PEAK_$prec=$(cut -f1 <<< "$row")"
    say "peak used for MFU: $(cut -f1 <<< "$row") TFLOP/s $prec for '$gpu' (peaks.tsv row '$(cut -f2 <<< "$row")': $(cut -f3 <<< "$row"))"
    echo "peak used for MFU: $(cut -f1 <<< "$row") TFLOP/s dense $prec, GPU '$gpu', peaks.tsv row '$(cut -f2 <<< "$row")' ($(cut -f3 <<< "$row"))" >> "$OUT/peaks-used.txt"
  done
  # The 1.3B model first: it is the one with an MFU goal. model.attention auto = the fused kernel on
  # a GPU (bench-mini.yaml draws no dropout); 1.3b-explicit is the same step with the explicit one.
  local gpt1b3=(--set model.preset=gpt-335m --set model.num_layers=24 --set model.hidden_size=2048
                --set model.num_heads=16 --set train.micro_batch_size=4 --set train.global_batch_size=8)
  for prec in $BENCH_PRECISIONS; do
    bench_one 1.3b "$prec" "$T_BENCH_1B3" "${gpt1b3[@]}"
  done
  bench_one 1.3b-explicit "${BENCH_PRECISIONS%% *}" "$T_BENCH_1B3" "${gpt1b3[@]}" --set model.attention=explicit
  for prec in $BENCH_PRECISIONS; do
    bench_one 350m "$prec" "$T_BENCH_350M" --set model.preset=gpt-335m --set train.micro_batch_size=8 --set train.global_batch_size=8
  done
}

fig14_step() {
  local t rc=0 log="$OUT/fig14.log" n errors enc pow
  if fits fig14 "$T_FIG14"; then
    t=$(date +%s)
    OPTCC_BENCH_DEVICE="$DEV" timed "$T_FIG14" "$log" "$BUILD/tests/bench/bench_compression" \
      --benchmark_filter="$FIG14_FILTER" --benchmark_out="$OUT/fig14-$DEV.json" --benchmark_out_format=json || rc=$?
    n=$(grep -cE '^(codec|reducer|gemm)/' "$log" || true)
    errors=$(grep -c 'ERROR OCCURRED' "$log" || true)
    enc=$(awk '$1 ~ /^codec\/lowrank\/encode\/fig14\/2048x12288\/r16/ {print $2 " " $3}' "$log" | head -1)
    pow=$(awk '$1 ~ /^reducer\/powersgd\/reduce\/fig14\/2048x12288\/r16/ {print $2 " " $3}' "$log" | head -1)
    [ "$rc" != 0 ] || [ "$errors" = 0 ] || rc=1
    record fig14 "$(status_of "$rc" "$T_FIG14")" $(( $(date +%s) - t )) \
      "$n benchmarks, $errors errors; 2048x12288 r16: lowrank encode ${enc:-?}, powersgd reduce ${pow:-?}; fig14-$DEV.json"
  fi
  fits "fig14 reference" "$T_REFERENCE" || return 0
  t=$(date +%s)
  rc=0
  log="$OUT/fig14-reference.log"
  PYTHONUNBUFFERED=1 timed "$T_REFERENCE" "$log" python3 "$KIT/reference_lowrank.py" "$DEV" 1 \
    --json "$OUT/fig14-reference.json" || rc=$?
  record "fig14 reference" "$(status_of "$rc" "$T_REFERENCE")" $(( $(date +%s) - t )) \
    "PyTorch-Python low-rank compressor: $(grep -c ' r=' "$log" || true) points; 2048x12288 r16: $(grep -m1 '^2048x12288 r=16 ' "$log" | cut -d' ' -f3- || echo '?'); fig14-reference.json"
}

ranks_step() {
  local t rc1=0 rc2=0 f parity common
  fits ranks $((T_RANK1 + T_RANK2 + 30)) || return 0
  t=$(date +%s)
  for f in data/corpus.bin data/corpus.idx data/corpus.json; do
    [ -f "$REPO/$f" ] || { record ranks "FAILED (no corpus)" 0 "$f was not carried: name data/corpus.bin, .idx and .json in carry (scripts/gpu/size.sh)"; return; }
  done
  common=(--config experiments/demo.yaml --set parallel.device="$DEV" --set parallel.backend=gloo
          --set train.train_steps="$RANK_STEPS" --set train.eval_interval=0 --set log.interval=1
          --set log.dir="$OUT/ranks" --set checkpoint.interval=0
          --set model.hidden_dropout=0.0 --set model.attention_dropout=0.0)
  timed "$T_RANK1" "$OUT/ranks-1.log" "$BUILD/optcc" train "${common[@]}" --set log.run_name=ranks-1 || rc1=$?
  timed "$T_RANK2" "$OUT/ranks-2.log" "$BUILD/optcc" train "${common[@]}" --set parallel.dp=2 --set log.run_name=ranks-2 --nproc 2 || rc2=$?
  if [ "$rc1" != 0 ] || [ "$rc2" != 0 ]; then
    record ranks "FAILED (1 rank: $(status_of "$rc1" "$T_RANK1"), 2 ranks: $(status_of "$rc2" "$T_RANK2"))" $(( $(date +%s) - t )) \
      "see ranks-1.log, ranks-2.log"
    return
  fi
  # Every step's training loss from the two results files (/train loss, fp32), not the log's 4 digits.
  if parity=$(timeout 30 python3 "$KIT/loss_parity.py" "$OUT/ranks/ranks-1.h5" "$OUT/ranks/ranks-2.h5" \
               --steps "$RANK_STEPS" --tolerance "$LOSS_TOL" 2>&1 | tee "$OUT/ranks-parity.txt" | tail -1); then
    record ranks ok $(( $(date +%s) - t )) "dp 2 (gloo, $DEV) against 1 rank: $parity"
  else
    record ranks "FAILED" $(( $(date +%s) - t )) "$parity (ranks-parity.txt)"
  fi
}

pack() {  # OUT's files but summary.md into OUT/logs.tar.gz (a device call returns at most 8 files)
  (cd "$OUT" && find . -mindepth 1 -maxdepth 1 ! -name summary.md ! -name logs.tar.gz -print0 |
     tar -czf logs.tar.gz --null -T - && find . -mindepth 1 -maxdepth 1 ! -name summary.md ! -name logs.tar.gz -exec rm -rf {} +)
  say "packed into $OUT/logs.tar.gz ($(du -k "$OUT/logs.tar.gz" | cut -f1) KiB)"
}

# --- main -----------------------------------------------------------------------------------------

case "${1:-}" in
  -h|--help|"") usage; [ -n "${1:-}" ] && exit 0; exit 2 ;;
  --dry-run) [ $# -eq 1 ] || { echo "gpu-check: --dry-run takes no other argument" >&2; exit 2; }; dry_run; exit 0 ;;
  -*) echo "gpu-check: unknown option '$1'; the first argument is OUT or --dry-run (see --help)" >&2; exit 2 ;;
esac
OUT_ARG="$1"
shift
PHASE=all
STEPS=bench,fig14,ranks,unit
PACK=0
NOT_RUN=()
while [ $# -gt 0 ]; do
  case "$1" in
    --phase) PHASE="${2:-}"; shift ;;
    --steps) STEPS="${2:-}"; shift ;;
    --deadline) DEADLINE="${2:-}"; shift
                [[ "$DEADLINE" =~ ^[0-9]+$ ]] || { echo "gpu-check: --deadline '$DEADLINE': seconds, a whole number" >&2; exit 2; } ;;
    --pack) PACK=1 ;;
    *) echo "gpu-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case "$PHASE" in all|build|steps) ;; *) echo "gpu-check: --phase '$PHASE': use all, build or steps" >&2; exit 2 ;; esac
PREFIX="${OPTCC_GPU_PREFIX:-/tmp/optcc-gpu-prefix}"
BUILD="${OPTCC_GPU_BUILD:-$REPO/build-gpu}"
if [ "$STEPS" = not-run ]; then  # what an earlier call's --deadline left out (nothing: none left)
  STEPS=$(cat "$BUILD/steps-not-run" 2>/dev/null || true)
  [ -n "$STEPS" ] || { echo "gpu-check: --steps not-run: no step was left out by an earlier call ($BUILD/steps-not-run)"; exit 0; }
fi
for s in ${STEPS//,/ }; do
  case "$s" in unit|bench|fig14|ranks) ;; *) echo "gpu-check: --steps: unknown step '$s' (unit, bench, fig14, ranks)" >&2; exit 2 ;; esac
done
mkdir -p "$OUT_ARG"
OUT="$(cd "$OUT_ARG" && pwd)"
cd "$REPO"
T_START=$(date +%s)
{
  echo "# optcc GPU check, phase $PHASE: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(hostname)"
  echo
  echo "| step | result | seconds | details |"
  echo "|---|---|---|---|"
} > "$OUT/summary.md"

if [ "$PHASE" != steps ]; then phase_build; fi
if [ "$PHASE" != build ]; then
  if [ ! -x "$BUILD/optcc" ]; then
    record steps "FAILED (no build)" 0 "no $BUILD/optcc: run scripts/gpu/check.sh OUT --phase build first (same machine)"
  else
    # A fresh shell: the prefix's runtime libraries (unpacked again when /tmp lost them).
    [ -d "$PREFIX/runtime" ] || unpack_debs "$PREFIX" > /dev/null
    export LD_LIBRARY_PATH="$PREFIX/runtime${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    nvidia-smi > "$OUT/nvidia-smi.log" 2>&1 || true
    for s in ${STEPS//,/ }; do
      CUR_STEP=$s
      case "$s" in
        unit) unit_step ;;
        bench) bench_step ;;
        fig14) fig14_step ;;
        ranks) ranks_step ;;
      esac
    done
  fi
fi
echo >> "$OUT/summary.md"
[ ! -f "$OUT/peaks-used.txt" ] || { cat "$OUT/peaks-used.txt"; echo; } >> "$OUT/summary.md"
echo "phase $PHASE: $(( $(date +%s) - T_START )) s, $FAILED failed" >> "$OUT/summary.md"
say "phase $PHASE done in $(( $(date +%s) - T_START )) s, $FAILED failed; summary: $OUT/summary.md"
# The steps the deadline left out, for the next call on this machine: --steps not-run.
if [ -d "$BUILD" ]; then (IFS=,; echo "${NOT_RUN[*]-}") > "$BUILD/steps-not-run"; fi
[ ${#NOT_RUN[@]} -eq 0 ] || say "not run (deadline): ${NOT_RUN[*]}; next call: --phase steps --steps not-run"
[ "$PACK" = 0 ] || pack
[ "$FAILED" = 0 ]
