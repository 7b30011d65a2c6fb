#!/usr/bin/env bash
# The Slurm integration test (CTest `slurm_integration`, labels slurm and slow; .ci/run runs it):
#   1. starts a single-node test cluster (start.sh) in a temporary directory;
#   2. prepares a small corpus there (generated text, `optcc data prepare`: no download);
#   3. slurm/submit experiments/testing/slurm-smoke.yaml --scale cpu (a 2-task array of 2-rank runs,
#      then the results job), waits for both jobs (OPTCC_TEST_TIMEOUT; on a timeout or a failed job it
#      prints the jobs' output and the daemons' logs and fails);
#   4. checks each run's HDF5 file reaches train.train_steps, that index.csv lists both runs complete,
#      and that the experiment's figures were regenerated (a PNG under OPTCC_FIGURES/slurm-smoke/);
#   5. resubmits: nothing is submitted (both runs finished), and an array task started again for a
#      finished run (as a requeue would) skips it; no new results file appears;
#   6. removes one run's .done marker and resubmits: that task resumes from the run's final checkpoint
#      (a <run>.resumed-<step>.h5 appears) and the run is marked finished again;
#   7. stops the cluster (also on failure) and removes the temporary directory.
# Results, figures and Slurm output go to the temporary directory, never the repository's results/.
# Needs root and the Slurm packages (slurm/testing/deps.sh installs them; .ci/run does); without them
# it exits 77 (CTest: skipped).
# Environment (all optional):
#   OPTCC               the optcc binary (default build/optcc)
#   PYTHON              Python with h5py and yaml (default /usr/bin/python3)
#   OPTCC_TEST_TIMEOUT  seconds to wait for each submission's jobs (default 600)
#   OPTCC_TEST_KEEP     1: keep the temporary directory (and the cluster's logs) for a look
#   OPTCC_SLURM_PORT    the test cluster's controller port (default here 6827, so a cluster started
#                       by hand on the default 6817 is not disturbed)
set -euo pipefail
cd "$(dirname "$0")/../.."
export OPTCC=${OPTCC:-build/optcc}
export PYTHON=${PYTHON:-/usr/bin/python3}
timeout_s=${OPTCC_TEST_TIMEOUT:-600}
exp=experiments/testing/slurm-smoke.yaml
t0=$SECONDS

if [ "$(id -u)" -ne 0 ]; then echo "skipped: the test cluster needs root"; exit 77; fi
for cmd in munged slurmctld slurmd sbatch; do
  command -v "$cmd" >/dev/null || { echo "skipped: $cmd not installed (run slurm/testing/deps.sh as root)"; exit 77; }
done
[ -x "$OPTCC" ] || { echo "FAIL: OPTCC=$OPTCC is not an executable (build it first)" >&2; exit 1; }

