#!/usr/bin/env bash
# Stops the test cluster that slurm/testing/start.sh started and removes its directory
# (OPTCC_SLURM_DIR, default /tmp/optcc-slurm; see common.sh). Jobs still in the cluster are cancelled
# first. Only the daemons whose pid files are in that directory, and whose command lines name it, are
# signalled; nothing else on the machine is touched. --keep keeps the directory (logs, state).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"
keep=0
[ "${1:-}" = --keep ] && keep=1
# Every slurmd this cluster's directory has a pid file of, whatever OPTCC_SLURM_HOSTS says now: a
# two-node cluster stopped without it set still has its slurmd-<node> daemons stopped.
for f in "$SLURM_DIR"/run/slurmd*.pid; do
  [ -e "$f" ] || continue
  d=$(basename "$f" .pid)
  [[ " ${DAEMONS[*]} " == *" $d "* ]] || DAEMONS+=("$d")
done

# Waits up to $2 seconds for process $1 to end.
wait_gone() {
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    [ -e "/proc/$1" ] || return 0
    sleep 0.1
  done
  return 1
}

if [ -n "$(daemon_pid slurmctld)" ] && [ -n "$(daemon_pid "${DAEMONS[2]}")" ]; then
  scancel --full --quiet --partition=test 2>/dev/null || true
  for ((i = 0; i < 30; i++)); do  # let slurmd end the jobs' steps before it goes
    [ -z "$(squeue --noheader --states=RUNNING,COMPLETING 2>/dev/null)" ] && break
    sleep 1
  done
fi
for ((k = ${#DAEMONS[@]} - 1; k >= 0; k--)); do  # the reverse of the start order
  d=${DAEMONS[$k]}
  pid=$(daemon_pid "$d")
  [ -n "$pid" ] || continue
  kill -TERM "$pid"
  if ! wait_gone "$pid" 20; then
    echo "stop.sh: $d ($pid) still runs 20 s after SIGTERM; sending SIGKILL" >&2
    kill -KILL "$pid" 2>/dev/null || true
    wait_gone "$pid" 5 || true
  fi
  echo "stop.sh: stopped $d ($pid)"
done
if [ "$keep" -eq 0 ]; then
  # Only what start.sh made: OPTCC_SLURM_DIR may name a directory that holds other things.
  rm -rf "$SLURM_DIR"/{munge,run,log,state,spool} "$SLURM_DIR"/spool-* "$SLURM_CONF" "$SLURM_DIR/env.sh"
  rmdir "$SLURM_DIR" 2>/dev/null || true
else
  echo "stop.sh: kept $SLURM_DIR"
fi
