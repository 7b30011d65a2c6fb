#!/usr/bin/env bash
# Makes the committed reference results (results/reference/) so that `make figures` works on a
# fresh clone. table2, table4 and fig11 are the real cpu-scale runs of experiments/table2.yaml,
# table4.yaml and fig11.yaml (slurm/local, 3 seeds; copied from results/<exp>/ when already there). The others are
# PLACEHOLDERS, not evidence: the `tiny` preset (2 layers, h = 64) or the `mini` preset for a few
# steps, one seed, on this machine's 8 local ranks. paper/README.md says what each shows and what
# it cannot. About 4.5 hours on 2 cores from nothing (30 minutes without table2, table4 and fig11), one
# training run at a time.
#   scripts/reference_results.sh [PART ...]     PART: table2 table4 fig11 fig12 fig10 compressors-dp fig14
#                                               (default: all; a part's folder is emptied first,
#                                               but for its ABOUT.txt: real runs or placeholder, and why)
# Then every results file is compacted (scripts/compact_results.py --trim: gzip, the values figures read) and
# `make figures` regenerates paper/. Environment: OPTCC (default build/optcc), BENCH (default
# build/tests/bench/bench_compression), PYTHON (default /usr/bin/python3), CKPT (checkpoint root,
# default /tmp/optcc-reference-ckpt; removed at the start of each part), PAUSE_FILE (while this
# file exists, wait before starting the next run or benchmark: timing measurements beside it).
set -euo pipefail
cd "$(dirname "$0")/.."
OPTCC=${OPTCC:-build/optcc}
BENCH=${BENCH:-build/tests/bench/bench_compression}
PYTHON=${PYTHON:-/usr/bin/python3}
CKPT=${CKPT:-/tmp/optcc-reference-ckpt}
OUT=results/reference
TINY=(--config experiments/schemes/mini-3d.yaml --set model.preset=tiny --set train.train_steps=150
      --set train.warmup_steps=15 --set train.eval_interval=25 --set train.eval_iters=5 --set log.interval=10
      --set checkpoint.interval=50 --set checkpoint.keep=1)
SC_DP="compression.dp={name: powersgd, rank: 16, error_feedback: true, warmup_steps: 0}"

pause() { while [ -n "${PAUSE_FILE:-}" ] && [ -e "$PAUSE_FILE" ]; do sleep 30; done; }

# train EXP RUN [optcc train options...]: one run into results/reference/EXP/RUN.h5
train() {
  local exp=$1 run=$2
  shift 2
  local log="$CKPT/$exp-$run.log"
  mkdir -p "$CKPT"
  pause
  echo "== $exp/$run"
  "$OPTCC" train --nproc 8 "$@" --set log.dir="$OUT/$exp" --set log.run_name="$run" \
    --set checkpoint.dir="$CKPT/$exp/$run" >"$log" 2>&1 || { tail -20 "$log"; exit 1; }
  grep -E "eval .*step|done:" "$log" | tail -2
}

fresh() {  # empties results/reference/$1 but for its ABOUT.txt (what its runs are, for the figures' footnotes)
  local about=
  if [ -f "$OUT/$1/ABOUT.txt" ]; then about=$(cat "$OUT/$1/ABOUT.txt"); fi
  rm -rf "${OUT:?}/$1" "${CKPT:?}/$1"
  mkdir -p "$OUT/$1"
  if [ -n "$about" ]; then printf '%s\n' "$about" >"$OUT/$1/ABOUT.txt"; fi
}