tmp=$(mktemp -d /tmp/optcc-slurm-test.XXXXXX)
chmod 755 "$tmp"  # munged's socket lives below it (start.sh)
export OPTCC_SLURM_DIR=$tmp/cluster OPTCC_SLURM_PORT=${OPTCC_SLURM_PORT:-6827}
export OPTCC_RESULTS=$tmp/results OPTCC_FIGURES=$tmp/paper OPTCC_SLURM_LOGS=$tmp/logs
. slurm/testing/common.sh  # SLURM_CONF, show_logs
finish() {
  local code=$?
  if [ "$code" -ne 0 ]; then
    echo "FAIL (exit $code) after $((SECONDS - t0)) s; Slurm output of the jobs:" >&2
    for f in "$OPTCC_SLURM_LOGS"/*; do [ -e "$f" ] && { echo "----- $f" >&2; cat "$f" >&2; }; done
    show_logs
  fi
  bash slurm/testing/stop.sh --keep >/dev/null || echo "stop.sh failed" >&2
  if [ "${OPTCC_TEST_KEEP:-0}" = 1 ]; then echo "kept $tmp"; else rm -rf "$tmp"; fi
  exit "$code"
}
trap finish EXIT
trap 'exit 143' TERM INT  # so that finish runs (stops the cluster) when the test is interrupted
fail() { echo "FAIL: $*" >&2; exit 1; }

bash slurm/testing/start.sh

# A corpus made here: 400 documents of sentences drawn from a small fixed grammar.
"$PYTHON" - "$tmp/corpus.txt" <<'EOF'
import random, sys
rng = random.Random(12)
nouns = "cat dog bird fish horse mouse river hill tree stone cloud field road house garden".split()
verbs = "sees finds follows carries watches crosses leaves reaches passes builds".split()
adjs = "small old green quiet bright dark warm cold tall slow".split()
with open(sys.argv[1], "w") as f:
    for _ in range(400):
        s = [f"the {rng.choice(adjs)} {rng.choice(nouns)} {rng.choice(verbs)} the {rng.choice(nouns)}."
             for _ in range(rng.randint(3, 8))]
        f.write(" ".join(s).capitalize() + "\n\n")
EOF
data=(--set "data.sources=[$tmp/corpus.txt]" --set "data.dir=$tmp/data" --set "data.prefix=$tmp/data/corpus"
      --set data.vocab_size=320 --set data.split=90,10,0)
"$OPTCC" data prepare --config experiments/smoke.yaml "${data[@]}" >"$tmp/prepare.log" 2>&1 ||
  { cat "$tmp/prepare.log" >&2; fail "optcc data prepare of the test corpus"; }

"$OPTCC" sweep "$exp" --scale cpu --json >"$tmp/plan.json"
runs=($("$PYTHON" -c 'import json,sys; print(" ".join(r["run"] for r in json.load(open(sys.argv[1]))["runs"]))' "$tmp/plan.json"))
[ ${#runs[@]} -eq 2 ] || fail "$exp should expand to 2 runs at scale cpu, got: ${runs[*]}"
name=$("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["experiment"])' "$tmp/plan.json")
out=$OPTCC_RESULTS/$name

# Submits; waits until every job it submitted has left the queue and checks they completed.
submit_and_wait() {
  slurm/submit "$exp" --scale cpu "${data[@]}" | tee "$tmp/submit.out"
  local jobs
  jobs=$(sed -n 's/^submitted array job \([0-9]*\) .* results job \([0-9]*\) .*/\1 \2/p' "$tmp/submit.out")
  [ -n "$jobs" ] || fail "slurm/submit printed no job ids"
  local deadline=$((SECONDS + timeout_s))
  while [ -n "$(squeue --noheader --jobs="${jobs// /,}" 2>/dev/null)" ]; do
    [ $SECONDS -lt $deadline ] || { squeue >&2; fail "jobs $jobs still queued or running after ${timeout_s}s"; }
    sleep 2
  done
  local state
  for j in $jobs; do  # every task of the array, and the results job
    state=$(scontrol show job "$j" | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' | sort -u | tr '\n' ' ')
    [ "$state" = "COMPLETED " ] || fail "job $j ended in state(s) $state"
  done
  echo "jobs $jobs completed ($((SECONDS - t0)) s since the start)"
}

echo "== submit ($((SECONDS - t0)) s)"
submit_and_wait
"$PYTHON" slurm/testing/check_results.py runs "$tmp/plan.json" "$OPTCC_RESULTS" || fail "results files"
"$PYTHON" slurm/testing/check_results.py index "$tmp/plan.json" "$OPTCC_RESULTS" || fail "results index"
for r in "${runs[@]}"; do [ -f "$out/$r.done" ] || fail "$out/$r.done missing after a completed run"; done
png=$(find "$OPTCC_FIGURES/$name" -name '*.png' 2>/dev/null | head -n 1)
[ -n "$png" ] || fail "no figure (PNG) under $OPTCC_FIGURES/$name after the results job"
echo "ok: figure $png"
# The finished jobs' history (no sacct here): every array task and the results job, COMPLETED.
bash slurm/testing/history.sh >"$tmp/history.txt" || fail "slurm/testing/history.sh"
jobs=$(sed -n 's/^submitted array job \([0-9]*\) .* results job \([0-9]*\) .*/\1 \2/p' "$tmp/submit.out")
for j in $jobs; do
  done_lines=$(bash slurm/testing/history.sh "$j" | awk 'NR > 1 && $3 == "COMPLETED"' | wc -l)
  [ "$done_lines" -ge 1 ] || { cat "$tmp/history.txt" >&2; fail "job $j is not COMPLETED in slurm/testing/history.sh"; }
done
[ "$(awk 'NR > 1 && $1 ~ /_[0-9]+$/' "$tmp/history.txt" | wc -l)" -eq "${#runs[@]}" ] ||
  { cat "$tmp/history.txt" >&2; fail "history.sh does not list the ${#runs[@]} array tasks as JOB_TASK"; }
echo "ok: slurm/testing/history.sh lists the finished jobs"

echo "== resubmit: finished runs are skipped ($((SECONDS - t0)) s)"
ls "$out" >"$tmp/files.before"
slurm/submit "$exp" --scale cpu "${data[@]}" | tee "$tmp/submit.out"
grep -q "^nothing to submit" "$tmp/submit.out" || fail "a resubmission of finished runs submitted jobs"
# A requeued task of a finished run (same script, same index) must not train it again.
sbatch --wait --quiet --chdir="$PWD" --array=0 --nodes=1 --ntasks-per-node=2 --output="$tmp/logs/requeue-%A_%a.out" \
  slurm/experiment.sbatch "$exp" cpu -- "${data[@]}" || fail "the array task of a finished run failed"
grep -q "finished (.*), skipped" "$tmp"/logs/requeue-*_0.out || fail "the task of a finished run did not skip it"
ls "$out" | diff "$tmp/files.before" - || fail "files changed in $out although every run was finished"

echo "== resubmit after removing ${runs[1]}.done: that run resumes from its checkpoint ($((SECONDS - t0)) s)"
rm "$out/${runs[1]}.done"
submit_and_wait
grep -q "resumes from" "$OPTCC_SLURM_LOGS"/"$name"-*_1.out || fail "task 1 did not resume from its checkpoint"
ls "$out/${runs[1]}".resumed-*.h5 >/dev/null 2>&1 || fail "no ${runs[1]}.resumed-<step>.h5 after the resume"
[ -f "$out/${runs[1]}.done" ] || fail "${runs[1]} not marked finished after the resumed task"
"$PYTHON" slurm/testing/check_results.py index "$tmp/plan.json" "$OPTCC_RESULTS" || fail "results index after the resume"

echo "PASS: slurm integration test in $((SECONDS - t0)) s"
