#!/usr/bin/env bash
# Every CPU speed figure of docs/speed.md in one run, one thread:
#   scripts/bench_speed.sh [NANOGPT_DIR]
# 1. the training step beside nanoGPT's on bench-mini and bench-small (scripts/bench_peer_step.sh;
#    without NANOGPT_DIR, optcc's `bench step` alone);
# 2. bench_compression on the Fig. 14 slices at r = 16 and every codec's and reducer's defaults,
#    and the low-rank products kernel against library, 3 repetitions, into
#    results/bench/compression-<date>.json, then its bw_fraction table (scripts/bench_table.py).
# Run it on a quiet machine (nothing else on the cores: the figures are per-thread CPU time, but
# memory bandwidth and caches are shared). Builds nothing: needs build/optcc and
# build/tests/bench/bench_compression (make build). Environment: OPTCC, PYTHON, BENCH_REPS.
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
if [[ $# -ge 1 && ! -f ${1}/model.py ]]; then
  echo "$0: $1/model.py not found (NANOGPT_DIR: a karpathy/nanoGPT checkout you fetch yourself, holding model.py; it is not part of this repository)" >&2
  exit 2
fi
[[ $# -ge 1 ]] && set -- "$(cd "$1" && pwd)"
cd "$(dirname "$0")/.."
OPTCC=${OPTCC:-build/optcc}
PYTHON=${PYTHON:-/usr/bin/python3}
bench=build/tests/bench/bench_compression
[ -x "$OPTCC" ] && [ -x "$bench" ] || { echo "$0: build first (make build): need $OPTCC and $bench" >&2; exit 2; }
echo "== training step, one thread"
if [ $# -ge 1 ]; then
  OPTCC=$OPTCC PYTHON=$PYTHON scripts/bench_peer_step.sh "$1"
else
  for c in experiments/bench-mini.yaml experiments/bench-small.yaml; do "$OPTCC" bench step --config "$c" --threads 1; done
fi
mkdir -p results/bench
out=results/bench/compression-$(date -u +%Y%m%dT%H%M%S).json
echo "== compressors, one thread -> $out"
"$bench" --benchmark_filter='membw|fig14/[0-9x]+(/r16)?$|^gemm/' --benchmark_repetitions="${BENCH_REPS:-3}" \
  --benchmark_out="$out" --benchmark_out_format=json > /dev/null
"$PYTHON" scripts/bench_table.py "$out"
