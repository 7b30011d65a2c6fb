#!/usr/bin/env bash
# Several "hosts" on this machine, joined by real, shaped links: each host is a network namespace
# with one interface, and its processes get their own hostname (a UTS namespace) when started
# through `exec`. Processes of one host talk over its own loopback (fast, like a node's NVLink or
# shared memory); traffic between hosts crosses the kernel's veth + bridge and is shaped by Linux
# traffic control, so the ranks of one host share its link as they share a node's NIC.
#
#   slurm/testing/hosts.sh up N [--rate 1gbit] [--delay 0us]     make hosts 1..N (idempotent)
#   slurm/testing/hosts.sh exec I CMD [ARG...]   run CMD on host I (its namespace and hostname)
#   slurm/testing/hosts.sh check [--mbytes 50]   send data host 1 -> host 2: rate and drops
#   slurm/testing/hosts.sh list                  the hosts, their addresses and shaping
#   slurm/testing/hosts.sh down                  remove every namespace, link and qdisc it made
#
# Names and addresses (OPTCC_HOSTS_PREFIX, default "optcc", changes the names):
#   host I: namespace and hostname <prefix>-h<I>, interface e0 with address 198.18.0.<I>/24;
#   the bridge <prefix>-br joins the hosts' peer ends <prefix>-h<I>v, in this (the root) namespace.
# Every host resolves every host's name: /etc/netns/<prefix>-h<I>/hosts, which `ip netns exec` (and
# so `exec`) shows its processes as /etc/hosts.
# Addresses come only from 198.18.0.0/15, the block set aside for network benchmarks (RFC 2544), so
# no real network is shadowed. The bridge has 198.18.0.254, so this (the root) namespace reaches the
# hosts (e.g. Slurm's client commands reach a controller on host 1); the hosts have no route out.
#
# Shaping, per host, both directions, at the same --rate (a NIC's line rate) and --delay (one way):
#   what the host sends:     on e0 (inside the host)
#   what the host receives:  on its peer end <prefix>-h<I>v (the bridge's egress towards it)
# so a message between two hosts is limited by the sender's and the receiver's link. The rate is a
# token bucket (tbf; its burst is one millisecond of the rate, at least 64 kB, the largest segment veth
# hands over: a 64 kB bucket caps a 2 Gbit/s link at ~82% of its rate here); a --delay above 0 needs netem
# (netem delay D rate R on e0, netem rate R on the peer end) and is refused on a kernel built
# without it (CONFIG_NET_SCH_NETEM, e.g. this project's CI machines), rather than silently dropped.
# Queue limits: too small a queue drops what a TCP window puts in flight and turns a slow link into a
# lossy one. The queue holds twice the bandwidth-delay product plus 1000 full packets (netem's default
# limit), so a window of bandwidth x delay always fits. `check` shows the rate reached and the drops
# (both must be right before measuring with it).
#
# Root only (namespaces, links and qdiscs). Needs iproute2 (ip, tc) and util-linux (unshare).
set -euo pipefail

PREFIX=${OPTCC_HOSTS_PREFIX:-optcc}
BRIDGE="$PREFIX-br"
NET=198.18.0
MTU_BYTES=1500

die() { echo "hosts.sh: $*" >&2; exit 1; }
need_root() {
  [ "$(id -u)" -eq 0 ] || die "namespaces, links and qdiscs need root; run it as root (e.g. sudo $0 ${ALL_ARGS[*]})"
}
ns_of() { echo "$PREFIX-h$1"; }
peer_of() { echo "$PREFIX-h$1v"; }
addr_of() { echo "$NET.$1"; }

# The hosts that exist now: their numbers, from the namespaces named <prefix>-h<I>.
hosts_now() {
  ip netns list 2>/dev/null | awk '{print $1}' | sed -n "s/^$PREFIX-h\([0-9][0-9]*\)$/\1/p" | sort -n
}

# Rate (tc syntax: 200mbit, 1gbit, 10mbps, ...) in bits per second.
rate_bps() {
  local v num unit
  v=$(echo "$1" | tr "A-Z" "a-z")
  num=$(echo "$v" | sed -n 's/^\([0-9.][0-9.]*\)[a-zA-Z]*$/\1/p')
  unit=$(echo "$v" | sed -n 's/^[0-9.][0-9.]*\([a-zA-Z]*\)$/\1/p')
  [ -n "$num" ] || die "--rate $v: not a rate. Fix: a number and a tc unit, e.g. --rate 200mbit or --rate 1gbit"
  case "$unit" in
    bit) awk -v n="$num" 'BEGIN{printf "%.0f", n}' ;;
    kbit) awk -v n="$num" 'BEGIN{printf "%.0f", n*1e3}' ;;
    mbit) awk -v n="$num" 'BEGIN{printf "%.0f", n*1e6}' ;;
    gbit) awk -v n="$num" 'BEGIN{printf "%.0f", n*1e9}' ;;
    bps) awk -v n="$num" 'BEGIN{printf "%.0f", n*8}' ;;
    kbps) awk -v n="$num" 'BEGIN{printf "%.0f", n*8e3}' ;;
    mbps) awk -v n="$num" 'BEGIN{printf "%.0f", n*8e6}' ;;
    gbps) awk -v n="$num" 'BEGIN{printf "%.0f", n*8e9}' ;;
    *) die "--rate $v: unit '$unit' is not one of bit kbit mbit gbit bps kbps mbps gbps (tc's). Fix: e.g. --rate 200mbit" ;;
  esac
}

