#!/usr/bin/env python3
"""Real shaped links, the link emulator and the simulator side by side (scripts/run_real_links.sh).

  real_links_table.py --tags a,b --profile PROFILE [--schemes baseline,cb,cb_fe,cb_fe_sc]
                      [--results results] [--dp-rank 16] [--optcc build/optcc] [--json]

Reads results/links-{real,emu}-<scheme>-<tag>.h5 for every tag (one round of runs each, e.g. one
in each order) and prints, per scheme:
  - the median step on the real links and with the emulator, per tag (scripts/emulation_table.py's
    median: steps after the third that neither evaluated nor recorded a timeline);
  - the speed-up over the first scheme, per tag (the noise: the rounds ran in opposite orders);
  - the emulator's and the simulator's error against the real links (their mean over the tags);
    the simulator predicts with PROFILE (`optcc calibrate` of the config at the same network.scale,
    so its links are the ones the hosts were shaped to) and the scheme (cb_fe_sc with PowerSGD
    rank --dp-rank, as the runs had it);
then the Fig. 10 breakdown (ms on the critical-path rank, mean of the timeline steps and tags) of
the real and the emulated runs.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from emulation_table import CATEGORIES, summarise  # noqa: E402
from simulator_validation import predict  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tags", required=True, help="comma-separated run tags, e.g. a,b")
    ap.add_argument("--profile", required=True, help="the hardware profile calibrated at the runs' scale")
    ap.add_argument("--schemes", default="baseline,cb,cb_fe,cb_fe_sc")
    ap.add_argument("--results", default="results")
    ap.add_argument("--config", default="experiments/emulation/mini-3d-paper-regime.yaml")
    ap.add_argument("--vocab", type=int, default=0)
    ap.add_argument("--dp-rank", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--optcc", default="build/optcc")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    tags, schemes = a.tags.split(","), a.schemes.split(",")
    runs = {}
    for mode in ("real", "emu"):
        for s in schemes:
            for t in tags:
                path = os.path.join(a.results, f"links-{mode}-{s}-{t}.h5")
                if not os.path.exists(path):
                    sys.exit(f"real_links_table.py: {path} is missing. Fix: run scripts/run_real_links.sh with TAG={t} "
                             f"(SCHEMES including {s})")
                runs[mode, s, t] = summarise(path, a.warmup)
    sim = {s: predict(a, s)["iteration_s"] for s in schemes}
    rows = []
    for s in schemes:
        r = {"scheme": s, "simulated_s": sim[s]}
        for mode in ("real", "emu"):
            r[mode] = [runs[mode, s, t]["step_s"] for t in tags]
            r[mode + "_speedup"] = [runs[mode, schemes[0], t]["step_s"] / runs[mode, s, t]["step_s"]
                                   for t in tags]
            r[mode + "_breakdown_ms"] = {c: sum(runs[mode, s, t].get(f"{c}_ms", 0.0) for t in tags) / len(tags)
                                         for c in CATEGORIES + ["breakdown_step"]}
        real = sum(r["real"]) / len(tags)
        r["emu_error"] = (sum(r["emu"]) / len(tags) - real) / real
        r["sim_error"] = (sim[s] - real) / real
        rows.append(r)
    base_sim = sim[schemes[0]]
    for r in rows:
        r["sim_speedup"] = base_sim / r["simulated_s"]
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    slash = lambda v, f: " / ".join(f.format(x) for x in v)  # noqa: E731
    print(f"| scheme | real links: step (s), {'/'.join(tags)} | speed-up | emulator: step (s) | speed-up "
          "| emulator error | simulator: step (s) | speed-up | simulator error |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['scheme']} | {slash(r['real'], '{:.3f}')} | {slash(r['real_speedup'], '{:.3f}')} "
              f"| {slash(r['emu'], '{:.3f}')} | {slash(r['emu_speedup'], '{:.3f}')} | {r['emu_error'] * 100:+.1f}% "
              f"| {r['simulated_s']:.3f} | {r['sim_speedup']:.3f} | {r['sim_error'] * 100:+.1f}% |")
    print()
    print("Breakdown (ms on the critical-path rank; mean of the timeline steps of every tag; share of its step):")
    print("| scheme | links | step | " + " | ".join(CATEGORIES) + " |")
    print("|---|---|---|" + "---|" * len(CATEGORIES))
    for r in rows:
        for mode in ("real", "emu"):
            b = r[mode + "_breakdown_ms"]
            step = b["breakdown_step"] or float("nan")
            cells = " | ".join(f"{b[c]:.0f} ({100 * b[c] / step:.0f}%)" for c in CATEGORIES)
            print(f"| {r['scheme']} | {'real' if mode == 'real' else 'emulated'} | {step:.0f} | {cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
