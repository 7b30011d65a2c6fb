#!/usr/bin/env bash
# The LEP study's training runs (experiments/lep-study/*.yaml), one at a time, into the
# committed results/reference/lep-study-<cell>/, so that a study longer than one machine's life
# goes on where it stopped: each finished run's .h5 (gzip-compacted and trimmed, scripts/compact_results.py --trim)
# and its .done marker are committed, and slurm/local skips runs whose .done exists (a run with
# a checkpoint under results/reference/lep-study-<cell>/ckpt/, not committed, resumes).
#   scripts/lep_study_runs.sh CELL [CONFIG_REGEX [SEED ...]]
#     CELL          pp2-m8 | pp4-m16 | pp4-m16-small (experiments/lep-study/CELL.yaml)
#     CONFIG_REGEX  which configurations (Python re.search on the run name without -seed<N>);
#                   default: all, e.g. '^baseline$|-r16$' for the rank-16 tier
#     SEED ...      default 1 2 3
# Runs go seed by seed (every configuration of seed 1 first), so each finished seed is a complete
# paired comparison against its baseline. Then: scripts/lep_study.py --results results/reference
# (paper/lep-study/). Environment: OPTCC (default build/optcc), PYTHON (default /usr/bin/python3),
# PAUSE_FILE (while this file exists, wait before starting the next run: timing measurements
# beside it). Run times on 2 cores: pp2-m8 5-8 min, pp4-m16 8-16 min, pp4-m16-small ~45 min.
set -euo pipefail
cd "$(dirname "$0")/.."
cell=${1:?usage: scripts/lep_study_runs.sh CELL [CONFIG_REGEX [SEED ...]]}
regex=${2:-.}
shift $(( $# >= 2 ? 2 : 1 ))
seeds=("$@")
[ ${#seeds[@]} -eq 0 ] && seeds=(1 2 3)
exp=experiments/lep-study/$cell.yaml
[ -f "$exp" ] || { echo "error: no $exp (CELL: pp2-m8, pp4-m16 or pp4-m16-small)" >&2; exit 2; }
export OPTCC=${OPTCC:-build/optcc} PYTHON=${PYTHON:-/usr/bin/python3}
export OPTCC_RESULTS=results/reference
# slurm/local rebuilds an index and the experiment's figures after each call: keep them out of
# the committed folders (paper/lep-study/ is scripts/lep_study.py's).
export OPTCC_FIGURES=${OPTCC_FIGURES:-/tmp/optcc-lep-study-figures}
names=$(slurm/local "$exp" --dry-run | sed -n 's/^# run [0-9]*: \([^:]*\):.*/\1/p')
dir=$OPTCC_RESULTS/lep-study-$cell
pause() { while [ -n "${PAUSE_FILE:-}" ] && [ -e "$PAUSE_FILE" ]; do sleep 20; done; }
failed=0
for seed in "${seeds[@]}"; do
  for name in $names; do
    [[ $name == *-seed$seed ]] || continue
    "$PYTHON" -c 'import re, sys; sys.exit(0 if re.search(sys.argv[1], sys.argv[2]) else 1)' \
      "$regex" "${name%-seed*}" || continue
    [ -e "$dir/$name.done" ] && continue
    pause
    echo "== $(date -u +%H:%M:%S) $cell/$name"
    if slurm/local "$exp" --only "run=$name"; then
      "$PYTHON" scripts/compact_results.py --trim "$dir/$name"*.h5
      rm -rf "${dir:?}/ckpt/$name"
    else
      failed=1
    fi
  done
done
rm -f "$OPTCC_RESULTS/index.csv"
exit $failed