# Delay (tc syntax: 50us, 2ms, 0.5ms, 1s) in microseconds.
delay_us() {
  local v num unit
  v=$(echo "$1" | tr "A-Z" "a-z")
  num=$(echo "$v" | sed -n 's/^\([0-9.][0-9.]*\)[a-z]*$/\1/p')
  unit=$(echo "$v" | sed -n 's/^[0-9.][0-9.]*\([a-z]*\)$/\1/p')
  [ -n "$num" ] || die "--delay $v: not a delay. Fix: a number and a unit, e.g. --delay 50us or --delay 2ms"
  case "$unit" in
    us) awk -v n="$num" 'BEGIN{printf "%.0f", n}' ;;
    ms) awk -v n="$num" 'BEGIN{printf "%.0f", n*1e3}' ;;
    s) awk -v n="$num" 'BEGIN{printf "%.0f", n*1e6}' ;;
    *) die "--delay $v: unit '$unit' is not one of us ms s. Fix: e.g. --delay 50us" ;;
  esac
}

# Queue limit in bytes for a link of R bit/s and one-way delay D us (see the header).
queue_limit() {
  awk -v r="$1" -v d="$2" -v m="$MTU_BYTES" 'BEGIN{bdp=r/8*d/1e6; printf "%d", 1000*m + 2*int(bdp)}'
}

# Whether this kernel has netem (the only qdisc that adds delay).
have_netem() {
  local probe="$PREFIX-probe"
  ip link add "$probe" type dummy 2>/dev/null || return 1
  local ok=1
  tc qdisc add dev "$probe" root netem delay 1ms 2>/dev/null && ok=0
  ip link del "$probe"
  return $ok
}

# tbf's bucket in bytes for a link of R bit/s: one millisecond of the rate, at least 64 kB (see the header).
burst_bytes() {
  awk -v r="$1" 'BEGIN{b=r/8/1000; if (b < 65536) b = 65536; printf "%d", b}'
}

# Shapes host $1: $2 rate, $3 delay in us (0: none), queue limit $4 bytes. Replaces what was there.
shape() {
  local i=$1 rate=$2 us=$3 limit=$4 ns burst
  ns=$(ns_of "$i")
  burst=$(burst_bytes "$(rate_bps "$rate")")
  if [ "$us" -eq 0 ]; then
    ip netns exec "$ns" tc qdisc replace dev e0 root tbf rate "$rate" burst "$burst" limit "$limit"
    tc qdisc replace dev "$(peer_of "$i")" root tbf rate "$rate" burst "$burst" limit "$limit"
  else
    local packets=$(( (limit + MTU_BYTES - 1) / MTU_BYTES ))
    ip netns exec "$ns" tc qdisc replace dev e0 root netem delay "${us}us" rate "$rate" limit "$packets"
    tc qdisc replace dev "$(peer_of "$i")" root netem rate "$rate" limit "$packets"
  fi
}

