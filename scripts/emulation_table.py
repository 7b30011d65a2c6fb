#!/usr/bin/env python3
"""Step times, speed-ups and the Fig. 10 breakdown of emulated runs (scripts/run_emulation.sh).

  emulation_table.py RUN.h5 [RUN.h5 ...] [--warmup N] [--json]

One row per file (put the baseline first): the run (its file's name), the scheme (root attribute compression_scheme; under
DiLoCo with its H), the step time over the steps optcc_results.Run.timed_steps picks after the first N
(default 3): the median over the steps that recorded no timeline, or under DiLoCo the mean over whole
periods of H steps, which holds the outer exchange's step (/train/step_seconds; evaluation runs after a
step and is outside step_seconds), the number of those steps, the speed-up against the first file (its
step time / this one), emulated seconds per step of the inter-node link (/traffic, all ranks), the step split
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
    scheme = run.attr("compression_scheme", "(none)")
    if run.outer_period():
        scheme += f" + diloco H {run.outer_period()}"
    row = {"file": ";".join(f.path for f in run.files), "run": run.name, "scheme": scheme}
    train = run.table("train")
    timed, statistic = run.timed_steps(warmup)
    keep = np.isin(train["step"], timed)
    stat = np.median if statistic == "median" else np.mean
    row["statistic"] = statistic
    row["steps_timed"] = int(keep.sum())
    row["step_s"] = float(stat(train["step_seconds"][keep])) if keep.any() else float("nan")
    tm = run.table("timing")
    rank0 = (tm["rank"] == 0) & np.isin(tm["step"], timed) if tm else np.array([], dtype=bool)
    pipe = tm["pipeline_seconds"][rank0] if tm else np.array([])
    row["pipeline_s"] = float(stat(pipe)) if len(pipe) else float("nan")
    row["after_pipeline_s"] = float(stat(tm["step_seconds"][rank0] - pipe)) if len(pipe) else float("nan")
    t = run.table("traffic")
    inter = (t["link"] == 1) & np.isin(t["step"], timed) if t else np.array([], dtype=bool)
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
    base, p0, a0 = rows[0]["step_s"], rows[0]["pipeline_s"], rows[0]["after_pipeline_s"]
    for r in rows:
        r["speedup"] = base / r["step_s"]
        r["speedup_equal_compute"] = (p0 + a0) / (p0 + r["after_pipeline_s"])
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    print("| run | scheme | step (s) | over steps | speed-up | pipeline (s) | after pipeline (s) "
          "| speed-up at equal compute | inter-node emulated s/step (all ranks) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['run']} | {r['scheme']} | {r['step_s']:.3f} | {r['steps_timed']} ({r['statistic']}) | {r['speedup']:.3f} "
              f"| {r['pipeline_s']:.3f} | {r['after_pipeline_s']:.3f} | {r['speedup_equal_compute']:.3f} "
              f"| {r['inter_emulated_s_per_step']:.3f} |")
    print()
    print("Breakdown (mean of the timeline steps, ms on the critical-path rank; share of its step):")
    print("| run | step | " + " | ".join(CATEGORIES) + " |")
    print("|---|---|" + "---|" * len(CATEGORIES))
    for r in rows:
        if "breakdown_step_ms" not in r:
            continue
        total = r["breakdown_step_ms"]
        cells = [f"{r[c + '_ms']:.0f} ({100 * r[c + '_ms'] / total:.0f}%)" for c in CATEGORIES]
        print(f"| {r['run']} | {total:.0f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
