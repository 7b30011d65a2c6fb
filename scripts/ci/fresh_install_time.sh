#!/usr/bin/env bash
# Times what `make test` does on a fresh Debian 12 machine (docs/builds.md, "CI and build times"):
# debootstraps a minimal Debian 12 root in a temporary folder, then runs scripts/deps.sh and
# slurm/testing/deps.sh in it (apt-get from the network) and prints each one's seconds and the size
# of the packages fetched. With --make-test it instead runs the README's whole `make test` in that
# root, on a clone of this repository's HEAD (no packages, no compiler cache), and prints its
# seconds and ctest's summary. With --make-demo it runs the README's `make demo` there instead, until
# training starts (the trainer's "training N steps" line), then stops it. Needs root and
# debootstrap; unmounts and removes the root at the end.
#
#   scripts/ci/fresh_install_time.sh [--make-test | --make-demo]
#                                     OPTCC_DEBIAN_MIRROR (default http://deb.debian.org/debian)
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
MIRROR="${OPTCC_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
TARGET=""
case "${1:-}" in
  --make-test) TARGET=test ;;
  --make-demo) TARGET=demo ;;
  "") ;;
  *) echo "fresh_install_time.sh: unknown option '$1' (--make-test or --make-demo)" >&2; exit 2 ;;
esac
[ "$(id -u)" -eq 0 ] || { echo "fresh_install_time.sh: needs root (debootstrap, chroot)" >&2; exit 1; }
command -v debootstrap > /dev/null || { echo "fresh_install_time.sh: needs debootstrap (apt-get install debootstrap)" >&2; exit 1; }
work=$(mktemp -d /tmp/optcc-fresh-install.XXXXXX)
root="$work/root"
MOUNTS=(proc sys dev dev/pts dev/shm run)
cleanup() {
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do umount -l "$root/${MOUNTS[i]}" 2> /dev/null || true; done
  # Never remove through a mount that is still there (the host's /dev, /sys).
  if grep -q " $root/" /proc/mounts; then
    echo "fresh_install_time: $root still has mounts; left in place" >&2
  else
    rm -rf --one-file-system "$work"
  fi
}
trap cleanup EXIT
t0=$(date +%s)
debootstrap --variant=minbase bookworm "$root" "$MIRROR" > "$work/debootstrap.log" 2>&1 ||
  { tail -20 "$work/debootstrap.log"; exit 1; }
t1=$(date +%s)
echo "fresh_install_time: debootstrap (the machine itself, not counted): $((t1 - t0)) s"
cp /etc/resolv.conf "$root/etc/resolv.conf"
# The site's own certificate authorities (a TLS-inspecting proxy's, say): a machine of this network
# has them, and npm (the corpus fetch) needs them; the ca-certificates package adds them to the bundle.
if compgen -G "/usr/local/share/ca-certificates/*.crt" > /dev/null; then
  mkdir -p "$root/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
fi
mount -t proc proc "$root/proc"
if [ -n "$TARGET" ]; then
  # A machine's /sys, /dev and /run (sockets, shared memory, network namespaces for the tests).
  for m in sys dev dev/pts dev/shm run; do mkdir -p "$root/$m" && mount --bind "/$m" "$root/$m"; done
  # make and git come with a fresh machine's build tools; scripts/deps.sh installs the rest.
  chroot "$root" bash -c "apt-get update -q && apt-get install -y -q --no-install-recommends make git ca-certificates" \
    > "$work/make.log" 2>&1 || { tail -20 "$work/make.log"; exit 1; }
  git clone -q "$REPO" "$root/optcc"
  echo "fresh_install_time: make $TARGET on a clone of $(git -C "$REPO" rev-parse --short HEAD)"
  log="$work/make-$TARGET.log"
  t=$(date +%s)
  rc=0
  if [ "$TARGET" = test ]; then
    chroot "$root" bash -c "cd /optcc && make test" > "$log" 2>&1 || rc=$?
    echo "fresh_install_time: make test: $(($(date +%s) - t)) s (exit $rc)"
    grep -E "tests passed|Total Test time|^deps:|slurm deps:" "$log" || true
    [ "$rc" = 0 ] || { tail -40 "$log"; exit 1; }
    exit 0
  fi
  setsid chroot "$root" bash -c "cd /optcc && make demo" > "$log" 2>&1 &
  demo=$!
  built=""
  while kill -0 "$demo" 2> /dev/null && ! grep -qE "\] training [0-9]+ step" "$log"; do
    [ -z "$built" ] && grep -q "optcc data fetch" "$log" && built=$(date +%s)
    sleep 1
  done
  seen=$(date +%s)
  kill -TERM -- "-$demo" 2> /dev/null || true
  wait "$demo" 2> /dev/null || true
  grep -qE "\] training [0-9]+ step" "$log" || { tail -40 "$log"; echo "fresh_install_time: make demo ended before training started" >&2; exit 1; }
  echo "fresh_install_time: make demo until training starts: $((seen - t)) s (install and build: $((${built:-$seen} - t)) s)"
  exit 0
fi
mkdir -p "$root/optcc/scripts" "$root/optcc/slurm/testing"
cp "$REPO/scripts/deps.sh" "$root/optcc/scripts/"
cp "$REPO/slurm/testing/deps.sh" "$root/optcc/slurm/testing/"
for step in scripts/deps.sh slurm/testing/deps.sh; do
  t=$(date +%s)
  chroot "$root" bash -c "cd /optcc && bash $step" > "$work/step.log" 2>&1 || { tail -20 "$work/step.log"; exit 1; }
  echo "fresh_install_time: $step: $(($(date +%s) - t)) s"
done
echo "fresh_install_time: packages fetched: $(du -sh "$root/var/cache/apt/archives" | cut -f1)"
