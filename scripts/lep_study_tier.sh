#!/usr/bin/env bash
# The LEP study (paper/lep-study.md) in its tiers, seed by seed across the cells, so each
# finished seed is a complete paired comparison in every cell of the tier:
#   scripts/lep_study_tier.sh TIER [SEED ...]
#     1  CB rank 16, the baseline and every variant, PP2 m8 and PP4 m16 (36 runs)
#     2  CB ranks 8 and 64, lazy and off, PP2 m8 (12 runs: does the order hold as the error grows
#        and shrinks)
#     3  the `small` cell (h 512, PP4 m16, rank 16): the baseline and tier 1's best and worst
#        variant, BEST and WORST in the environment (default off and per_microbatch: tier 1's
#        lowest and highest mean paired loss over both cells' 6 seeds, lazy_decay 0.003 nats
#        behind off; 9 runs, 41-48 min each here)
#     SEED ...  default 1 2 3
# Each run goes through scripts/lep_study_runs.sh (into results/reference/lep-study-<cell>/,
# compacted; finished runs are skipped, a stopped one resumes from its checkpoint), so the command
# can be repeated until the tier is done. Then `make figures` (or scripts/lep_study.py
# --results results/reference) writes paper/lep-study/. Environment as lep_study_runs.sh (OPTCC,
# PYTHON, PAUSE_FILE).
# Needs a built optcc (OPTCC, default build/optcc) even when every run is done: the run names
# come from `optcc sweep`.
set -uo pipefail
cd "$(dirname "$0")/.."
usage() { sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "$0"; }
case ${1:-} in
  -h|--help) usage; exit 0 ;;
  "") echo "usage: scripts/lep_study_tier.sh TIER [SEED ...]  (TIER 1, 2 or 3; --help for more)" >&2; exit 2 ;;
esac
tier=$1
shift
seeds=("$@")
[ ${#seeds[@]} -eq 0 ] && seeds=(1 2 3)
case $tier in
  1) cells=("pp2-m8 ^baseline\$|-r16\$" "pp4-m16 ^baseline\$|-r16\$") ;;
  2) cells=("pp2-m8 ^(lazy|off)-r(8|64)\$") ;;
  3) cells=("pp4-m16-small ^(baseline|${BEST:-off}-r16|${WORST:-per_microbatch}-r16)\$") ;;
  *) echo "error: TIER must be 1, 2 or 3, got '$tier'" >&2; exit 2 ;;
esac
failed=0
for seed in "${seeds[@]}"; do
  for c in "${cells[@]}"; do
    scripts/lep_study_runs.sh "${c%% *}" "${c#* }" "$seed" || failed=1
  done
done
exit $failed
