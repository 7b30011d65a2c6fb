#!/usr/bin/env bash
# The multi-host test (CTest `hosts_integration`, labels hosts and slow; .ci/run runs it). Makes two
# hosts on this machine (slurm/testing/hosts.sh: network namespaces with their own hostnames, joined
# by shaped veth links, addresses from 198.18.0.0/15 only) and checks:
#   1. the shaped link's self-check: 20 MB at 200 Mbit/s within 10% and nothing dropped;
#   2. TP2 x PP2 x DP2 across the two hosts, 4 ranks each (TP and one PP stage inside a host, the
#      other stage and DP across), started by optcc's launcher on each host (--nnodes 2 --node-rank K
#      --master HOST:PORT): every step's loss equals the same run's on one host (8 local ranks,
#      ranks_per_node 4), and the rank table names both hosts and addresses;
#   3. the same across hosts with a torchrun-style environment (RANK, WORLD_SIZE, LOCAL_RANK, ...)
#      set by hand for each rank;
#   4. a layout whose nodes are not the hosts (ranks_per_node 2 with 4 ranks per host) is refused
#      before any step, naming both;
#   5. an unreachable rendezvous host: a clear error within parallel.timeout_seconds;
#   6. a host's link cut mid-run (ip link set ... down): every rank ends within the timeout with an
#      error naming the group and the operation, the results file keeps its rows, and the checkpoint
#      `latest` names is intact (its checksums verify);
#   7. `hosts.sh down` leaves no namespace, link or bridge behind (also on failure).
# Needs root and network namespaces; without them it exits 77 (CTest: skipped).
# Environment (all optional):
#   OPTCC            the optcc binary (default build/optcc)
#   PYTHON           Python with h5py (default /usr/bin/python3)
#   OPTCC_TEST_KEEP  1: keep the temporary directory for a look
set -euo pipefail
cd "$(dirname "$0")/../.."
OPTCC=$(readlink -f "${OPTCC:-build/optcc}")
PYTHON=${PYTHON:-/usr/bin/python3}
hosts=slurm/testing/hosts.sh
t0=$SECONDS

if [ "$(id -u)" -ne 0 ]; then echo "skipped: network namespaces need root"; exit 77; fi
probe="optccprobe$$"
if ! ip netns add "$probe" 2>/dev/null; then echo "skipped: cannot make a network namespace here"; exit 77; fi
ip netns del "$probe"
[ -x "$OPTCC" ] || { echo "FAIL: OPTCC=$OPTCC is not an executable (build it first)" >&2; exit 1; }

# Names of their own (15 characters at most for links: oh<pid>-h1v): a hand-made host set's
# namespaces and links are left alone.
export OPTCC_HOSTS_PREFIX="oh$(( $$ % 100000 ))"
tmp=$(mktemp -d /tmp/optcc-hosts-test.XXXXXX)
finish() {
  local code=$?
  pkill -KILL -f -- "--config $tmp/" 2>/dev/null || true  # ranks of a failed step, if any
  bash "$hosts" down >/dev/null || echo "hosts.sh down failed" >&2
  local left
  left=$(ip netns list | awk '{print $1}' | grep "^$OPTCC_HOSTS_PREFIX-" || true)
  left+=$(ip -o link show | awk -F': ' '{print $2}' | grep "^$OPTCC_HOSTS_PREFIX-" || true)
  if [ -n "$left" ]; then echo "FAIL: left behind: $left" >&2; code=1; fi
  if [ "$code" -ne 0 ]; then echo "FAIL (exit $code) after $((SECONDS - t0)) s; logs in $tmp" >&2; fi
  if [ "${OPTCC_TEST_KEEP:-0}" = 1 ] || [ "$code" -ne 0 ]; then echo "kept $tmp"; else rm -rf "$tmp"; fi
  exit "$code"
}
trap finish EXIT
trap 'exit 143' TERM INT
fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "== $* ($((SECONDS - t0)) s)"; }
h1=198.18.0.1

step "1. two hosts, the shaped link's self-check"
bash "$hosts" up 2 --rate 200mbit
bash "$hosts" check --mbytes 20 || fail "the shaped link's self-check"
bash "$hosts" up 2 --rate 1gbit  # the runs: a faster link (idempotent: re-shapes the same hosts)

# A corpus made here (no download), readable from both hosts (one file system).
"$PYTHON" - "$tmp/corpus.txt" <<'EOF'
import random, sys
rng = random.Random(5)
nouns = "cat dog bird fish horse river hill tree stone cloud field road house".split()
verbs = "sees finds follows carries watches crosses leaves reaches passes".split()
with open(sys.argv[1], "w") as f:
    for _ in range(300):
        f.write(" ".join(f"the {rng.choice(nouns)} {rng.choice(verbs)} the {rng.choice(nouns)}."
                         for _ in range(rng.randint(3, 8))).capitalize() + "\n\n")
