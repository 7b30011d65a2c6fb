#!/usr/bin/env bash
# The two-node Slurm test (CTest `slurm_two_node`, labels slurm, hosts and slow; .ci/run runs it):
#   1. makes two hosts (slurm/testing/hosts.sh: network namespaces with their own hostnames, shaped
#      veth links, 198.18.0.0/15) and a Slurm cluster over them (start.sh with OPTCC_SLURM_HOSTS=2:
#      slurmctld on host 1, one slurmd per host, each with its own spool, pid and log files);
#   2. `sbatch -N 2 --ntasks-per-node=4 slurm/train.sbatch`: TP2 x PP2 x DP2 across both nodes;
#      every step's loss equals the same run's on one host (8 local ranks), and the rank table names
#      both hosts;
#   3. an experiment array across nodes through slurm/submit (experiments/testing/slurm-two-node.yaml:
#      2 runs of 8 ranks on 2 nodes, then the results job): both runs complete, in the index;
#   4. node fault: all ranks of host 2 killed (SIGKILL) mid-run: the job fails, `scontrol requeue`
#      reruns it under the same job id, it resumes from the last checkpoint (the new part's first
#      step is that checkpoint's + 1) and the earlier results file keeps its rows;
#   5. stops the cluster and removes the hosts (also on failure).
# Needs root, network namespaces and the Slurm packages (slurm/testing/deps.sh); else exits 77.
# Environment (all optional): OPTCC (default build/optcc), PYTHON (default /usr/bin/python3),
#   OPTCC_TEST_TIMEOUT (seconds per job wait, default 300; a wait takes under 30 s, 95 s in all
#   with both cores busy elsewhere), OPTCC_TEST_KEEP=1 (keep the directory).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OPTCC=$(readlink -f "${OPTCC:-build/optcc}")
export PYTHON=${PYTHON:-/usr/bin/python3}
timeout_s=${OPTCC_TEST_TIMEOUT:-300}
t0=$SECONDS

if [ "$(id -u)" -ne 0 ]; then echo "skipped: the hosts and the cluster's daemons need root"; exit 77; fi
for cmd in munged slurmctld slurmd sbatch ip unshare; do
  command -v "$cmd" >/dev/null || { echo "skipped: $cmd not installed (slurm/testing/deps.sh as root)"; exit 77; }
done
probe="optccprobe$$"
if ! ip netns add "$probe" 2>/dev/null; then echo "skipped: cannot make a network namespace here"; exit 77; fi
ip netns del "$probe"
[ -x "$OPTCC" ] || { echo "FAIL: OPTCC=$OPTCC is not an executable (build it first)" >&2; exit 1; }

