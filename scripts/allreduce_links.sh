#!/usr/bin/env bash
# The link model checked against numbers measured outside this project: a published table of Gloo
# all-reduce times on 4 AWS nodes whose links were slowed with Linux traffic control (Binhang Yuan's
# tc_cluster_setting repository, results/allreduce.md: one fp32 tensor of 128 or 256 MB, all-reduced
# by torch.distributed's Gloo backend, mean of 10 calls after a warm-up, the slowest rank; each node
# shaped with `tc qdisc add dev ens3 root netem delay D rate R limit <R x 1500 x D x 1.5 packets>`).
# Each condition runs through optcc's communicator (`optcc comm-check --time-allreduce`, 4 ranks,
# one per node, as dp traffic):
#   emulated  on this (root) namespace: 4 local ranks as 4 nodes, the link emulator declaring the
#             condition's rate and delay (per ring step);
#   real      on 4 hosts of slurm/testing/hosts.sh, shaped to the condition's rate. This kernel has no
#             netem, so the real links carry the rate without the delay; a rate above what this
#             machine's veth links carry (about 2 Gbit/s with room) is scaled down with the message
#             (rate / k and size / k take the same time on a bandwidth-bound link), k stated per row.
#   sudo scripts/allreduce_links.sh           (about 5 minutes)
# Prints the table (Markdown) and writes it to results/allreduce-links.md; the hosts are removed at the end
# (so it refuses to start while hosts of hosts.sh are up: it would take their addresses and remove them).
# From the repository root, with build/optcc built.
set -euo pipefail
OPTCC=$(readlink -f "${OPTCC:-build/optcc}")
REPS=${REPS:-5}
hosts=slurm/testing/hosts.sh
out=results/allreduce-links.md
[ "$(id -u)" -eq 0 ] || { echo "allreduce_links.sh: the hosts need root. Fix: sudo $0" >&2; exit 1; }
if [ -n "$(ip netns list 2>/dev/null | awk '$1 ~ /-h[0-9]+$/')" ]; then
  echo "allreduce_links.sh: hosts are up ($(ip netns list | awk '{print $1}' | tr '\n' ' ')); this script shapes its own 4 hosts" \
       "on the same addresses and removes them when it ends. Fix: finish with those, then slurm/testing/hosts.sh down" >&2
  exit 1
fi
mkdir -p results
tmp=$(mktemp -d /tmp/optcc-allreduce.XXXXXX)
trap 'bash "$hosts" down >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
cfg=(--config experiments/smoke.yaml --set parallel.dp=4 --set parallel.ranks_per_node=1 --set parallel.timeout_seconds=120)

# condition: name, rate Gbit/s, delay ms, published Gloo ms for 128 and 256 MB (4 nodes)
conditions=("1ms/5Gbps 5 1 485 959" "5ms/2Gbps 2 5 1517 2989" "10ms/1Gbps 1 10 2993 5909")
MAX_REAL_GBIT=${MAX_REAL_GBIT:-2}

# The median of the comm-check lines "all-reduce of S MB ... median X ms" of a log, for size S.
median_ms() { sed -n "s/.*all-reduce of $2 MB .* median \([0-9.]*\) ms.*/\1/p" "$1" | head -1; }

{
  echo "| condition (4 nodes) | size | published Gloo (ms) | emulated links (ms) | α-β ring model (ms) | real shaped links, rate only (ms) | model without the delay (ms) |"
  echo "|---|---|---|---|---|---|---|"
} >"$out"
port=29700
for c in "${conditions[@]}"; do
  read -r name gbit ms pub128 pub256 <<<"$c"
  # Emulated: the condition itself (GB/s = Gbit/s / 8; the delay per ring step).
  gbps=$(awk -v g="$gbit" 'BEGIN{print g / 8}')
  "$OPTCC" comm-check "${cfg[@]}" --nproc 4 --set network.emulate=true --set network.intra_node_gbps=100 \
    --set network.inter_node_gbps="$gbps" --set network.inter_node_latency_us=$((ms * 1000)) \
    --time-allreduce 128,256 --reps "$REPS" >"$tmp/emu-$gbit.log" 2>&1 || { cat "$tmp/emu-$gbit.log" >&2; exit 1; }
  # Real: shaped to the rate (scaled by k when above MAX_REAL_GBIT), payload rate / 0.956 on the wire.
  k=$(awk -v g="$gbit" -v m="$MAX_REAL_GBIT" 'BEGIN{k = 1; while (g / k > m) k++; print k}')
  wire=$(awk -v g="$gbit" -v k="$k" 'BEGIN{printf "%.0f", g / k * 1000 / 0.956}')
  s128=$(awk -v k="$k" 'BEGIN{printf "%.4g", 128 / k}')
  s256=$(awk -v k="$k" 'BEGIN{printf "%.4g", 256 / k}')
  bash "$hosts" up 4 --rate "${wire}mbit" >/dev/null
  port=$((port + 1))
  pids=()
  for n in 0 1 2 3; do
    bash "$hosts" exec $((n + 1)) "$OPTCC" comm-check "${cfg[@]}" --nproc 1 --nnodes 4 --node-rank $n \
      --master 198.18.0.1:$port --time-allreduce "$s128,$s256" --reps "$REPS" >"$tmp/real-$gbit-$n.log" 2>&1 &
    pids+=($!)
  done
  for n in 0 1 2 3; do wait "${pids[$n]}" || { cat "$tmp/real-$gbit-$n.log" >&2; exit 1; }; done
  for size in 128 256; do
    pub=$pub128; [ "$size" = 256 ] && pub=$pub256
    real_size=$(awk -v s="$size" -v k="$k" 'BEGIN{printf "%.4g", s / k}')
    model=$(awk -v s="$size" -v g="$gbit" -v d="$ms" 'BEGIN{printf "%.0f", 6 * d + 1.5 * s * 8 / g}')
    bw_only=$(awk -v s="$size" -v g="$gbit" 'BEGIN{printf "%.0f", 1.5 * s * 8 / g}')
    scaled=""; [ "$k" != 1 ] && scaled=" ($real_size MB at $(awk -v g="$gbit" -v k="$k" 'BEGIN{printf "%.3g", g / k}') Gbit/s)"
    echo "| $name | $size MB | $pub | $(median_ms "$tmp/emu-$gbit.log" "$size") | $model | $(median_ms "$tmp/real-$gbit-0.log" "$real_size")$scaled | $bw_only |" >>"$out"
  done
done
cat "$out"
echo "(medians of $REPS calls after a warm-up, slowest rank per call; model: 2(n-1) = 6 ring steps x delay + 2(n-1)/n x size / rate; written to $out)"