EOF
cp experiments/smoke.yaml "$tmp/smoke.yaml"
cfg=(--config "$tmp/smoke.yaml" --set "data.sources=[$tmp/corpus.txt]" --set "data.dir=$tmp/data"
     --set "data.prefix=$tmp/data/corpus" --set data.vocab_size=320 --set data.split=90,10,0)
"$OPTCC" data prepare "${cfg[@]}" >"$tmp/prepare.log" 2>&1 || { cat "$tmp/prepare.log" >&2; fail "data prepare"; }
run=("${cfg[@]}" --set train.threads=1 --set train.eval_interval=0 --set log.interval=1 --set parallel.timeout_seconds=20)
layout=(--set parallel.tp=2 --set parallel.pp=2 --set parallel.dp=2)

# Final-step losses of a results file, one per line.
# Read through scripts/optcc_results.py's open_results (SWMR): a plain h5py.File(path, "r") fails with
# "file is already open for write" whenever it lands inside one of the live run's flushes.
losses() { PYTHONPATH=scripts "$PYTHON" -c 'import sys, optcc_results as R; print("\n".join(repr(float(x)) for x in R.open_results(sys.argv[1])["train"]["loss"][:]))' "$1"; }

step "2. TP2 x PP2 x DP2 across two hosts (optcc's launcher on each) against one host"
across=("${run[@]}" "${layout[@]}" --set train.train_steps=4 --set log.dir="$tmp/across" --set log.run_name=r)
for k in 0 1; do
  bash "$hosts" exec $((k + 1)) "$OPTCC" train "${across[@]}" --nproc 4 --nnodes 2 --node-rank $k --master $h1:29500 \
    >"$tmp/across-$k.log" 2>&1 &
  eval "pid$k=$!"
done
wait "$pid0" || { cat "$tmp/across-0.log" >&2; fail "node 0 of the two-host run"; }
wait "$pid1" || { cat "$tmp/across-1.log" >&2; fail "node 1 of the two-host run"; }
grep -q "$OPTCC_HOSTS_PREFIX-h1 ($h1)" "$tmp/across-0.log" || { cat "$tmp/across-0.log" >&2; fail "rank table without host 1"; }
grep -q "$OPTCC_HOSTS_PREFIX-h2 (198.18.0.2)" "$tmp/across-0.log" || fail "the rank table does not name host 2 and its address"
"$OPTCC" train "${run[@]}" "${layout[@]}" --set train.train_steps=4 --set parallel.ranks_per_node=4 \
  --set log.dir="$tmp/one" --set log.run_name=r --nproc 8 >"$tmp/one.log" 2>&1 || { cat "$tmp/one.log" >&2; fail "the one-host run"; }
losses "$tmp/across/r.h5" >"$tmp/across.losses"
losses "$tmp/one/r.h5" >"$tmp/one.losses"
[ "$(wc -l <"$tmp/one.losses")" -eq 4 ] || fail "the one-host run has $(wc -l <"$tmp/one.losses") loss rows, not 4"
cmp -s "$tmp/across.losses" "$tmp/one.losses" ||
  { paste "$tmp/across.losses" "$tmp/one.losses" >&2; fail "the losses across hosts differ from one host's"; }
echo "ok: 4 steps, every loss equal across hosts and on one host: $(tr '\n' ' ' <"$tmp/one.losses")"

step "3. a torchrun-style environment across two hosts (TP2 x DP2, 2 ranks per host)"
tr_run=("${run[@]}" --set parallel.tp=2 --set parallel.dp=2 --set train.train_steps=2 --set log.dir="$tmp/torchrun")
pids=()
for r in 0 1 2 3; do
  bash "$hosts" exec $((r / 2 + 1)) env RANK=$r WORLD_SIZE=4 LOCAL_RANK=$((r % 2)) LOCAL_WORLD_SIZE=2 \
    GROUP_RANK=$((r / 2)) MASTER_ADDR=$h1 MASTER_PORT=29501 "$OPTCC" train "${tr_run[@]}" >"$tmp/torchrun-$r.log" 2>&1 &
  pids+=($!)
done
for r in 0 1 2 3; do wait "${pids[$r]}" || { cat "$tmp/torchrun-$r.log" >&2; fail "torchrun-style rank $r"; }; done
echo "ok: 4 ranks of a torchrun-style launch on two hosts"

step "4. nodes that are not the hosts are refused"
bad=("${run[@]}" "${layout[@]}" --set train.train_steps=2 --set parallel.ranks_per_node=2 --set log.dir="$tmp/bad")
for k in 0 1; do
  bash "$hosts" exec $((k + 1)) "$OPTCC" train "${bad[@]}" --nproc 4 --nnodes 2 --node-rank $k --master $h1:29502 \
    >"$tmp/bad-$k.log" 2>&1 &
  eval "pid$k=$!"
