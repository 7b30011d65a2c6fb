#!/usr/bin/env python3
"""Predicted iteration time of each row of an experiment file at one scale: `optcc simulate` (the
discrete-event replay, harness/perfmodel/simulator.h) run on every value of the file's first grid axis
with that value's --set list, as `optcc sweep --json` expands it (seeds left out: they change no time).

  simulate_experiment.py EXPERIMENT [--scale paper] [--profile paper-a100-ib200] [--no-recompute]
                         [--set KEY=VALUE ...] [--optcc build/optcc] [--json]

Prints a Markdown table: row, predicted iteration (s; under compression.dp_strategy diloco the mean over
a period of H iterations, the outer exchanges included), speed-up against the first row, the share of
the iteration in inter-node classes, and the critical rank's milliseconds per class (its plain
iteration's: under DiLoCo its outer exchanges are in the iteration column's period mean, not in the class
columns). Recompute is on by default, as in the paper's runs. --set adds overrides to every row (e.g.
model.vocab_size=N where no tokenizer is prepared). Nothing runs but the model: the numbers hold for the
profile's hardware, not this machine; a GPU profile computes the cpu scale's mini model in about a
millisecond, so for that scale pass --profile a machine profile of your own (`optcc calibrate`). The
inter-node share counts the classes that cross nodes in the profile's placement (dp, embedding, pp,
outer), as `optcc simulate` reports it.
"""
import argparse
import json
import os
import subprocess
import sys

CLASSES = ["compute", "tp", "pp_fwd", "pp_bwd", "dp", "embedding", "compression", "other"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("experiment")
    ap.add_argument("--scale", default="paper")
    ap.add_argument("--profile", default="paper-a100-ib200")
    ap.add_argument("--no-recompute", action="store_true")
    ap.add_argument("--optcc", default=os.environ.get("OPTCC", "build/optcc"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override for every row")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    plan = json.loads(subprocess.run([a.optcc, "sweep", a.experiment, "--scale", a.scale, "--json"], check=True,
                                     capture_output=True, text=True).stdout)
    rows, seen = [], set()
    for run in plan["runs"]:
        value = list(run["axes"].values())[0]
        if value in seen:
            continue
        seen.add(value)
        args = run["args"]
        config = args[args.index("--config") + 1]
        sets = [o for o in run["overrides"] if not o.startswith("train.seed=")]
        cmd = [a.optcc, "simulate", "--config", config, "--profile", a.profile, "--schemes", "config", "--json"]
        cmd += [] if a.no_recompute else ["--recompute"]
        for i, arg in enumerate(args):  # the scale's own --set list, then the row's
            if arg == "--set" and not args[i + 1].startswith(("log.", "checkpoint.", "train.seed=")):
                cmd += ["--set", args[i + 1]]
        for o in a.set:
            cmd += ["--set", o]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"simulate_experiment.py: {value}: {' '.join(cmd)} failed:\n{out.stderr}")
        s = json.loads(out.stdout)["schemes"][0]
        rows.append({"row": value, "sets": sets, "iteration_s": s["iteration_s"],
                     "inter_node_share": s["inter_node_share"],
                     **{f"{c}_ms": 1e3 * s["critical_path_s"].get(c, 0.0) for c in CLASSES}})
    for r in rows:
        r["speedup"] = rows[0]["iteration_s"] / r["iteration_s"]
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"Predicted by `optcc simulate --profile {a.profile}{'' if a.no_recompute else ' --recompute'}` for "
          f"{plan['file']} --scale {a.scale} (scripts/simulate_experiment.py):\n")
    print("| row | iteration (s) | speed-up | inter-node share | " + " | ".join(f"{c} ms" for c in CLASSES) + " |")
    print("|---|---|---|---|" + "---|" * len(CLASSES))
    for r in rows:
        print(f"| {r['row']} | {r['iteration_s']:.3f} | {r['speedup']:.3f} | {100 * r['inter_node_share']:.1f}% | " +
              " | ".join(f"{r[c + '_ms']:.1f}" for c in CLASSES) + " |")


if __name__ == "__main__":
    main()
