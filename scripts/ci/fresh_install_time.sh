#!/usr/bin/env bash
# Times what `make test` installs on a fresh Debian 12 machine (docs/builds.md, "CI and build times"):
# debootstraps a minimal Debian 12 root in a temporary folder, then runs scripts/deps.sh and
# slurm/testing/deps.sh in it (apt-get from the network) and prints each one's seconds and the size
# of the packages fetched. Needs root and debootstrap; removes the root at the end.
#
#   scripts/ci/fresh_install_time.sh        OPTCC_DEBIAN_MIRROR (default http://deb.debian.org/debian)
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
MIRROR="${OPTCC_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
[ "$(id -u)" -eq 0 ] || { echo "fresh_install_time.sh: needs root (debootstrap, chroot)" >&2; exit 1; }
command -v debootstrap > /dev/null || { echo "fresh_install_time.sh: needs debootstrap (apt-get install debootstrap)" >&2; exit 1; }
work=$(mktemp -d /tmp/optcc-fresh-install.XXXXXX)
root="$work/root"
cleanup() { umount "$root/proc" 2> /dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
t0=$(date +%s)
debootstrap --variant=minbase bookworm "$root" "$MIRROR" > "$work/debootstrap.log" 2>&1 ||
  { tail -20 "$work/debootstrap.log"; exit 1; }
t1=$(date +%s)
echo "fresh_install_time: debootstrap (the machine itself, not counted): $((t1 - t0)) s"
cp /etc/resolv.conf "$root/etc/resolv.conf"
mkdir -p "$root/optcc/scripts" "$root/optcc/slurm/testing"
cp "$REPO/scripts/deps.sh" "$root/optcc/scripts/"
cp "$REPO/slurm/testing/deps.sh" "$root/optcc/slurm/testing/"
mount -t proc proc "$root/proc"
for step in scripts/deps.sh slurm/testing/deps.sh; do
  t=$(date +%s)
  chroot "$root" bash -c "cd /optcc && bash $step" > "$work/step.log" 2>&1 || { tail -20 "$work/step.log"; exit 1; }
  echo "fresh_install_time: $step: $(($(date +%s) - t)) s"
done
echo "fresh_install_time: packages fetched: $(du -sh "$root/var/cache/apt/archives" | cut -f1)"
