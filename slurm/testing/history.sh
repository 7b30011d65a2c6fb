#!/usr/bin/env bash
# The test cluster's finished jobs (what `sacct` shows on a cluster with accounting; the test cluster
# has no accounting database, so sacct answers "Slurm accounting storage is disabled"). Reads the job
# completion log slurmctld appends to (JobCompLoc in the slurm.conf start.sh writes) and prints one
# line per finished job or array task, in the order they ended:
#   JOBID  NAME  STATE  EXIT  START  END  NODES
#
#   slurm/testing/history.sh [JOBID]      JOBID: only that job (an array job's id: all its tasks)
#
# Environment: OPTCC_SLURM_DIR (default /tmp/optcc-slurm, as start.sh). Jobs still queued or running:
# squeue; one job in full, up to an hour after it ended: scontrol show job JOBID.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"
log=$SLURM_DIR/log/jobcomp.txt
case "${1:-}" in -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
[ -f "$log" ] || { echo "history.sh: no finished job yet ($log does not exist; is the cluster in $SLURM_DIR started?)" >&2; exit 1; }
awk -v want="${1:-}" '
  function field(name,   i, n, kv) {
    for (i = 1; i <= NF; i++) if (index($i, name "=") == 1) return substr($i, length(name) + 2)
    return ""
  }
  BEGIN { printf "%-12s %-28s %-12s %-6s %-19s %-19s %s\n", "JOBID", "NAME", "STATE", "EXIT", "START", "END", "NODES" }
  {
    id = field("JobId"); array = field("ArrayJobId"); task = field("ArrayTaskId")
    shown = (array != "" && array != "0" && task != "" && task != "4294967294") ? array "_" task : id
    if (want != "" && want != id && want != array) next
    printf "%-12s %-28s %-12s %-6s %-19s %-19s %s\n", shown, field("Name"), field("JobState"), field("ExitCode"),
           field("StartTime"), field("EndTime"), field("NodeList")
  }' "$log"