done
wait "$pid0" && fail "a layout of 2 ranks per node on hosts of 4 ranks ran" || true
wait "$pid1" || true
grep -q "are not the hosts the ranks run on" "$tmp/bad-0.log" || { cat "$tmp/bad-0.log" >&2; fail "no node mismatch error"; }
grep -q "| loss" "$tmp/bad-0.log" && fail "the refused layout trained a step"
echo "ok: $(grep -m1 -o 'the layout.s nodes.*' "$tmp/bad-0.log" | cut -c1-160)..."

step "5. an unreachable rendezvous host"
t=$SECONDS
code=0
bash "$hosts" exec 2 "$OPTCC" train "${run[@]}" --set parallel.dp=2 --set parallel.timeout_seconds=5 \
  --set log.dir="$tmp/unreach" --nproc 1 --nnodes 2 --node-rank 1 --master 198.18.0.9:29503 >"$tmp/unreach.log" 2>&1 || code=$?
[ "$code" -ne 0 ] || fail "a run whose rendezvous host does not exist succeeded"
[ $((SECONDS - t)) -le 17 ] || fail "the unreachable rendezvous took $((SECONDS - t)) s (timeout 5 s)"
grep -q "rendezvous at 198.18.0.9:29503" "$tmp/unreach.log" || { cat "$tmp/unreach.log" >&2; fail "the error does not name the rendezvous host"; }
echo "ok: ended in $((SECONDS - t)) s: $(grep -m1 -o 'rendezvous at 198.18.0.9.*' "$tmp/unreach.log" | cut -c1-160)..."

step "6. host 2's link cut mid-run"
cut=("${run[@]}" "${layout[@]}" --set train.train_steps=100000 --set checkpoint.interval=2 --set train.decay_steps=1000
     --set parallel.timeout_seconds=6 --set log.dir="$tmp/cut" --set log.run_name=r)
for k in 0 1; do
  bash "$hosts" exec $((k + 1)) "$OPTCC" train "${cut[@]}" --nproc 4 --nnodes 2 --node-rank $k --master $h1:29504 \
    >"$tmp/cut-$k.log" 2>&1 &
  eval "pid$k=$!"
done
deadline=$((SECONDS + 300))
latest_step() { sed -n 's/^iter_0*\([0-9][0-9]*\)$/\1/p' "$tmp/cut/ckpt/r/latest" 2>/dev/null; }
until [ "$(latest_step)" -ge 4 ] 2>/dev/null; do
  [ $SECONDS -lt $deadline ] || { cat "$tmp/cut-0.log" >&2; fail "the run did not reach step 4 in 300 s"; }
  kill -0 "$pid0" 2>/dev/null || { cat "$tmp/cut-0.log" >&2; fail "the run ended before the cut"; }
  sleep 0.5
done
ip link set "$OPTCC_HOSTS_PREFIX-h2v" down
t=$SECONDS
code0=0; code1=0
wait "$pid0" || code0=$?
wait "$pid1" || code1=$?
took=$((SECONDS - t))
[ "$code0" -ne 0 ] && [ "$code1" -ne 0 ] || fail "after the cut the launchers exited $code0 and $code1"
[ "$took" -le 36 ] || fail "the ranks took $took s to end after the cut (timeout 6 s)"
for k in 0 1; do  # each host's ranks name the group, the operation and the ranks on the other host
  grep -q "(group .*failed after at most 6000 ms" "$tmp/cut-$k.log" || fail "host $((k + 1))'s error names no group"
  grep -q "across hosts: ranks\? [0-9,]* on $OPTCC_HOSTS_PREFIX-h$((2 - k)) (198.18.0.$((2 - k)))" "$tmp/cut-$k.log" ||
    { cat "$tmp/cut-$k.log" >&2; fail "host $((k + 1))'s error does not name the ranks on the other host"; }
done
echo "ok: both hosts' launchers ended in $took s (exit $code0, $code1); first errors:"
grep -h -m2 "error" "$tmp/cut-0.log" "$tmp/cut-1.log" | cut -c1-300
latest=$(head -n1 "$tmp/cut/ckpt/r/latest")
( cd "$tmp/cut/ckpt/r/$latest" && sha256sum --quiet -c ./*.sha256 ) || fail "checkpoint $latest does not verify"
rows=$(losses "$tmp/cut/r.h5" | wc -l)
[ "$rows" -ge 4 ] || fail "the results file kept $rows loss rows"
echo "ok: latest = $latest verifies; the results file kept $rows steps"

step "7. down"
bash "$hosts" down
echo "PASS ($((SECONDS - t0)) s)"
