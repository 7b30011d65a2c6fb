#!/usr/bin/env bash
# Table 2's cpu-scale rows at another precision beside the committed fp32 rows (docs/configuration.md, "Mixed precision"):
#   scripts/precision_table2.sh [PRECISION [SEED [SCHEME ...]]]    default: bf16 1 baseline cb_fe_sc
# Each run is experiments/table2.yaml's cpu scale (experiments/schemes/mini-3d.yaml, TP2 x PP2 x
# DP2, 300 steps; cb_fe_sc with DP PowerSGD rank 16) with train.precision set, into
# results/table2-<precision>/<scheme>-seed<seed>.h5; the fp32 rows are
# results/reference/table2/<scheme>-seed<seed>.h5. Prints final validation loss and perplexity of
# both and the difference. Stops before any run when one of its results files exists. About 5
# minutes per run on 2 cores; needs build/optcc (OPTCC) and the prepared corpus (make data).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
OPTCC=${OPTCC:-build/optcc}
PYTHON=${PYTHON:-/usr/bin/python3}
precision=${1:-bf16}
seed=${2:-1}
shift $(( $# > 2 ? 2 : $# ))
schemes=("$@")
[[ ${#schemes[@]} -gt 0 ]] || schemes=(baseline cb_fe_sc)
[[ -x $OPTCC ]] || { echo "$0: no optcc at $OPTCC. Fix: make build (or set OPTCC)" >&2; exit 2; }
[[ -f data/corpus.bin ]] || { echo "$0: no prepared corpus (data/corpus.bin). Fix: make data" >&2; exit 2; }
out=results/table2-$precision
for s in "${schemes[@]}"; do
  [[ ! -e $out/$s-seed$seed.h5 ]] || { echo "$0: $out/$s-seed$seed.h5 exists. Fix: move it away first" >&2; exit 2; }
done
for s in "${schemes[@]}"; do
  sets=(--set compression.scheme="$s" --set train.seed="$seed" --set train.precision="$precision"
        --set log.dir="$out" --set log.run_name="$s-seed$seed" --set checkpoint.interval=0)
  # table2.yaml's cpu scale: cb_fe_sc with DP PowerSGD rank 16 (rank 128 saves nothing at h = 256)
  [[ $s == cb_fe_sc ]] && sets+=(--set "compression.dp={name: powersgd, rank: 16, error_feedback: true, warmup_steps: 0}")
  start=$(date +%s)
  "$OPTCC" train --config experiments/schemes/mini-3d.yaml --nproc 8 "${sets[@]}"
  echo "$s ($precision, seed $seed): $(( $(date +%s) - start )) s"
done
"$PYTHON" - "$out" "$seed" "$precision" "${schemes[@]}" <<'PY'
import math, sys, h5py
out, seed, precision, schemes = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
for s in schemes:
    def final(path):
        with h5py.File(path, "r") as f:
            return f["eval/loss"][-1]
    low = final(f"{out}/{s}-seed{seed}.h5")
    ref = final(f"results/reference/table2/{s}-seed{seed}.h5")
    print(f"{s} seed {seed}: validation loss {precision} {low:.4f} (ppl {math.exp(low):.1f}) vs fp32 {ref:.4f} "
          f"(ppl {math.exp(ref):.1f}): {low - ref:+.4f} nats")
PY
