#!/usr/bin/env python3
"""Step times, speed-ups and the Fig. 10 breakdown of emulated runs (scripts/run_emulation.sh).

  emulation_table.py RUN.h5 [RUN.h5 ...] [--warmup N] [--json]

One row per file (put the baseline first): the scheme (root attribute compression_scheme), the
median step time over the steps after the first N (default 3) that neither evaluated nor recorded
a timeline (/train/step_seconds; evaluation runs after a step but is outside step_seconds anyway),
the number of steps in that median, the speed-up against the first file (its median / this
median), emulated seconds per step of the inter-node link (/traffic, all ranks), the step split
into rank 0's pipeline schedule (forward/backward and p2p: compute-dominated) and what follows it
(DP, embedding sync, optimizer: where FE and SC act), and the mean /breakdown of the recorded
timeline steps (ms on the critical-path rank, harness/train/breakdown.h).
On a machine shared with other work the compute part drifts with the load between runs; the
column "speed-up at equal compute" removes that drift: (P0 + A0) / (P0 + A), with P0, A0 the
first file's medians of pipeline and after-pipeline time and A this file's. It assumes the
scheme leaves the pipeline phase alone, true for FE and SC; CB changes it by its epilogue
messages only (measure those with the breakdown).
Reads through scripts/optcc_results.py (scripts/figures/timing.py imports summarise_run for Fig. 10).
Needs h5py, numpy and PyYAML (/usr/bin/python3 on Debian after `make deps`).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import optcc_results as R  # noqa: E402  (exits with a clear message without h5py/numpy)
import numpy as np  # noqa: E402

CATEGORIES = ["compute", "tp", "pp_fwd", "pp_bwd", "dp", "embedding", "compression", "other", "idle"]


def summarise_run(run, warmup):
    """The row of one run (optcc_results.Run: its files merged), as documented at the top."""
    row = {"file": ";".join(f.path for f in run.files), "scheme": run.attr("compression_scheme", "(none)")}
    train = run.table("train")
    steps, seconds = train["step"], train["step_seconds"]
    recorded = run.table("breakdown").get("step", np.array([], dtype=np.int64))
    keep = (steps > warmup) & ~np.isin(steps, recorded)
    row["steps_in_median"] = int(keep.sum())
    row["median_step_s"] = float(np.median(seconds[keep])) if keep.any() else float("nan")
    tm = run.table("timing")
    rank0 = (tm["rank"] == 0) & np.isin(tm["step"], steps[keep]) if tm else np.array([], dtype=bool)
    pipe = tm["pipeline_seconds"][rank0] if tm else np.array([])
    row["pipeline_s"] = float(np.median(pipe)) if len(pipe) else float("nan")
    row["after_pipeline_s"] = float(np.median(tm["step_seconds"][rank0] - pipe)) if len(pipe) else float("nan")
    t = run.table("traffic")
    inter = (t["link"] == 1) & np.isin(t["step"], steps[keep]) if t else np.array([], dtype=bool)
    emulated = float(t["emulated_seconds"][inter].sum()) if t else 0.0
    row["inter_emulated_s_per_step"] = emulated / max(1, keep.sum())
    b = run.table("breakdown")
    if b and len(b["step"]):
        row["breakdown_step_ms"] = float(np.mean(b["step_us"])) / 1e3
        for c in CATEGORIES:
            row[f"{c}_ms"] = float(np.mean(b[f"{c}_us"])) / 1e3
    return row


def summarise(path, warmup):
    return summarise_run(R.Run.from_paths([path]), warmup)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--warmup", type=int, default=3, help="steps left out at the start (default 3)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = [summarise(p, a.warmup) for p in a.files]
    base, p0, a0 = rows[0]["median_step_s"], rows[0]["pipeline_s"], rows[0]["after_pipeline_s"]
    for r in rows:
        r["speedup"] = base / r["median_step_s"]
        r["speedup_equal_compute"] = (p0 + a0) / (p0 + r["after_pipeline_s"])
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    print("| scheme | median step (s) | steps | speed-up | pipeline (s) | after pipeline (s) "
          "| speed-up at equal compute | inter-node emulated s/step (all ranks) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['scheme']} | {r['median_step_s']:.3f} | {r['steps_in_median']} | {r['speedup']:.3f} "
              f"| {r['pipeline_s']:.3f} | {r['after_pipeline_s']:.3f} | {r['speedup_equal_compute']:.3f} "
              f"| {r['inter_emulated_s_per_step']:.3f} |")
    print()
    print("Breakdown (mean of the timeline steps, ms on the critical-path rank; share of its step):")
    print("| scheme | step | " + " | ".join(CATEGORIES) + " |")
    print("|---|---|" + "---|" * len(CATEGORIES))
    for r in rows:
        if "breakdown_step_ms" not in r:
            continue
        total = r["breakdown_step_ms"]
        cells = [f"{r[c + '_ms']:.0f} ({100 * r[c + '_ms'] / total:.0f}%)" for c in CATEGORIES]
        print(f"| {r['scheme']} | {total:.0f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
