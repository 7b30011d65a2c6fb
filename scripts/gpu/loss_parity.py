#!/usr/bin/env python3
"""The training loss of every step in two optcc results files, side by side: the largest relative
difference |b - a| / |a| over the steps both files hold, and the step where it is.

Usage: loss_parity.py A.h5 B.h5 [--steps N] [--tolerance T]
  A: the reference run (1 rank), B: the run compared with it (2 ranks). Reads /train/step and
  /train/loss (float64, as the trainer records them; harness/train/run_records.cpp). Prints one line per
  step, then a summary line. Exit 1 when a file lacks steps 1..N, a loss is not finite, or the
  largest relative difference is above T (default 1e-3); 0 otherwise.
Needs h5py and numpy.
"""
import argparse
import math
import sys

import h5py


def losses(path):
    with h5py.File(path, "r") as f:
        if "train" not in f or "loss" not in f["train"] or "step" not in f["train"]:
            sys.exit(f"loss_parity.py: {path} has no /train/step and /train/loss")
        g = f["train"]
        n = min(g["step"].shape[0], g["loss"].shape[0])
        return {int(s): float(l) for s, l in zip(g["step"][:n], g["loss"][:n])}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--steps", type=int, default=0, help="both files must hold steps 1..N (0: no check)")
    ap.add_argument("--tolerance", type=float, default=1e-3)
    args = ap.parse_args()
    a, b = losses(args.a), losses(args.b)
    common = sorted(set(a) & set(b))
    missing = [s for s in range(1, args.steps + 1) if s not in a or s not in b]
    worst, worst_step, ok = 0.0, None, True
    print("step  loss_a  loss_b  rel_diff")
    for s in common:
        if not (math.isfinite(a[s]) and math.isfinite(b[s])):
            ok = False
            print(f"{s} {a[s]} {b[s]} not finite")
            continue
        rel = abs(b[s] - a[s]) / max(abs(a[s]), 1e-30)
        if rel > worst:
            worst, worst_step = rel, s
        print(f"{s} {a[s]:.7f} {b[s]:.7f} {rel:.3e}")
    if missing:
        ok = False
    ok = ok and bool(common) and worst <= args.tolerance
    where = (f" at step {worst_step} (loss {a[worst_step]:.7f} vs {b[worst_step]:.7f})" if worst_step is not None
             else " (every step's loss bit-identical)" if common else "")
    print(f"{len(common)} steps; max relative difference {worst:.3e}{where};"
          f" tolerance {args.tolerance:g}{'; MISSING steps ' + str(missing[:5]) if missing else ''}"
          f"{'' if ok else ' -> FAILED'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