export OPTCC_HOSTS_PREFIX="os$(( $$ % 100000 ))"
tmp=$(mktemp -d /tmp/optcc-2node.XXXXXX)
chmod 755 "$tmp"  # munged's socket lives below it
export OPTCC_SLURM_HOSTS=2 OPTCC_SLURM_DIR=$tmp/cluster OPTCC_SLURM_PORT=${OPTCC_SLURM_PORT:-6847}
export OPTCC_RESULTS=$tmp/results OPTCC_FIGURES=$tmp/paper OPTCC_SLURM_LOGS=$tmp/logs
. slurm/testing/common.sh  # SLURM_CONF, show_logs
finish() {
  local code=$?
  if [ "$code" -ne 0 ]; then
    echo "FAIL (exit $code) after $((SECONDS - t0)) s; Slurm output of the jobs:" >&2
    for f in "$OPTCC_SLURM_LOGS"/* "$tmp"/*.out; do [ -e "$f" ] && { echo "----- $f" >&2; tail -n 60 "$f" >&2; }; done
    show_logs
  fi
  bash slurm/testing/stop.sh --keep >/dev/null || echo "stop.sh failed" >&2
  bash slurm/testing/hosts.sh down >/dev/null || echo "hosts.sh down failed" >&2
  if [ "${OPTCC_TEST_KEEP:-0}" = 1 ]; then echo "kept $tmp"; else rm -rf "$tmp"; fi
  exit "$code"
}
trap finish EXIT
trap 'exit 143' TERM INT
# One line on where the cluster stands, for failure messages: the queue, and each host's optcc ranks
# (pid:state, state as in /proc/PID/stat: R running, S sleeping, D disk, Z zombie).
snapshot() {
  local h p q ranks=""
  q=$(squeue --noheader --format='%i %T %r' 2>/dev/null | paste -sd, -)
  for h in 1 2; do
    ranks+=" h$h:"
    for p in $(ip netns pids "$OPTCC_HOSTS_PREFIX-h$h" 2>/dev/null); do
      tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q "^$OPTCC train " && ranks+=" $p:$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)"
    done
  done
  echo "queue: ${q:-empty}; optcc ranks:$ranks"
}
current=
fail() { echo "FAIL (${current:-setup}, $((SECONDS - t0)) s): $* [$(snapshot)]" >&2; exit 1; }
step() { current="step ${1%%.*}"; echo "== $* ($((SECONDS - t0)) s)"; }

step "1. two hosts and a Slurm cluster over them"
bash slurm/testing/hosts.sh up 2 --rate 1gbit
bash slurm/testing/start.sh
mkdir -p "$OPTCC_SLURM_LOGS"

"$PYTHON" - "$tmp/corpus.txt" <<'EOF'
import random, sys
rng = random.Random(8)
nouns = "cat dog bird fish horse river hill tree stone cloud field road house".split()
verbs = "sees finds follows carries watches crosses leaves reaches passes".split()
with open(sys.argv[1], "w") as f:
    for _ in range(300):
        f.write(" ".join(f"the {rng.choice(nouns)} {rng.choice(verbs)} the {rng.choice(nouns)}."
                         for _ in range(rng.randint(3, 8))).capitalize() + "\n\n")
EOF
data=(--set "data.sources=[$tmp/corpus.txt]" --set "data.dir=$tmp/data" --set "data.prefix=$tmp/data/corpus"
      --set data.vocab_size=320 --set data.split=90,10,0)
"$OPTCC" data prepare --config experiments/smoke.yaml "${data[@]}" >"$tmp/prepare.log" 2>&1 ||
  { cat "$tmp/prepare.log" >&2; fail "optcc data prepare of the test corpus"; }
run=("${data[@]}" --set parallel.tp=2 --set parallel.pp=2 --set parallel.dp=2 --set train.threads=1
     --set train.eval_interval=0 --set log.interval=1 --set parallel.timeout_seconds=20 --set log.dir="$tmp/train")

# Every step's loss of a results file, one per line.
# Read through scripts/optcc_results.py's open_results (SWMR): a plain h5py.File(path, "r") fails with
# "file is already open for write" whenever it lands inside one of the live run's flushes.
losses() { PYTHONPATH=scripts "$PYTHON" -c 'import sys, optcc_results as R; print("\n".join(repr(float(x)) for x in R.open_results(sys.argv[1])["train"]["loss"][:]))' "$1"; }
# The state of job $1 once it has left the queue (waits at most timeout_s).
wait_job() {
  local deadline=$((SECONDS + timeout_s))
  while [ -n "$(squeue --noheader --jobs="$1" 2>/dev/null)" ]; do
    [ $SECONDS -lt $deadline ] || fail "job $1 still queued or running after ${timeout_s}s"
    sleep 1
  done
  scontrol show job "$1" | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' | head -n 1
}

step "2. sbatch -N 2: TP2 x PP2 x DP2 across two nodes against one host"
job=$(sbatch --parsable --chdir="$PWD" -N 2 --ntasks-per-node=4 --output="$tmp/two-node-%j.out" \
  slurm/train.sbatch experiments/smoke.yaml "${run[@]}" --set train.train_steps=4)
state=$(wait_job "$job")
[ "$state" = COMPLETED ] || fail "job $job ended $state"
grep -q "$OPTCC_HOSTS_PREFIX-h1 (198.18.0.1)" "$tmp/two-node-$job.out" &&
  grep -q "$OPTCC_HOSTS_PREFIX-h2 (198.18.0.2)" "$tmp/two-node-$job.out" || fail "the rank table does not name both hosts"
"$OPTCC" train --config experiments/smoke.yaml "${run[@]}" --set train.train_steps=4 --set parallel.ranks_per_node=4 \
  --set log.run_name=one --nproc 8 >"$tmp/one.log" 2>&1 || { cat "$tmp/one.log" >&2; fail "the one-host run"; }
losses "$tmp/train/smoke-$job.h5" >"$tmp/two.losses"
losses "$tmp/train/one.h5" >"$tmp/one.losses"
[ "$(wc -l <"$tmp/one.losses")" -eq 4 ] || fail "the one-host run has $(wc -l <"$tmp/one.losses") loss rows"
cmp -s "$tmp/two.losses" "$tmp/one.losses" || { paste "$tmp/two.losses" "$tmp/one.losses" >&2; fail "losses differ"; }
echo "ok: job $job on two nodes; every loss equal to one host's: $(tr '\n' ' ' <"$tmp/one.losses")"

step "3. an experiment array across two nodes (slurm/submit)"
exp=experiments/testing/slurm-two-node.yaml
"$OPTCC" sweep "$exp" --scale cpu --json >"$tmp/plan.json"
slurm/submit "$exp" --scale cpu "${data[@]}" | tee "$tmp/submit.out"
jobs=$(sed -n 's/^submitted array job \([0-9]*\) .* results job \([0-9]*\) .*/\1 \2/p' "$tmp/submit.out")
[ -n "$jobs" ] || fail "slurm/submit printed no job ids"
for j in $jobs; do
  state=$(wait_job "$j")
  states=$(scontrol show job "$j" | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' | sort -u | tr '\n' ' ')
  [ "$states" = "COMPLETED " ] || fail "job $j ended in state(s) $states"
done
"$PYTHON" slurm/testing/check_results.py runs "$tmp/plan.json" "$OPTCC_RESULTS" || fail "results files"
"$PYTHON" slurm/testing/check_results.py index "$tmp/plan.json" "$OPTCC_RESULTS" || fail "results index"
grep -l "$OPTCC_HOSTS_PREFIX-h2 (198.18.0.2)" "$OPTCC_SLURM_LOGS"/slurm-two-node-*_0.out >/dev/null ||
  fail "array task 0 did not run on both nodes"
echo "ok: array $jobs: both runs complete across the two nodes, in the index"

step "4. all ranks of node 2 killed mid-run; requeued, the run resumes"
job=$(sbatch --parsable --chdir="$PWD" -N 2 --ntasks-per-node=4 --output="$tmp/fault-%j.out" --open-mode=append \
  slurm/train.sbatch experiments/smoke.yaml "${run[@]}" --set train.train_steps=100000 --set train.decay_steps=1000 \
  --set checkpoint.interval=2 --set parallel.timeout_seconds=10)  # host 1's ranks give up 10 s after the kill
ckpt=$tmp/train/ckpt/smoke-$job
latest_step() { sed -n 's/^iter_0*\([0-9][0-9]*\)$/\1/p' "$ckpt/latest" 2>/dev/null; }
deadline=$((SECONDS + timeout_s))
until [ "$(latest_step)" -ge 4 ] 2>/dev/null; do
  [ $SECONDS -lt $deadline ] || fail "job $job wrote no checkpoint of step 4 in ${timeout_s}s (latest: $(cat "$ckpt/latest" 2>/dev/null || echo none))"
  [ -n "$(squeue --noheader --jobs="$job")" ] || fail "job $job ended before the fault"
  sleep 0.5
done
killed=0
for pid in $(ip netns pids "$OPTCC_HOSTS_PREFIX-h2"); do
  # A rank's command line (its comm may be "exe": optcc re-executes /proc/self/exe to set up OpenMP).
  if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "^$OPTCC train "; then
    kill -KILL "$pid" && killed=$((killed + 1))
  fi
done
[ "$killed" -eq 4 ] || fail "found $killed optcc ranks on host 2, not 4"
state=$(wait_job "$job")
[ "$state" != COMPLETED ] || fail "job $job completed although host 2's ranks were killed"
before=$(latest_step)
rows_before=$(losses "$tmp/train/smoke-$job.h5" | wc -l)
echo "job $job ended $state after the kill; latest checkpoint: step $before; results rows: $rows_before"
scontrol requeue "$job"
# slurmctld holds a requeued batch job for about two minutes (its eligible time is set ahead); the
# test needs no such pause, so the job is made eligible now (it then starts as a requeue does).
scontrol update JobId="$job" StartTime=now
# The requeued part's results file, whichever step it resumed from (checked just below): waiting
# for the expected name alone would wait out the timeout when the run resumed from another step.
deadline=$((SECONDS + timeout_s))
resumed=
until [ -n "$resumed" ] && [ "$(losses "$resumed" 2>/dev/null | wc -l)" -ge 2 ]; do
  [ $SECONDS -lt $deadline ] ||
    fail "the requeued job $job wrote no results file smoke-$job.resumed-*.h5 with 2 rows in ${timeout_s}s" \
         "($tmp/train holds: $(ls "$tmp/train" | paste -sd' ' -))"
  sleep 0.5
  resumed=$(compgen -G "$tmp/train/smoke-$job.resumed-*.h5" | head -n 1 || true)
done
[ "$resumed" = "$tmp/train/smoke-$job.resumed-$before.h5" ] ||
  fail "the requeued job resumed into $(basename "$resumed"), not smoke-$job.resumed-$before.h5 (latest names step $before)"
first=$(PYTHONPATH=scripts "$PYTHON" -c 'import sys, optcc_results as R; print(int(R.open_results(sys.argv[1])["train"]["step"][0]))' "$resumed")
[ "$first" -eq $((before + 1)) ] || fail "the resumed part starts at step $first, not $((before + 1))"
[ "$(losses "$tmp/train/smoke-$job.h5" | wc -l)" -eq "$rows_before" ] || fail "the first part's rows changed"
scancel "$job"  # SIGTERM: the ranks checkpoint and exit 75; slurm/stoppable leaves the job cancelled
state=$(wait_job "$job")
[ "$state" = CANCELLED ] || fail "job $job ended $state after scancel, not CANCELLED"
echo "ok: requeued job $job resumed from step $before (its first step $first); the first file kept $rows_before rows"

step "5. done"
echo "PASS ($((SECONDS - t0)) s)"
