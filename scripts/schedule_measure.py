#!/usr/bin/env python3
"""Per pipeline stage, what a run's schedule cost: the measured bubble and the activation peak.

    scripts/schedule_measure.py RUN.h5 [RUN.h5 ...] [--warmup 3]

For each results file (optcc train; its config names the schedule), per stage (the ranks of a stage
averaged; stage = rank // (tp·dp), harness/parallel/layout.h) over the steps after --warmup:
  bubble      1 − pipeline_compute_seconds / pipeline_seconds (/timing: the share of the rank's
              pipeline schedule spent in calls, i.e. waiting for peers and transferring), median
  activations the peak of activations_peak (/memory_components: tracked tensor memory during the
              schedule above what it held when the schedule started), MB
and the run's median step time (/train). On a machine with fewer cores than ranks a waiting rank
lends its core to the others, so the bubble measured there is not the schedule's alone.
Needs h5py, numpy, PyYAML (/usr/bin/python3 on Debian).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import optcc_results as R  # noqa: E402
import numpy as np  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--warmup", type=int, default=3, help="steps left out at the start (default 3)")
    args = ap.parse_args()
    for path in args.files:
        run = R.Run.from_paths([path])
        tm = run.table("timing", since=args.warmup + 1)
        mem = run.table("memory_components", since=args.warmup + 1)
        if not tm or "pipeline_compute_seconds" not in tm:
            print(f"{path}: no /timing pipeline_compute_seconds (written before 2026-12-08?)")
            continue
        per_stage = int(run.cfg("parallel", "tp", 1)) * int(run.cfg("parallel", "dp", 1))
        pp = int(run.cfg("parallel", "pp", 1))
        schedule = run.cfg("parallel", "schedule", "1f1b")
        v = int(run.cfg("parallel", "virtual_stages", 1))
        m = int(run.cfg("train", "global_batch_size", 0)) // (int(run.cfg("train", "micro_batch_size", 1)) *
                                                              int(run.cfg("parallel", "dp", 1)))
        label = f"{schedule} (v={v})" if v > 1 else schedule
        print(f"{os.path.basename(path)}: {label}, pp {pp}, m {m}, median step {run.step_time(args.warmup)[0]:.3f} s")
        stage_t = np.asarray(tm["rank"]) // per_stage
        stage_m = np.asarray(mem["rank"]) // per_stage
        with np.errstate(invalid="ignore", divide="ignore"):
            bubble = 1.0 - np.asarray(tm["pipeline_compute_seconds"]) / np.asarray(tm["pipeline_seconds"])
        for k in range(pp):
            b = float(np.median(bubble[stage_t == k])) if (stage_t == k).any() else float("nan")
            a = float(np.max(np.asarray(mem["activations_peak"])[stage_m == k])) / 1e6 if (stage_m == k).any() else float("nan")
            print(f"  stage {k}: bubble {b * 100:5.1f}%  activations {a:8.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
