# Shared by start.sh, stop.sh and integration_test.sh (sourced, not run): where the test cluster's
# files live and how to find its daemons. Environment variables (all optional):
#   OPTCC_SLURM_DIR   the cluster's directory: slurm.conf, env.sh, munge key and socket, pid files,
#                     logs, controller state, slurmd spool (default /tmp/optcc-slurm; keep it short:
#                     the munge socket's path must fit in 108 bytes)
#   OPTCC_SLURM_CPUS  CPUs declared for the node (default 16, oversubscribing this machine's cores so a
#                     2-rank run and the results job fit side by side on 2 cores)
#   OPTCC_SLURM_PORT  slurmctld's port; slurmd listens on the next one (default 6817)
#   OPTCC_SLURM_WAIT  seconds start.sh waits for the node to be idle (default 60)
#   OPTCC_SLURM_HOSTS N >= 2: a cluster of N nodes, the hosts 1..N of slurm/testing/hosts.sh (network
#                     namespaces; `hosts.sh up N` first, same OPTCC_HOSTS_PREFIX): slurmctld on host
#                     1, one slurmd on each host, named after it; client commands reach the
#                     controller through the hosts' bridge. Default 0: one node, this machine.
SLURM_DIR=${OPTCC_SLURM_DIR:-/tmp/optcc-slurm}
SLURM_CPUS=${OPTCC_SLURM_CPUS:-16}
SLURM_PORT=${OPTCC_SLURM_PORT:-6817}
SLURM_WAIT=${OPTCC_SLURM_WAIT:-60}
SLURM_HOSTS=${OPTCC_SLURM_HOSTS:-0}
HOSTS_SH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/hosts.sh"
HOSTS_PREFIX=${OPTCC_HOSTS_PREFIX:-optcc}
if [ "$SLURM_HOSTS" -ge 2 ]; then
  SLURM_NODES=()
  for ((i = 1; i <= SLURM_HOSTS; i++)); do SLURM_NODES+=("$HOSTS_PREFIX-h$i"); done
  SLURM_NODE=${SLURM_NODES[0]}  # the controller's host
else
  SLURM_NODE=$(hostname -s)
  SLURM_NODES=("$SLURM_NODE")
fi
export SLURM_CONF="$SLURM_DIR/slurm.conf"
MUNGE_SOCKET="$SLURM_DIR/munge/munge.socket"

# The daemons: name, pid file. The pid files are written by the daemons themselves; on hosts, one
# slurmd per node (slurmd-<node>).
DAEMONS=(munged slurmctld)
if [ "$SLURM_HOSTS" -ge 2 ]; then
  for n in "${SLURM_NODES[@]}"; do DAEMONS+=("slurmd-$n"); done
else
  DAEMONS+=(slurmd)
fi
pid_file() { echo "$SLURM_DIR/run/$1.pid"; }

# The pid of daemon $1 when it runs from this cluster's files, else nothing. A pid file left by a
# process that has gone (and maybe a new process with the same pid) is not ours: the process's name
# must be the daemon's (slurmd for slurmd-<node>) and its command line must name this cluster's
# directory or slurm.conf.
daemon_pid() {
  local f pid
  f=$(pid_file "$1")
  [ -s "$f" ] || return 0
  pid=$(tr -dc '0-9' <"$f")
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 0
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "${1%%-*}" ] || return 0
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF "$SLURM_DIR" && echo "$pid"
  return 0
}

# Every log of the cluster, for error messages.
show_logs() {
  local f
  for f in "$SLURM_DIR"/log/*.log; do
    [ -e "$f" ] || continue
    echo "----- $f (last 40 lines)" >&2
    tail -n 40 "$f" >&2
  done
}
