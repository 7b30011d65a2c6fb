#!/usr/bin/env bash
# The emulated-cluster scheme comparison: baseline, cb, cb_fe, cb_fe_sc on
# experiments/emulation/mini-3d-paper-regime.yaml (8 local ranks, links emulated as the paper's
# cluster; the file's header explains the numbers), one run after the other, then the table of
# step times, speed-ups and Fig. 10 breakdowns (scripts/emulation_table.py), and the
# Chrome trace of one step of the baseline (results/<run>-trace.json; open it in Perfetto).
#   scripts/run_emulation.sh [CONFIG] [NPROC] [extra optcc train options...]
# Results: results/emulation-<config>-<scheme>[-$TAG].h5. SCHEMES (default "baseline cb cb_fe
# cb_fe_sc") sets which run and in what order (the table's speed-ups are against the first). DP_RANK (default 16) replaces the scheme's
# PowerSGD rank 128, which saves nothing at h = 256 (experiments/schemes/mini-3d.yaml explains).
# EXPERIMENT=experiments/<file>.yaml: SCHEMES are instead the names of the values of that file's first
# grid axis (default: all of them, in the file's order; e.g. "baseline cb_fe_sc cb diloco streaming
# cb_streaming hadamard" of experiments/baselines/diloco.yaml), each run with that value's --set list from `optcc sweep --json`
# (train.seed left out) on top of CONFIG, so the emulated rows are the experiment's own settings.
# RESULTS (default results) is the folder the files go to. Under DiLoCo the step time is the mean over
# whole periods of diloco.inner_steps steps (scripts/emulation_table.py): give such runs
# train.train_steps and log.timeline_steps that leave a whole period after the warm-up, e.g.
#   EXPERIMENT=experiments/baselines/diloco.yaml SCHEMES="baseline diloco" scripts/run_emulation.sh \
#     experiments/emulation/mini-3d-paper-regime.yaml 8 --set train.train_steps=26 --set 'log.timeline_steps=[25, 26]'
# A config with network.match_regime derives its link scale when a run starts; the first scheme's
# run derives it and the others reuse it (--set network.match_regime=from:<its results file>), so
# that every scheme crosses the same links and the measurement's noise does not enter the
# comparison. REGIME=<results file> pins the first run too (e.g. a second round in reverse order).
# A REGIME file also covers a run of a scheme given alone.
set -euo pipefail
config=${1:-experiments/emulation/mini-3d-paper-regime.yaml}
nproc=${2:-8}
shift $(( $# > 2 ? 2 : $# ))
OPTCC=${OPTCC:-build/optcc}
PYTHON=${PYTHON:-/usr/bin/python3}
DP_RANK=${DP_RANK:-16}
EXPERIMENT=${EXPERIMENT:-}
REGIME=${REGIME:-}
RESULTS=${RESULTS:-results}
name=$(basename "$config" .yaml)
if [ -n "$EXPERIMENT" ]; then
  plan=$(mktemp)
  trap 'rm -f "$plan"' EXIT
  "$OPTCC" sweep "$EXPERIMENT" --scale cpu --json >"$plan"
  SCHEMES=${SCHEMES:-$("$PYTHON" -c 'import json, sys
seen = []
for r in json.load(open(sys.argv[1]))["runs"]:
    v = list(r["axes"].values())[0]
    seen += [] if v in seen else [v]
print(" ".join(seen))' "$plan")}
fi
SCHEMES=${SCHEMES:-"baseline cb cb_fe cb_fe_sc"}
# The --set list of grid value $1 of $EXPERIMENT (its first run with that value), one per line.
variant_sets() {
  "$PYTHON" - "$plan" "$1" <<'PY'
import json, sys
plan, value = json.load(open(sys.argv[1])), sys.argv[2]
runs = [r for r in plan["runs"] if list(r["axes"].values())[0] == value]
if not runs:
    values = sorted({list(r["axes"].values())[0] for r in plan["runs"]})
    sys.exit(f"run_emulation.sh: {plan['file']} has no first-axis value {value!r} (SCHEMES); it has: {' '.join(values)}")
print("\n".join(o for o in runs[0]["overrides"] if not o.startswith("train.seed=")))
PY
}
files=()
same_links=()
[ -n "$REGIME" ] && same_links=(--set "network.match_regime=from:$REGIME")
for scheme in $SCHEMES; do
  extra=()
  if [ -n "$EXPERIMENT" ]; then
    sets=$(variant_sets "$scheme")
    while IFS= read -r o; do [ -n "$o" ] && extra+=(--set "$o"); done <<<"$sets"
  else
    extra=(--set compression.scheme="$scheme")
    if [[ $scheme == cb_fe_sc ]]; then
      extra+=(--set "compression.dp={name: powersgd, rank: ${DP_RANK}, error_feedback: true, warmup_steps: 0}")
    fi
  fi
  run="emulation-${name}-${scheme}${TAG:+-$TAG}"
  echo "== ${scheme} -> ${RESULTS}/${run}.h5 (load: $(cut -d' ' -f1-3 /proc/loadavg)): ${extra[*]}"
  "$OPTCC" train --config "$config" --nproc "$nproc" "${extra[@]}" \
    --set log.dir="$RESULTS" --set log.run_name="$run" "${same_links[@]}" "$@"
  files+=("${RESULTS}/${run}.h5")
  if [ ${#same_links[@]} -eq 0 ]; then  # the links the first run derived (network.match_regime), if it did
    derived=$(PYTHONPATH=scripts "$PYTHON" -c 'import sys, optcc_results as R; print("network_regime" in R.open_results(sys.argv[1]).attrs)' \
              "${RESULTS}/${run}.h5")
    if [ "$derived" = True ]; then
      echo "== the other schemes reuse the links this run derived (network.match_regime=from:${RESULTS}/${run}.h5)"
      same_links=(--set "network.match_regime=from:${RESULTS}/${run}.h5")
    fi
  fi
done
"$PYTHON" scripts/emulation_table.py "${files[@]}"
first=${files[0]}
step=$(PYTHONPATH=scripts "$PYTHON" -c "import sys, optcc_results as R; print(int(R.open_results(sys.argv[1])['breakdown/step'][0]))" "$first")
"$OPTCC" trace "$first" --step "$step" -o "${first%.h5}-trace.json" --breakdown
"$PYTHON" -m json.tool "${first%.h5}-trace.json" > /dev/null && echo "${first%.h5}-trace.json: valid JSON"
