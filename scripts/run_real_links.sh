#!/usr/bin/env bash
# Real shaped links against the link emulator and the simulator (docs/emulation.md, "Real links").
# The emulation experiment (experiments/emulation/mini-3d-paper-regime.yaml: mini, TP2 x PP2 x DP2,
# 2 ranks per node) runs each scheme twice:
#   real  on 4 hosts of slurm/testing/hosts.sh (network namespaces, 2 ranks each, so TP stays inside
#         a host and PP, DP and the embedding sync cross the shaped links), network.emulate: false;
#   emu   on this (root) namespace, 8 local ranks, the link emulator declaring the same links.
# Both at network.scale SCALE: the paper profile's 25 GB/s per node becomes 25e9 / SCALE bytes/s, the
# rate the hosts' links are shaped to. tbf counts whole frames, and TCP over IPv4 carries 1448 payload
# bytes in a 1514-byte frame (0.956), so the links are shaped at the payload rate / 0.956: what the
# emulator charges for (payload bytes / bandwidth) is what the real links then deliver.
# Latency is not shaped (this kernel has no netem); the emulator declares the profile's latency /
# SCALE (well under a microsecond), the veth links add their own few tens of microseconds.
#
#   sudo TAG=a scripts/run_real_links.sh [SCALE]      (default 200: 1 Gbit/s of payload per host)
# From the repository root, with build/optcc built and the corpus prepared (`make data`). TAG is
# required (the table reads results by tag); sudo keeps only the variables named before the script.
# SCALE "auto" derives it as the config's network.match_regime does at a run's start (optcc calibrate,
# then optcc simulate --match-regime: the same code) and stops when the links that asks for are
# faster than this machine's veth links carry (`hosts.sh check` at that rate): on a fast CPU the
# paper's share of inter-node time needs fast links, and a shaper that cannot reach its rate would
# turn the comparison into one against the machine's packet processing. Then give a larger SCALE
# (slower links: a larger inter-node share than the paper's, the same for all three).
#   env: TAG (the round's name, the files' suffix, e.g. a; required), SCHEMES (default "baseline cb
#        cb_fe cb_fe_sc"; speed-ups are against the first), MODES (default "real emu": which of the two
#        run, in that order for each scheme), DP_RANK (PowerSGD rank of cb_fe_sc, default 16 as in
#        scripts/run_emulation.sh), OPTCC, THREADS (per rank; default the cores / 8, at least 1, the
#        same in both modes: the real hosts' launchers each see 2 local ranks and would take more).
# Results: results/links-<mode>-<scheme>-TAG.h5. At the end it prints the commands of the table:
# `optcc calibrate` at this scale (the simulator's profile, its links the ones the hosts carry), then
# scripts/real_links_table.py --tags TAG[,TAG2...] --profile that file (real, emulated and simulated
# side by side, every round given).
# The hosts stay up afterwards (their `list` shows the shaping); `slurm/testing/hosts.sh down` removes them.
set -euo pipefail
scale=${1:-200}
config=experiments/emulation/mini-3d-paper-regime.yaml
OPTCC=$(readlink -f "${OPTCC:-build/optcc}")
DP_RANK=${DP_RANK:-16}
SCHEMES=${SCHEMES:-"baseline cb cb_fe cb_fe_sc"}
MODES=${MODES:-"real emu"}
hosts=slurm/testing/hosts.sh
[ "$(id -u)" -eq 0 ] || { echo "run_real_links.sh: the hosts need root (namespaces, links, qdiscs). Fix: sudo TAG=${TAG:-a} ${SCHEMES:+SCHEMES=\"$SCHEMES\" }$0 $*" >&2; exit 1; }
[ -n "${TAG:-}" ] || { echo "run_real_links.sh: TAG is not set: each round's files are named by it (results/links-<mode>-<scheme>-TAG.h5) and the table reads them by tag. Fix: e.g. sudo TAG=a $0 $*" >&2; exit 1; }
[ -x "$OPTCC" ] || { echo "run_real_links.sh: OPTCC=$OPTCC is not an executable. Fix: build it (make build) and run from the repository root" >&2; exit 1; }
THREADS=${THREADS:-$(( $(nproc) / 8 > 0 ? $(nproc) / 8 : 1 ))}
if [ "$scale" = auto ]; then
  regime=$(awk '/^  match_regime:/{print $2; exit}' "$config")
  [ -n "$regime" ] || { echo "run_real_links.sh: SCALE auto needs network.match_regime in $config" >&2; exit 1; }
  "$OPTCC" calibrate --config "$config" --set network.match_regime= -o /tmp/optcc-links-machine.yaml >/dev/null
  scale=$("$OPTCC" simulate --config "$config" --set network.match_regime= --match-regime "$regime" \
            --profile "$(awk '/^  profile:/{print $2; exit}' "$config")" --machine-profile /tmp/optcc-links-machine.yaml |
          awk '/^  scale:/{print $2; exit}')
  echo "== SCALE auto: $scale (the regime of $regime on this machine's calibrated compute)"