cmd_up() {
  need_root up
  [ $# -ge 1 ] || die "up: how many hosts? Fix: hosts.sh up N [--rate 200mbit] [--delay 0us]"
  local n=$1 rate=1gbit delay=0us
  shift
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 2 ] && [ "$n" -le 250 ] ||
    die "up $n: the number of hosts must be an integer from 2 to 250 (addresses $NET.1 to $NET.250)"
  while [ $# -gt 0 ]; do
    case "$1" in
      --rate) rate=${2:?--rate needs a value, e.g. 200mbit}; shift 2 ;;
      --delay) delay=${2:?--delay needs a value, e.g. 50us}; shift 2 ;;
      *) die "up: unknown option '$1'. Options: --rate R (tc units, default 1gbit), --delay D (default 0us)" ;;
    esac
  done
  local bps us limit
  bps=$(rate_bps "$rate")
  us=$(delay_us "$delay")
  [ "$bps" -gt 0 ] || die "--rate $rate: must be above 0"
  limit=$(queue_limit "$bps" "$us")
  if [ "$us" -gt 0 ] && ! have_netem; then
    die "--delay $delay: this kernel ($(uname -r)) has no netem qdisc (CONFIG_NET_SCH_NETEM), the only way tc adds delay, so the links would not have it. Fix: --delay 0us (rate only, tbf), or a kernel with netem"
  fi
  # Hosts beyond N from an earlier `up` would share the bridge: remove them first.
  local h
  for h in $(hosts_now); do [ "$h" -le "$n" ] || remove_host "$h"; done
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
  fi
  ip addr replace "$NET.254/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  local i ns
  for i in $(seq 1 "$n"); do
    ns=$(ns_of "$i")
    ip netns list | awk '{print $1}' | grep -qx "$ns" || ip netns add "$ns"
    if ! ip link show "$(peer_of "$i")" >/dev/null 2>&1; then
      ip link add "$(peer_of "$i")" type veth peer name e0 netns "$ns"
    fi
    ip link set "$(peer_of "$i")" master "$BRIDGE" up
    ip netns exec "$ns" ip link set lo up
    ip netns exec "$ns" ip addr replace "$(addr_of "$i")/24" dev e0
    ip netns exec "$ns" ip link set e0 up
    shape "$i" "$rate" "$us" "$limit"
  done
  for i in $(seq 1 "$n"); do  # names of all hosts, seen from each (ip netns exec binds it on /etc/hosts)
    mkdir -p "/etc/netns/$(ns_of "$i")"
    { echo "127.0.0.1 localhost"; for h in $(seq 1 "$n"); do echo "$(addr_of "$h") $(ns_of "$h")"; done; } \
      >"/etc/netns/$(ns_of "$i")/hosts"
  done
  echo "hosts.sh: $n hosts up: $(for i in $(seq 1 "$n"); do echo -n "$(ns_of "$i")=$(addr_of "$i") "; done)"
  echo "hosts.sh: each link $rate both ways, $delay one way, queue limit $limit bytes" \
       "(2 x bandwidth-delay product + 1000 packets)"
}

remove_host() {
  local i=$1
  # Processes still in the host would outlive its namespace (ranks, slurmd): they go first.
  ip netns pids "$(ns_of "$i")" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
  ip link del "$(peer_of "$i")" 2>/dev/null || true  # takes e0 (its other end) with it
  ip netns del "$(ns_of "$i")" 2>/dev/null || true
  rm -rf "/etc/netns/$(ns_of "$i")"
}

cmd_down() {
  need_root down
  local h n=0
  for h in $(hosts_now); do remove_host "$h"; n=$((n + 1)); done
  if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE"; fi
  rmdir /etc/netns 2>/dev/null || true  # only when no other namespace keeps files there
  echo "hosts.sh: removed $n hosts and the bridge $BRIDGE"
}

