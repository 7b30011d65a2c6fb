#!/usr/bin/env python3
"""Compare runs of the paper's schemes (or any runs) from their optcc results files.

  scheme_table.py RUN.h5 [RUN.h5 ...] [--json]

One row per file: the run (what it compresses, root attribute compression: `baseline`, a scheme's
name or e.g. `dp=powersgd(rank=4)`; the file name for files written before optcc recorded it),
steps, final validation loss and perplexity, the perplexity relative to the reference (the first
uncompressed run given, listed first; without one the first file, and the table says so), the
bytes ALL ranks sent per training step by traffic class (mean over the
steps after the first; evaluation is not counted), the largest LEP buffer memory of a rank, the
mean absolute cosine of the Fig. 11 diagnostic when it was recorded, and the mean step time (s).
Reads through scripts/optcc_results.py. Needs h5py, numpy and PyYAML (/usr/bin/python3 on Debian
after `make deps`).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import optcc_results as R  # noqa: E402  (exits with a clear message without h5py/numpy)
import numpy as np  # noqa: E402

CLASSES = R.DATA_CLASSES


def summarise(path):
    if not os.path.isfile(path):
        sys.exit(f"scheme_table.py: {path}: no such file (a run's results are <log.dir>/<run>.h5; the committed "
                 "ones are under results/reference/)")
    run = R.Run.from_paths([path])
    if not run.table("train") or not len(run.table("train")["step"]) or not run.table("eval"):
        sys.exit(f"scheme_table.py: {path}: no training step or no evaluation recorded (not an optcc results "
                 "file, or its run stopped before the first evaluation)")
    label = run.compression or path.rsplit("/", 1)[-1].removesuffix(".h5") + " (compression not recorded)"
    row = {"file": path, "compression": label, "uncompressed": run.compression == "baseline"}
    train, ev = run.table("train"), run.table("eval")
    steps = train["step"]
    row["steps"] = int(steps[-1]) if len(steps) else 0
    row["val_loss"] = float(ev["loss"][-1])
    row["val_ppl"] = float(ev["ppl"][-1])
    row["step_seconds"] = float(np.mean(train["step_seconds"][1:])) if len(steps) > 1 else float("nan")
    t = run.table("traffic")
    tstep, tcls, tbytes = t["step"], t["class"], t["bytes"]
    # Steps after the first; also leave out the step after each evaluation (files written
    # before evaluation traffic was excluded from /traffic counted it there).
    later = (tstep > 1) & ~np.isin(tstep, ev["step"] + 1)
    n = max(1, len(np.unique(tstep[later])))
    for c in CLASSES:  # by the class's number in /traffic
        row[f"{c}_MB_per_step"] = float(tbytes[later & (tcls == R.TRAFFIC_CLASSES.index(c))].sum()) / n / 1e6
    mem = run.table("memory_components")
    if mem:
        row["lep_bytes_per_rank"] = int(mem["lep_buffers"].max()) if len(mem["lep_buffers"]) else 0
    orth = run.table("lep_orthogonality")
    if orth and len(orth["cosine"]):
        row["lep_mean_abs_cos"] = float(np.mean(np.abs(orth["cosine"])))
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args()
    rows = [summarise(p) for p in args.files]
    ref = next((r for r in rows if r["uncompressed"]), None)
    note = f"reference: {ref['file']} (uncompressed)" if ref else \
        f"reference: {rows[0]['file']}, the first file (no uncompressed run given)"
    ref = ref or rows[0]
    rows.remove(ref)
    rows.insert(0, ref)
    for r in rows:
        r["ppl_vs_reference"] = r["val_ppl"] / ref["val_ppl"] - 1
    if args.json:
        print(json.dumps({"reference": ref["file"], "note": note, "rows": rows}, indent=2))
        return
    print(note + "\n")
    head = ["compression", "steps", "val loss", "val ppl", "ppl vs ref."] + [f"{c} MB/step" for c in CLASSES] + \
           ["LEP B/rank", "mean abs cos (Fig. 11)", "s/step"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        cells = [r["compression"], str(r["steps"]), f"{r['val_loss']:.4f}", f"{r['val_ppl']:.2f}",
                 f"{100 * r['ppl_vs_reference']:+.2f}%"]
        cells += [f"{r[c + '_MB_per_step']:.3f}" for c in CLASSES]
        cells += [str(r.get("lep_bytes_per_rank", "")),
                  f"{r['lep_mean_abs_cos']:.4f}" if "lep_mean_abs_cos" in r else "",
                  f"{r['step_seconds']:.3f}"]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