fi
[[ "$scale" =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "run_real_links.sh: SCALE '$scale' is not a positive number. Fix: e.g. 200" >&2; exit 1; }

# The links of the config's profile, as optcc resolves it (its built-in numbers: one source of truth).
profile=$(awk '/^network:/{n=1} n && /^  profile:/{print $2; exit}' "$config")
tmp_cfg=$(mktemp /tmp/optcc-links.XXXXXX.yaml)
printf 'network:\n  profile: %s\n' "$profile" >"$tmp_cfg"
net=$("$OPTCC" config show --config "$tmp_cfg")
rm -f "$tmp_cfg"
field() { echo "$net" | awk -v k="$1:" '$1 == k {print $2; exit}'; }
inter_gbps=$(field inter_node_gbps)
payload_bps=$(awk -v g="$inter_gbps" -v s="$scale" 'BEGIN{printf "%.0f", g * 8e9 / s}')
wire_mbit=$(awk -v b="$payload_bps" 'BEGIN{printf "%.0f", b / 0.956 / 1e6}')
lat_inter=$(awk -v l="$(field inter_node_latency_us)" -v s="$scale" 'BEGIN{printf "%.4g", l / s}')
lat_intra=$(awk -v l="$(field intra_node_latency_us)" -v s="$scale" 'BEGIN{printf "%.4g", l / s}')
links=(--set network.match_regime= --set network.scale="$scale" --set network.inter_node_latency_us="$lat_inter"
       --set network.intra_node_latency_us="$lat_intra")
echo "== $profile at scale $scale: $(awk -v b="$payload_bps" 'BEGIN{printf "%.1f", b / 8e6}') MB/s of payload per node; hosts shaped at ${wire_mbit}mbit"

if [[ " $MODES " == *" real "* ]]; then
  bash "$hosts" up 4 --rate "${wire_mbit}mbit"
  bash "$hosts" check --mbytes 100 || {
    echo "run_real_links.sh: the hosts' links do not carry ${wire_mbit}mbit on this machine (above). Fix: a larger SCALE (slower links), e.g. $(awk -v s="$scale" 'BEGIN{printf "%.0f", s * 2}')" >&2
    exit 1
  }
fi

port=29600
for scheme in $SCHEMES; do
  extra=()
  if [[ $scheme == cb_fe_sc ]]; then
    extra=(--set "compression.dp={name: powersgd, rank: ${DP_RANK}, error_feedback: true, warmup_steps: 0}")
  fi
  for mode in $MODES; do
    run="links-${mode}-${scheme}-${TAG}"
    echo "== ${mode} ${scheme} -> results/${run}.h5 (load: $(cut -d' ' -f1-3 /proc/loadavg))"
    common=(--config "$config" --set compression.scheme="$scheme" "${extra[@]}" "${links[@]}"
            --set log.run_name="$run" --set log.dir="$PWD/results" --set train.threads="$THREADS")
    if [ "$mode" = real ]; then
      port=$((port + 1))
      pids=()
      for k in 0 1 2 3; do
        bash "$hosts" exec $((k + 1)) "$OPTCC" train "${common[@]}" --set network.emulate=false \
          --nproc 2 --nnodes 4 --node-rank $k --master 198.18.0.1:$port >"results/${run}.node$k.log" 2>&1 &
        pids+=($!)
      done
      for k in 0 1 2 3; do wait "${pids[$k]}" || { tail -20 "results/${run}.node$k.log" >&2; exit 1; }; done
      grep -h "final\|median" "results/${run}.node0.log" | tail -2 || true
    else
      "$OPTCC" train "${common[@]}" --nproc 8 > "results/${run}.log" 2>&1 || { tail -20 "results/${run}.log" >&2; exit 1; }
    fi
  done
done
echo "== done. The table (the simulator's profile calibrated at this scale; list every round's tag):"
echo "  $OPTCC calibrate --config $config ${links[*]} -o /tmp/at-$scale.yaml"
echo "  /usr/bin/python3 scripts/real_links_table.py --tags $TAG --profile /tmp/at-$scale.yaml"
