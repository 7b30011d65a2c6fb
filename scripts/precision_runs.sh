#!/usr/bin/env bash
# Mixed precision against fp32 on the main job (docs/configuration.md, "Mixed precision"): experiments/demo-3d.yaml (TP2 x PP2 x DP2,
# 8 local ranks, 300 steps, real corpus) once per precision, same seed, then the validation losses
# of both side by side.
#   scripts/precision_runs.sh [PRECISION[:GRAD_REDUCE_DTYPE] ...]      default: fp32 bf16
# e.g. `scripts/precision_runs.sh fp32 bf16 bf16:compute` adds a bf16 run whose DP all-reduce carries
# bf16 (parallel.grad_reduce_dtype: compute), named demo-3d-bf16-compute.
# Needs a built optcc (OPTCC, default build/optcc) and the prepared corpus (make data). Results go to
# results/demo-3d-<precision>.h5 (checkpoints off: nothing else is written); when one of them exists
# already the script stops before any run (optcc would write the rerun under another name, and the
# table would read the old file): move it away to run again, or set REUSE=1 to put the existing file
# in the table instead of running that one again. About 3 minutes per run on 2 cores.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
OPTCC=${OPTCC:-build/optcc}
PYTHON=${PYTHON:-/usr/bin/python3}
precisions=("$@")
[[ ${#precisions[@]} -gt 0 ]] || precisions=(fp32 bf16)
[[ -x $OPTCC ]] || { echo "$0: no optcc at $OPTCC. Fix: make build (or set OPTCC)" >&2; exit 2; }
[[ -f data/corpus.bin ]] || { echo "$0: no prepared corpus (data/corpus.bin). Fix: make data" >&2; exit 2; }
run_name() { echo "demo-3d-${1/:/-}"; }
for p in "${precisions[@]}"; do
  name=$(run_name "$p")
  [[ ! -e results/$name.h5 || ${REUSE:-0} == 1 ]] ||
    { echo "$0: results/$name.h5 exists. Fix: move it away first, or REUSE=1 to reuse it" >&2; exit 2; }
done
files=()
for p in "${precisions[@]}"; do
  name=$(run_name "$p")
  if [[ -e results/$name.h5 ]]; then
    echo "$name: reusing results/$name.h5"
    files+=("results/$name.h5")
    continue
  fi
  precision=${p%%:*}
  grad_reduce=fp32
  [[ $p != *:* ]] || grad_reduce=${p#*:}
  start=$(date +%s)
  "$OPTCC" train --config experiments/demo-3d.yaml --nproc 8 --set train.precision="$precision" \
    --set parallel.grad_reduce_dtype="$grad_reduce" --set log.run_name="$name" --set checkpoint.interval=0
  echo "$name: $(( $(date +%s) - start )) s"
  files+=("results/$name.h5")
done
"$PYTHON" - "${files[@]}" <<'PY'
import sys, h5py
rows = []
for path in sys.argv[1:]:
    with h5py.File(path, "r") as f:
        steps, losses = f["eval/step"][:], f["eval/loss"][:]
        train = f["train/loss"][:]
        rows.append((path, steps, losses, train))
print("validation loss by step (" + ", ".join(p for p, *_ in rows) + ")")
for i, step in enumerate(rows[0][1]):
    print(f"  step {int(step):>4}: " + "  ".join(f"{r[2][i]:.4f}" for r in rows))
base = rows[0][2][-1]
for path, _, losses, train in rows[1:]:
    print(f"{path}: final validation loss {losses[-1]:.4f} vs {base:.4f} ({losses[-1] - base:+.4f} nats, "
          f"{100 * (losses[-1] - base) / base:+.2f}%); mean train loss of the last 50 steps "
          f"{train[-50:].mean():.4f} vs {rows[0][3][-50:].mean():.4f}")
PY
