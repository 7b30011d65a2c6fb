#!/usr/bin/env python3
"""Compare runs of the paper's schemes (or any runs) from their optcc results files.

  scheme_table.py RUN.h5 [RUN.h5 ...] [--json]

Runs, not files: every file named is read with the other files of its run in the same folder (a
run stopped and resumed writes <run>.h5, <run>.resumed-S.h5, ...; scripts/optcc_results.py merges
them by step, as the index and `make figures` do), so naming any part of a run, or all of them, gives
one row. One row per run: what it compresses (root attribute compression: `baseline`, a scheme's name
or e.g. `dp=powersgd(rank=4)`; the run's name for files written before optcc recorded it), its status
and last step, final validation loss and perplexity, the perplexity relative to the reference (the
first complete uncompressed run given, listed first; without one the first run, and the table says
so), the bytes ALL ranks sent per training step by traffic class and the step time (the index's
numbers: optcc_results.Run.bytes_per_step and step_time; beside pp_fwd and pp_bwd, their stage-to-stage
wire bytes when the files record them: /traffic's p2p_bytes, which older files such as the committed
table2 runs lack), the largest LEP buffer memory of a rank, and
the mean absolute cosine of the Fig. 11 diagnostic when it was recorded.
A run that is partial, or that ran another number of steps than the reference, is flagged in its
`note` column and below the table: its perplexity is not comparable with the reference's.
Needs h5py, numpy and PyYAML (/usr/bin/python3 on Debian after `make deps`).
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import optcc_results as R  # noqa: E402  (exits with a clear message without h5py/numpy)
import numpy as np  # noqa: E402

CLASSES = R.DATA_CLASSES


def runs_of(paths):
    """[(label, Run)] of the named files, each with the other files of its run, in the order named."""
    groups = {}
    for path in paths:
        if not os.path.isfile(path):
            sys.exit(f"scheme_table.py: {path}: no such file (a run's results are <log.dir>/<run>.h5; the committed "
                     "ones are under results/reference/)")
        folder, parsed = os.path.dirname(path), R.parse_file_name(os.path.basename(path))
        if parsed is None or R.EVAL_FILE.search(path):
            sys.exit(f"scheme_table.py: {path}: not a run's results file (<run>.h5, <run>.resumed-S.h5 or "
                     "<run>.attempt-N.h5)")
        key = (folder, parsed[0])
        if key not in groups:
            groups[key] = sorted(os.path.join(folder or ".", n) for n in os.listdir(folder or ".")
                                 if not R.EVAL_FILE.search(n) and (R.parse_file_name(n) or ("",))[0] == parsed[0])
    out = []
    for (folder, name), files in groups.items():
        for run in R.split_at_config_changes("", name, files):
            out.append((os.path.join(folder, run.name) if folder else run.name, run))
    return out


def summarise(label, run):
    t, final = run.table("train"), run.final_eval()
    if not t or not len(t["step"]) or final is None:
        sys.exit(f"scheme_table.py: {label}: no training step or no evaluation recorded (not an optcc results "
                 "file, or its run stopped before the first evaluation)")
    status, why = run.status()
    row = {"run": label, "files": [f.path for f in run.files],
           "compression": run.compression or os.path.basename(label) + " (compression not recorded)",
           "uncompressed": run.compression == "baseline", "status": status, "status_reason": why,
           "steps": run.last_step, "train_steps": run.train_steps,
           "eval_step": final[0], "val_loss": final[1], "val_ppl": final[2]}
    row["step_seconds"] = run.step_time()[0]
    per_class = run.bytes_per_step()
    for c in CLASSES:
        row[f"{c}_MB_per_step"] = per_class.get(c, 0.0) / 1e6
    for c in R.WIRE_CLASSES:  # the stage-to-stage sends alone, where the file records them
        if R.wire_key(c) in per_class:
            row[f"{c}_wire_MB_per_step"] = per_class[R.wire_key(c)] / 1e6
    mem = run.table("memory_components")
    if mem and len(mem["lep_buffers"]):
        row["lep_bytes_per_rank"] = int(mem["lep_buffers"].max())
    orth = run.table("lep_orthogonality")
    if orth and len(orth["cosine"]):
        row["lep_mean_abs_cos"] = float(np.mean(np.abs(orth["cosine"])))
    return row


def notes_of(row, ref):
    notes = []
    if row["status"] != "complete":
        notes.append(f"{row['status']}: {row['status_reason']}" if row["status_reason"] else row["status"])
    if row is not ref and row["eval_step"] != ref["eval_step"]:
        notes.append(f"evaluated at step {row['eval_step']}, the reference at {ref['eval_step']}: not comparable")
    if len(row["files"]) > 1:
        notes.append(f"{len(row['files'])} files merged")
    return notes


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args()
    rows = [summarise(label, run) for label, run in runs_of(args.files)]
    ref = next((r for r in rows if r["uncompressed"] and r["status"] == "complete"), None)
    note = f"reference: {ref['run']} (uncompressed)" if ref else \
        f"reference: {rows[0]['run']}, the first run (no complete uncompressed run given)"
    ref = ref or rows[0]
    rows.remove(ref)
    rows.insert(0, ref)
    for r in rows:
        r["ppl_vs_reference"] = r["val_ppl"] / ref["val_ppl"] - 1
        r["notes"] = notes_of(r, ref)
    if args.json:
        print(json.dumps({"reference": ref["run"], "note": note, "rows": rows}, indent=2))
        return
    print(note + "\n")
    # beside each pipeline class, its stage-to-stage wire (as the experiments' tables), when a run has it
    wire = [c for c in R.WIRE_CLASSES if any(f"{c}_wire_MB_per_step" in r for r in rows)]
    columns = [k for c in CLASSES for k in ([c, f"{c} wire"] if c in wire else [c])]
    head = ["compression", "run", "steps", "val loss", "val ppl", "ppl vs ref."] + \
        [f"{c} MB/step" for c in columns] + ["LEP B/rank", "mean abs cos (Fig. 11)", "s/step", "note"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        cells = [r["compression"], os.path.basename(r["run"]), f"{r['steps']}/{r['train_steps']}",
                 f"{r['val_loss']:.4f}", f"{r['val_ppl']:.2f}", f"{100 * r['ppl_vs_reference']:+.2f}%"]
        cells += [f"{r[c.replace(' ', '_') + '_MB_per_step']:.3f}" if c.replace(' ', '_') + '_MB_per_step' in r else ""
                  for c in columns]
        cells += [str(r.get("lep_bytes_per_rank", "")),
                  f"{r['lep_mean_abs_cos']:.4f}" if "lep_mean_abs_cos" in r else "",
                  f"{r['step_seconds']:.3f}" if math.isfinite(r["step_seconds"]) else "",
                  "; ".join(r["notes"])]
        print("| " + " | ".join(cells) + " |")
    print("\n- MB/step: bytes all ranks sent per training step, mean over the last 20 recorded steps (DiLoCo: "
          "whole periods); s/step: median step time after step 3 (DiLoCo: mean over whole periods); "
          "the numbers of results/index.csv and `make figures`" +
          ("; pp_fwd/pp_bwd wire: the stage-to-stage sends alone (the class also holds the receiving stage's "
           "uncompressed TP all-gather), what a pipeline codec compresses" if wire else ""))
    flagged = [r for r in rows if any("not comparable" in n or n.startswith("partial") for n in r["notes"])]
    if flagged:
        print("- NOT COMPARABLE with the reference (another step count, or partial): "
              + ", ".join(os.path.basename(r["run"]) for r in flagged))


if __name__ == "__main__":
    main()
