#!/usr/bin/env bash
# Runs the paper's five schemes (baseline, cb, cb_fe, cb_fe_sc, cb_nonlep) on one experiment, one
# after the other on local ranks, then prints the comparison table (scripts/scheme_table.py).
#   scripts/run_schemes.sh [CONFIG] [NPROC] [extra optcc train options...]
# Defaults: experiments/schemes/mini-3d.yaml, 8 ranks. Results: results/schemes-<config>-<scheme>-<UTC
# time of this call>.h5: each call is a new set of runs (checkpoints in results/ckpt/<run>/), and its
# table is of those runs.
# DP_RANK (default 16) replaces the scheme's PowerSGD rank 128 (see the config's header).
set -euo pipefail
config=${1:-experiments/schemes/mini-3d.yaml}
nproc=${2:-8}
shift $(( $# > 2 ? 2 : $# ))
OPTCC=${OPTCC:-build/optcc}
PYTHON=${PYTHON:-/usr/bin/python3}
DP_RANK=${DP_RANK:-16}
name=$(basename "$config" .yaml)
stamp=$(date -u +%Y%m%d-%H%M%S)
files=()
for scheme in baseline cb cb_fe cb_fe_sc cb_nonlep; do
  extra=()
  if [[ $scheme == cb_fe_sc ]]; then
    extra=(--set "compression.dp={name: powersgd, rank: ${DP_RANK}, error_feedback: true, warmup_steps: 0}")
  fi
  run="schemes-${name}-${scheme}-${stamp}"
  echo "== ${scheme} -> results/${run}.h5"
  "$OPTCC" train --config "$config" --nproc "$nproc" --set compression.scheme="$scheme" "${extra[@]}" \
    --set log.run_name="$run" "$@"
  files+=("results/${run}.h5")
done
"$PYTHON" scripts/scheme_table.py "${files[@]}"
