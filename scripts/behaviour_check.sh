#!/usr/bin/env bash
# Records what a refactoring must leave unchanged, so two builds can be compared with diff:
#   scripts/behaviour_check.sh OPTCC OUT_DIR
#   diff -r OUT_BEFORE OUT_AFTER
# OUT_DIR/traffic/: `optcc traffic` (text and --json) for the paper's model configs under every scheme,
# every LEP mode, both backward phases, every DP and embedding reducer, and the model options
# (--recompute --element-bytes 2, --reference-powersgd, bf16 with grad_reduce_dtype compute).
# OUT_DIR/simulate/: `optcc simulate` of the 2.5B and 8.3B paper configs and of demo-3d on this-machine.
# OUT_DIR/runs/: the deterministic columns (losses, gradient norms, bytes, calls, memory components,
# per-tensor records) of two short CPU runs on the demo corpus: demo-3d (TP2 x PP2 x DP2, 8 ranks)
# for 12 steps, cb_fe_sc for 12 steps, and cb_fe_sc again from that run's step-6 checkpoint. Times are left out.
# Needs the demo corpus (make data) and /usr/bin/python3 with h5py. Takes a few minutes on 2 cores.
set -euo pipefail
OPTCC=$(realpath "$1")
OUT=$(realpath -m "$2")
cd "$(dirname "$0")/.."
mkdir -p "$OUT/traffic" "$OUT/runs"

traffic() {  # traffic NAME ARGS...
  local name=$1; shift
  "$OPTCC" traffic "$@" > "$OUT/traffic/$name.txt" 2>&1 || echo "exit $?" >> "$OUT/traffic/$name.txt"
  "$OPTCC" traffic "$@" --json > "$OUT/traffic/$name.json" 2>&1 || echo "exit $?" >> "$OUT/traffic/$name.json"
}
for cfg in experiments/paper/gpt-*.yaml; do
  m=$(basename "$cfg" .yaml)
  for scheme in baseline cb cb_fe cb_fe_sc cb_nonlep; do
    traffic "$m-$scheme" --config "$cfg" --set compression.scheme=$scheme
    traffic "$m-$scheme-paper" --config "$cfg" --set compression.scheme=$scheme --recompute --element-bytes 2
    traffic "$m-$scheme-reference" --config "$cfg" --set compression.scheme=$scheme --reference-powersgd
  done
  for lep in lazy off per_microbatch lazy_iteration lazy_decay; do
    decay=(); [ "$lep" = lazy_decay ] && decay=(--set compression.lep_decay=0.5)
    for phases in all epilogue; do
      traffic "$m-cb-$lep-$phases" --config "$cfg" --set compression.scheme=cb --set compression.lep=$lep \
        --set compression.backward_phases=$phases "${decay[@]}"
    done
  done
  for dp in none fp16 bf16 powersgd topk randomk qsgd signsgd '{name: powersgd, rank: 4, warmup_steps: 10}'; do
    tag=$(echo "$dp" | tr -c 'A-Za-z0-9' '_')
    traffic "$m-dp-$tag" --config "$cfg" --set "compression.dp=$dp"
    traffic "$m-dp-$tag-fe-emb" --config "$cfg" --set "compression.dp=$dp" --set compression.fused_embedding=true \
      --set "compression.embedding=$dp"
  done
  traffic "$m-bf16-compute" --config "$cfg" --set train.precision=bf16 --set parallel.grad_reduce_dtype=compute \
    --set compression.scheme=cb_fe_sc
done

# optcc simulate (the discrete-event replay of the same plans) on the paper's 2.5B and 8.3B and on demo-3d.
mkdir -p "$OUT/simulate"
for cfg in experiments/paper/gpt-2.5b.yaml experiments/paper/gpt-8.3b.yaml; do
  "$OPTCC" simulate --config "$cfg" > "$OUT/simulate/$(basename "$cfg" .yaml).txt" 2>&1 || true
done
"$OPTCC" simulate --config experiments/demo-3d.yaml --set model.vocab_size=8000 --profile this-machine \
  > "$OUT/simulate/demo-3d.txt" 2>&1 || true

run() {  # run NAME ARGS...: a fresh run into $OUT/runs/NAME
  local name=$1; shift
  "$OPTCC" train --config experiments/demo-3d.yaml --nproc 8 --set train.train_steps=12 --set train.eval_interval=6 \
    --set train.eval_iters=2 --set log.interval=1 --set checkpoint.interval=6 --set "log.dir=$OUT/runs" \
    --set "log.run_name=$name" --set "checkpoint.dir=$OUT/runs/ckpt/$name" "$@" > "$OUT/runs/$name.log" 2>&1
}
dump() {  # the deterministic columns of a results file, as text
  /usr/bin/python3 - "$1" <<'PY'
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
keep = ["train/step", "train/loss", "train/grad_norm", "train/lr", "eval/step", "eval/loss", "traffic/step",
        "traffic/rank", "traffic/class", "traffic/link", "traffic/bytes", "traffic/calls", "dp_tensors",
        "memory_components/ef_buffers", "memory_components/lep_buffers", "memory_components/pq_buffers",
        "memory_components/parameters", "memory_components/optimizer", "pipeline_codec"]
def show(name, obj):
    if isinstance(obj, h5py.Dataset) and any(name == k or name.startswith(k + "/") for k in keep) \
            and "seconds" not in name:
        print(name, np.array2string(obj[()], threshold=10**9, precision=17, max_line_width=200))
f.visititems(show)
PY
}
run demo-3d
dump "$OUT/runs/demo-3d.h5" > "$OUT/runs/demo-3d.txt"
run cb_fe_sc --set compression.scheme=cb_fe_sc
run cb_fe_sc-resumed --set compression.scheme=cb_fe_sc --resume "$OUT/runs/ckpt/cb_fe_sc/iter_0000006"
dump "$OUT/runs/cb_fe_sc.h5" > "$OUT/runs/cb_fe_sc.txt"
dump "$OUT/runs/cb_fe_sc-resumed.resumed-6.h5" > "$OUT/runs/cb_fe_sc-resumed.txt"  # a resume writes <name>.resumed-<step>.h5
echo "behaviour_check: $(ls "$OUT/traffic" | wc -l) traffic reports, runs in $OUT/runs"
