#!/usr/bin/env bash
# The emulated-cluster scheme comparison: baseline, cb, cb_fe, cb_fe_sc on
# experiments/emulation/mini-3d-paper-regime.yaml (8 local ranks, links emulated as the paper's
# cluster; the file's header explains the numbers), one run after the other, then the table of
# median step times, speed-ups and Fig. 10 breakdowns (scripts/emulation_table.py), and the
# Chrome trace of one step of the baseline (results/<run>-trace.json; open it in Perfetto).
#   scripts/run_emulation.sh [CONFIG] [NPROC] [extra optcc train options...]
# Results: results/emulation-<config>-<scheme>[-$TAG].h5. SCHEMES (default "baseline cb cb_fe
# cb_fe_sc") sets which run and in what order (the table's speed-ups are against the first). DP_RANK (default 16) replaces the scheme's
# PowerSGD rank 128, which saves nothing at h = 256 (experiments/schemes/mini-3d.yaml explains).
# A config with network.match_regime derives its link scale when a run starts; the first scheme's
# run derives it and the others run at that same scale (read from its results), so that every
# scheme crosses the same links and the measurement's noise does not enter the comparison.
set -euo pipefail
config=${1:-experiments/emulation/mini-3d-paper-regime.yaml}
nproc=${2:-8}
shift $(( $# > 2 ? 2 : $# ))
OPTCC=${OPTCC:-build/optcc}
PYTHON=${PYTHON:-/usr/bin/python3}
DP_RANK=${DP_RANK:-16}
SCHEMES=${SCHEMES:-"baseline cb cb_fe cb_fe_sc"}
name=$(basename "$config" .yaml)
files=()
same_links=()
for scheme in $SCHEMES; do
  extra=()
  if [[ $scheme == cb_fe_sc ]]; then
    extra=(--set "compression.dp={name: powersgd, rank: ${DP_RANK}, error_feedback: true, warmup_steps: 0}")
  fi
  run="emulation-${name}-${scheme}${TAG:+-$TAG}"
  echo "== ${scheme} -> results/${run}.h5 (load: $(cut -d' ' -f1-3 /proc/loadavg))"
  "$OPTCC" train --config "$config" --nproc "$nproc" --set compression.scheme="$scheme" "${extra[@]}" \
    --set log.run_name="$run" "${same_links[@]}" "$@"
  files+=("results/${run}.h5")
  if [ ${#same_links[@]} -eq 0 ]; then  # the links the first run derived (network.match_regime), if it did
    derived=$("$PYTHON" - "results/${run}.h5" <<'PY'
import sys, h5py, yaml
f = h5py.File(sys.argv[1], "r")
if "network_regime" in f.attrs:
    n = yaml.safe_load(f.attrs["config"])["network"]
    print(n["scale"], n["inter_node_latency_us"], n["intra_node_latency_us"])
PY
)
    if [ -n "$derived" ]; then
      read -r s li la <<<"$derived"
      echo "== the other schemes run at the scale this run derived: $s"
      same_links=(--set network.match_regime= --set network.scale="$s" --set network.inter_node_latency_us="$li"
                  --set network.intra_node_latency_us="$la")
    fi
  fi
done
"$PYTHON" scripts/emulation_table.py "${files[@]}"
first=${files[0]}
step=$("$PYTHON" -c "import h5py; print(int(h5py.File('$first', 'r')['breakdown/step'][0]))")
"$OPTCC" trace "$first" --step "$step" -o "${first%.h5}-trace.json" --breakdown
"$PYTHON" -m json.tool "${first%.h5}-trace.json" > /dev/null && echo "${first%.h5}-trace.json: valid JSON"
