#!/usr/bin/env bash
# Installs the Debian 12 packages of the test clusters (slurm/testing/start.sh, one node or several
# hosts): munge, slurmctld, slurmd and the client commands (sbatch, squeue, sinfo, ...). Only the Slurm test needs
# them, so they are not in scripts/deps.sh. Idempotent and non-interactive; run as root (or with sudo).
# Services are not started by the install: start.sh runs its own daemons with its own files.
set -euo pipefail

# iproute2 (ip, tc) and util-linux (unshare) for the multi-host cluster and tests (slurm/testing/hosts.sh);
# those also need a kernel with veth, bridge and tbf (sch_tbf) and root in a privileged environment.
PACKAGES=(munge slurmctld slurmd slurm-client iproute2 util-linux)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "slurm deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "slurm deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  SUDO="sudo"
fi
# Keep the packages' init scripts from starting a system munged/slurmctld/slurmd during the install
# (Debian's convention: a policy-rc.d that exits 101 denies every start). One already there is kept.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
  $SUDO chmod 755 "$policy"
  trap '$SUDO rm -f "$policy"' EXIT
fi
echo "slurm deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
