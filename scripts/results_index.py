#!/usr/bin/env python3
"""Rebuild DIR/index.csv (default results/index.csv): one row per run found in DIR/**/*.h5.

  results_index.py [--results DIR] [--print]

A run's files (RUN.h5, RUN.resumed-STEP.h5, RUN.attempt-N.h5) are merged by step, the newest file
winning (scripts/optcc_results.py explains the merge and the statuses). Columns:
  experiment         folder of the run relative to DIR ("" for files directly in DIR)
  run                run name (log.run_name)
  status             complete | partial | failed (optcc_results.py: what each means)
  last_step          last training step on disk;  train_steps: the config's train.train_steps
  final_valid_loss   last /eval row (nats), its ppl and its step
  final_valid_ppl, eval_step
  compression        what the run compresses (root attribute compression: baseline, a scheme's
                     name, or e.g. dp=powersgd(rank=4); "" in files written before it was recorded)
  scheme, seed, layout      compression_scheme, train.seed, "tp=.. pp=.. dp=.."
  step_seconds       median over the steps after the third (timeline steps left out; DiLoCo:
                     mean over the whole periods after the third step, outer exchange included);
  tokens_per_second  the same for tokens/s
  bytes_per_step     bytes all ranks sent per training step (tp, pp, dp, embedding, outer; not
                     control), mean of the last 20 steps (DiLoCo: of the last whole periods)
  config_hash        sha256 (12 hex) of the stored config attribute
  configuration      sha256 (12 hex) of the config without train.seed, log.run_name/dir/level and
                     checkpoint.dir: runs with equal values are seeds of one configuration
  git_revision, start_time  of the newest file
  files              the run's files (relative to DIR), oldest first, ';'-separated
  note               why a run failed or is partial, unreadable files
Floats are written with repr() (they read back exactly). The file is replaced atomically (written
to a temporary file in DIR, then renamed), so a reader never sees half an index.
"""
import argparse
import csv
import io
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import optcc_results as R  # noqa: E402

COLUMNS = ["experiment", "run", "status", "last_step", "train_steps", "final_valid_loss", "final_valid_ppl",
           "eval_step", "compression", "scheme", "seed", "layout", "step_seconds", "tokens_per_second", "bytes_per_step",
           "config_hash", "configuration", "git_revision", "start_time", "files", "note"]


def number(x):
    return "" if x is None or x != x else repr(float(x))


def index_row(run, results_dir):
    status, reason = run.status()
    row = {"experiment": run.experiment, "run": run.name, "status": status, "last_step": run.last_step,
           "train_steps": run.train_steps if run.config else "", "compression": run.compression if run.files else "",
           "scheme": run.attr("compression_scheme"),
           "seed": run.seed if run.config else "", "layout": run.attr("layout"),
           "config_hash": run.config_hash() if run.files else "",
           "configuration": run.configuration_hash() if run.config else "",
           "git_revision": run.attr("git_revision"), "start_time": run.attr("start_time")}
    final = run.final_eval() if run.files else None
    row["eval_step"], row["final_valid_loss"], row["final_valid_ppl"] = \
        (final[0], number(final[1]), number(final[2])) if final else ("", "", "")
    seconds, tokens = run.step_time() if run.files else (None, None)
    row["step_seconds"], row["tokens_per_second"] = number(seconds), number(tokens)
    sent = run.bytes_per_step() if run.files else {}
    row["bytes_per_step"] = number(sum(sent[c] for c in R.DATA_CLASSES)) if sent else ""
    row["files"] = ";".join(os.path.relpath(f.path, results_dir) for f in run.files)
    notes = [reason] if reason else []
    notes += [f"unreadable {os.path.relpath(p, results_dir)}: {why}" for p, why in run.unreadable]
    row["note"] = "; ".join(notes)
    return row


def build_index(results_dir):
    """The index rows of every run under results_dir, sorted by (experiment, run)."""
    return [index_row(run, results_dir) for run in R.load_runs(results_dir)]


def write_atomic(path, content):
    """Writes `content` to `path` through a temporary file in the same folder and a rename."""
    fd, tmp = tempfile.mkstemp(prefix=".index-", suffix=".tmp", dir=os.path.dirname(path) or ".")
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(content)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def to_csv(rows):
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return out.getvalue()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default="results", help="results folder (default results/)")
    ap.add_argument("--print", action="store_true", help="also print the index")
    args = ap.parse_args()
    if not os.path.isdir(args.results):
        sys.exit(f"results_index.py: --results {args.results}: no such folder (runs write "
                 "results/<experiment>/<run>.h5; pass the folder that holds them)")
    rows = build_index(args.results)
    content = to_csv(rows)
    path = os.path.join(args.results, "index.csv")
    old = None
    if os.path.exists(path):
        with open(path, newline="") as f:
            old = f.read()
    if old != content:  # like the figures: an unchanged index is not rewritten
        write_atomic(path, content)
    counts = {s: sum(r["status"] == s for r in rows) for s in R.STATUSES}
    print(f"{path}: {len(rows)} runs ({', '.join(f'{n} {s}' for s, n in counts.items())})")
    if args.print:
        sys.stdout.write(content)


if __name__ == "__main__":
    main()
