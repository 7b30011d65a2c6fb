# Sourced by scripts/debian13/test.sh and scripts/cuda/compile_check.sh: the cached Debian 13 root
# (debootstrap once, reused), its mounts (undone on every exit) and running commands inside it.
#   OPTCC_DEBIAN13_ROOT   the root (default /var/cache/optcc/debian13-root, outside any clone)
#   OPTCC_DEBIAN_MIRROR   Debian mirror for debootstrap (default http://deb.debian.org/debian)
# Needs root. After `debian13_enter REPO`, the checkout REPO is bind-mounted at /optcc inside the root
# and `in_root CMD...` runs a command there with a clean environment.

ROOT="${OPTCC_DEBIAN13_ROOT:-/var/cache/optcc/debian13-root}"
MIRROR="${OPTCC_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
export DEBIAN_FRONTEND=noninteractive

debian13_require_root() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "$1: needs root (debootstrap, chroot and mounts); run it as root or with sudo" >&2
    exit 1
  fi
}

# debootstrap once, into a temporary folder renamed when complete (an interrupted run leaves no root
# that looks finished).
debian13_make_root() {
  [ -f "$ROOT/.optcc-debootstrap-done" ] && return 0
  command -v debootstrap >/dev/null 2>&1 || { apt-get update -q && apt-get install -y -q debootstrap; }
  mkdir -p "$(dirname "$ROOT")"
  local tmp="$ROOT.partial" log
  log="$(dirname "$ROOT")/debootstrap.log"
  rm -rf "$tmp"
  echo "debian13: debootstrap trixie into $ROOT (once; about a minute)"
  debootstrap --variant=minbase trixie "$tmp" "$MIRROR" > "$log" 2>&1 || {
    echo "debian13: debootstrap failed; the last lines of $log:" >&2
    tail -20 "$log" >&2
    exit 1
  }
  touch "$tmp/.optcc-debootstrap-done"
  rm -rf "$ROOT"
  mv "$tmp" "$ROOT"
}

DEBIAN13_MOUNTS=()
debian13_unmount() {
  local i
  for ((i = ${#DEBIAN13_MOUNTS[@]} - 1; i >= 0; i--)); do umount -l "${DEBIAN13_MOUNTS[$i]}" 2>/dev/null || true; done
  DEBIAN13_MOUNTS=()
}
debian13_bind() {  # debian13_bind SRC DST-inside-root [ro]
  mkdir -p "$ROOT$2"
  mount --bind "$1" "$ROOT$2"
  DEBIAN13_MOUNTS+=("$ROOT$2")
  if [ "${3:-}" = ro ]; then mount -o remount,bind,ro "$ROOT$2"; fi
}

# Makes the root if needed, mounts /proc, /sys, /dev and REPO (at /optcc); unmounts on exit.
debian13_enter() {
  debian13_make_root
  cp /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true
  # debootstrap's minbase root has no /etc/hosts, so "localhost" would go to DNS (tests resolve it).
  [ -s "$ROOT/etc/hosts" ] || printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$ROOT/etc/hosts"
  # One run at a time per root (two would unmount each other's /optcc); then lift what an earlier run
  # left mounted when it was killed before its trap ran (its /optcc may point at a deleted clone).
  exec {DEBIAN13_LOCK_FD}>"$ROOT.lock"
  if ! flock -n "$DEBIAN13_LOCK_FD"; then
    echo "debian13: $ROOT is in use by another run (lock $ROOT.lock); waiting up to 90 min" >&2
    flock -w 5400 "$DEBIAN13_LOCK_FD" || { echo "debian13: $ROOT still in use after 90 min; giving up" >&2; exit 1; }
  fi
  local stale
  stale=$(awk -v r="$ROOT/" 'index($5, r) == 1 {print $5}' /proc/self/mountinfo | sort -r)
  if [ -n "$stale" ]; then
    echo "debian13: unmounting what an interrupted earlier run left in $ROOT:" $stale >&2
    for m in $stale; do umount -l "$m" 2>/dev/null || true; done
  fi
  trap debian13_unmount EXIT
  trap 'exit 130' INT TERM
  mkdir -p "$ROOT/proc" "$ROOT/sys"
  mount -t proc proc "$ROOT/proc"; DEBIAN13_MOUNTS+=("$ROOT/proc")
  debian13_bind /sys /sys
  debian13_bind /dev /dev
  debian13_bind /dev/pts /dev/pts
  if mount -t tmpfs tmpfs "$ROOT/dev/shm" 2>/dev/null; then DEBIAN13_MOUNTS+=("$ROOT/dev/shm"); fi
  debian13_bind "$1" /optcc
}

in_root() {
  chroot "$ROOT" /usr/bin/env -i HOME=/root PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin LANG=C.UTF-8 \
    DEBIAN_FRONTEND=noninteractive CCACHE_DIR=/root/.ccache "$@"
}

# optcc's packages inside the root: Debian 12's list (scripts/deps.sh), run there.
debian13_packages() {
  in_root bash /optcc/scripts/deps.sh
}