# from_experiment EXP [slurm/local options...]: the real cpu-scale runs of experiments/EXP.yaml,
# copied from results/EXP/ (slurm/local runs whatever is not finished there: runs with .done files
# are skipped, checkpointed ones resume; table2 takes about 1.6 h on 2 cores, fig11 about 15 min).
from_experiment() {
  local exp=$1
  shift
  pause
  echo "== $exp: slurm/local experiments/$exp.yaml --scale cpu"
  OPTCC="$OPTCC" PYTHON="$PYTHON" slurm/local "experiments/$exp.yaml" --scale cpu "$@" >"$CKPT-$exp.log" 2>&1 ||
    { tail -20 "$CKPT-$exp.log"; exit 1; }
  fresh "$exp"
  cp "results/$exp"/*.h5 "$OUT/$exp/"
}

part_table2() { from_experiment table2; }  # 5 schemes x 3 seeds, mini, 300 steps (the Table 2 evidence)

part_table4() { from_experiment table4; }  # m = 16: baseline, cb, cb_nonlep x 3 seeds, 300 steps (LEP at m = 16)

part_fig11() { from_experiment fig11; }  # CB on every backward send, LEP, the Fig. 11 diagnostic, 3 seeds

part_fig12() {  # memory: baseline, CB without EF, CB + LEP, CB + per-micro-batch EF (mini, 6 steps);
  fresh fig12   # epilogue-only (the paper's CB) and on every backward send (where m EF buffers show)
  local m=(--config experiments/schemes/mini-3d.yaml --set train.train_steps=6 --set train.eval_interval=0
           --set train.eval_iters=2 --set log.interval=2)
  train fig12 baseline "${m[@]}" --set compression.scheme=baseline
  train fig12 cb_nonlep "${m[@]}" --set compression.scheme=cb_nonlep
  train fig12 cb_lep "${m[@]}" --set compression.scheme=cb
  train fig12 cb_per_microbatch "${m[@]}" --set compression.scheme=cb --set compression.lep=per_microbatch
  train fig12 cb_all_lep "${m[@]}" --set compression.scheme=cb --set compression.backward_phases=all
  train fig12 cb_all_per_microbatch "${m[@]}" --set compression.scheme=cb --set compression.backward_phases=all \
    --set compression.lep=per_microbatch
}

part_fig10() {  # emulated paper cluster, timelines of steps 8 and 9 (mini, 10 steps)
  fresh fig10
  local e=(--config experiments/emulation/mini-3d-paper-regime.yaml --set train.train_steps=10
           --set "log.timeline_steps=[8, 9]" --set log.interval=2)
  for scheme in baseline cb cb_fe cb_fe_sc; do
    extra=(--set compression.scheme=$scheme)
    [[ $scheme == cb_fe_sc ]] && extra+=(--set "$SC_DP")
    train fig10 "$scheme" "${e[@]}" "${extra[@]}"
  done
}

part_compressors_dp() {  # DP compressors on the baseline scheme: ppl against bytes (tiny, 120 steps)
  fresh compressors-dp
  local c=("${TINY[@]}" --set train.train_steps=120 --set compression.scheme=baseline)
  train compressors-dp none "${c[@]}"
  train compressors-dp fp16 "${c[@]}" --set "compression.dp={name: fp16}"
  train compressors-dp powersgd-r4 "${c[@]}" --set "compression.dp={name: powersgd, rank: 4, warmup_steps: 0}"
  train compressors-dp powersgd-r16 "${c[@]}" --set "compression.dp={name: powersgd, rank: 16, warmup_steps: 0}"
  train compressors-dp topk-1pct "${c[@]}" --set "compression.dp={name: topk, fraction: 0.01}"
  train compressors-dp qsgd "${c[@]}" --set "compression.dp={name: qsgd}"
  train compressors-dp signsgd "${c[@]}" --set "compression.dp={name: signsgd}"
}

part_fig14() {  # lowrank encode/decode and PowerSGD against rank on the Fig. 14 slice shapes
  fresh fig14
  pause
  "$BENCH" --benchmark_filter='fig14/.*/r[0-9]+$' --benchmark_out="$OUT/fig14/compression.json" \
    --benchmark_out_format=json >/dev/null
}

parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(table2 table4 fig11 fig12 fig10 compressors-dp fig14)
for p in "${parts[@]}"; do
  start=$(date +%s)
  "part_${p//-/_}"
  echo "== $p: $(( $(date +%s) - start )) s"
done
find "$OUT" -name '*.h5' -print0 | sort -z | xargs -0 -r "$PYTHON" scripts/compact_results.py --trim
rm -rf "${CKPT:?}"
make --no-print-directory figures PYTHON="$PYTHON"