cmd_exec() {
  need_root exec
  [ $# -ge 2 ] || die "exec: which host and what command? Fix: hosts.sh exec I CMD [ARG...]"
  local i=$1
  shift
  ip netns list | awk '{print $1}' | grep -qx "$(ns_of "$i")" ||
    die "exec $i: there is no host $i ($(ns_of "$i")); hosts now: $(hosts_now | tr '\n' ' '). Fix: hosts.sh up N first"
  # A UTS namespace of its own: the host's processes see its hostname (gethostname, Slurm's node name).
  # `ip netns exec` mounts the namespace's own /sys, without the machine's cgroup hierarchies under
  # /sys/fs/cgroup: mount the same ones again there (in the private mount namespace it made; a
  # cgroup hierarchy can be mounted more than once), as slurmd's cgroup plugin reads them.
  local cgroups
  cgroups=$(awk '$2 == "/sys/fs/cgroup" && $3 == "cgroup2" { print "mount -t cgroup2 cgroup2 /sys/fs/cgroup;" }
    $2 == "/sys/fs/cgroup" && $3 == "tmpfs" { print "mount -t tmpfs -o mode=755 tmpfs /sys/fs/cgroup;" }
    $2 ~ "^/sys/fs/cgroup/" && ($3 == "cgroup" || $3 == "cgroup2") {
      o = $4; gsub(/(^|,)(rw|ro|relatime|nosuid|nodev|noexec)/, "", o); sub(/^,/, "", o)
      print "mkdir -p " $2 "; mount -t " $3 (o == "" ? "" : " -o " o) " " $3 " " $2 ";" }' /proc/self/mounts)
  exec ip netns exec "$(ns_of "$i")" env OPTCC_HOST_CGROUPS="$cgroups" unshare --uts -- /bin/sh -c \
    'hostname "$0" && { [ -n "$(ls -A /sys/fs/cgroup 2>/dev/null)" ] || eval "$OPTCC_HOST_CGROUPS"; } && unset OPTCC_HOST_CGROUPS && exec "$@"' \
    "$(ns_of "$i")" "$@"
}

cmd_list() {
  need_root list
  local h
  for h in $(hosts_now); do
    echo "$(ns_of "$h") $(addr_of "$h")"
    ip netns exec "$(ns_of "$h")" tc qdisc show dev e0 | sed 's/^/  send:    /'
    tc qdisc show dev "$(peer_of "$h")" | sed 's/^/  receive: /'
  done
}

# Drops and packets sent by the qdiscs of hosts 1 and 2, summed: "dropped sent".
qdisc_counts() {
  {
    ip netns exec "$(ns_of 1)" tc -s qdisc show dev e0
    tc -s qdisc show dev "$(peer_of 2)"
  } | awk '/Sent/ {for (k = 1; k <= NF; k++) if ($k == "dropped") {d += $(k+1)+0}; p += $4} END {print d+0, p+0}'
}

# Sends --mbytes MB from host 1 to host 2 over TCP; host 2 times the transfer from its first to its
# last byte. Compares the rate with host 1's declared one and counts the qdiscs' drops.
cmd_check() {
  need_root check
  local mbytes=50
  while [ $# -gt 0 ]; do
    case "$1" in
      --mbytes) mbytes=${2:?--mbytes needs a value}; shift 2 ;;
      *) die "check: unknown option '$1'. Options: --mbytes N (default 50)" ;;
    esac
  done
  local hosts
  hosts=$(hosts_now | wc -l)
  [ "$hosts" -ge 2 ] || die "check: needs 2 hosts, found $hosts. Fix: hosts.sh up 2 first"
  local rate declared
  rate=$(ip netns exec "$(ns_of 1)" tc qdisc show dev e0 | sed -n 's/.* rate \([0-9.]*[A-Za-z]*\).*/\1/p')
  [ -n "$rate" ] || die "check: host 1's e0 has no rate (tc qdisc show dev e0 in $(ns_of 1)); run hosts.sh up again"
  declared=$(rate_bps "$rate")
  local before after out
  before=$(qdisc_counts)
  local port=5201 py
  py=$(command -v python3)
  out=$(mktemp)
  ip netns exec "$(ns_of 2)" "$py" - "$(addr_of 2)" "$port" "$mbytes" >"$out" <<'PY' &
import socket, sys, time
addr, port, mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((addr, port)); s.listen(1)
s.settimeout(60)
c, _ = s.accept()
want, got, t0 = mb * 1000000, 0, None
while got < want:
    b = c.recv(1 << 20)
    if not b: break
    if t0 is None: t0 = time.monotonic()
    got += len(b)
t1 = time.monotonic()
print(got, t1 - t0)
PY
  local server=$!
  sleep 0.5
  ip netns exec "$(ns_of 1)" "$py" - "$(addr_of 2)" "$port" "$mbytes" <<'PY'
import socket, sys
addr, port, mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
import time
for attempt in range(100):  # the server may still be starting (a loaded machine)
    try:
        c = socket.create_connection((addr, port), timeout=60)
        break
    except ConnectionRefusedError:
        time.sleep(0.1)
else:
    sys.exit("hosts.sh check: host 2's receiver did not listen within 10 s")
chunk = b"\0" * (1 << 20)
left = mb * 1000000
while left > 0:
    n = min(left, len(chunk)); c.sendall(chunk[:n]); left -= n
c.close()
PY
  wait "$server"
  after=$(qdisc_counts)
  local got= secs=
  read -r got secs <"$out" || true
  rm -f "$out"
  [ -n "$secs" ] || die "check: host 2 received nothing (its receiver printed no result)"
  local drops=$(( ${after% *} - ${before% *} ))
  awk -v got="$got" -v s="$secs" -v want="$declared" -v drops="$drops" -v rate="$rate" 'BEGIN {
    r = got * 8 / s; ratio = r / want
    printf "hosts.sh check: %d bytes host 1 -> host 2 in %.3f s: %.1f Mbit/s, %.3f of the declared %s; %d packets dropped by the qdiscs\n", got, s, r / 1e6, ratio, rate, drops
    ok = (ratio >= 0.9 && ratio <= 1.1 && drops == 0)
    if (!ok) { print "hosts.sh check: FAILED: the rate must be within 10% of the declared one and nothing dropped" > "/dev/stderr"; exit 1 }
  }'
}

ALL_ARGS=("$@")  # need_root's suggestion repeats the whole command
case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  down) shift; cmd_down "$@" ;;
  exec) shift; cmd_exec "$@" ;;
  list) shift; cmd_list "$@" ;;
  check) shift; cmd_check "$@" ;;
  *) die "usage: hosts.sh up N [--rate R] [--delay D] | exec I CMD... | check [--mbytes N] | list | down" ;;
esac
