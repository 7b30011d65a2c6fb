#!/usr/bin/env python3
"""Summarise an optcc results file (harness/records/metrics.h), also while its run is still writing it.

  h5summary.py RUN.h5                      the result first, in a few lines: the run, what it compresses,
                                           its final validation loss and ppl, tokens/s, bytes per step
  h5summary.py RUN.h5 --full               root attributes, then every series group: rows, unit, last values
  h5summary.py RUN.h5 --series train/loss  one series, a row per line (with its group's step when it has one)
  h5summary.py RUN.h5 --series train       the whole table, tab-separated, one column per dataset

The file is opened with swmr=True, which reads a live run, a finished run and a run killed in the middle
of a flush alike; a plain h5py.File(path, "r") also works for finished and killed runs (a writer
killed inside a flush leaves a flag that open_results clears: docs/results.md, "Your own reader").
Needs h5py and numpy (Debian: apt install python3-h5py); run with /usr/bin/python3 if the python3 on
PATH (pyenv, venv) lacks them.
"""
import argparse
import sys

try:
    import h5py
    import numpy as np
except ImportError as e:
    sys.exit(f"h5summary.py: {e}; install h5py (apt install python3-h5py) or run with /usr/bin/python3")
from optcc_results import open_results  # noqa: E402  (beside this script)


def text(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray) and value.ndim > 0:
        return ", ".join(text(v) for v in value.tolist())
    return str(value)


def fmt(x, exact=False):
    if isinstance(x, (float, np.floating)):
        return repr(float(x)) if exact else f"{x:.6g}"
    return str(x)


def print_root(f, lines):
    print(f"{f.filename}")
    for name in sorted(f.attrs):
        value = text(f.attrs[name]).rstrip("\n")
        rows = value.split("\n")
        if len(rows) == 1:
            print(f"  @{name}: {value}")
            continue
        print(f"  @{name}: ({len(rows)} lines, {len(value)} chars)")
        for row in rows[:lines]:
            print(f"    | {row}")
        if len(rows) > lines:
            print(f"    | ... {len(rows) - lines} more lines")


def column_order(group):
    """Dataset names of a group in TableSpec order (the `columns` attribute), then any others."""
    names = [n for n in group if isinstance(group[n], h5py.Dataset)]
    listed = text(group.attrs["columns"]).split(",") if "columns" in group.attrs else []
    return [n for n in listed if n in names] + sorted(n for n in names if n not in listed)


def series_groups(f):
    found = []

    def visit(name, obj):
        if isinstance(obj, h5py.Group) and column_order(obj):
            found.append(name)

    f.visititems(visit)
    return sorted(found)


def print_groups(f, last):
    for name in series_groups(f):
        group = f[name]
        columns = column_order(group)
        lengths = {len(group[c]) for c in columns}
        rows = max(lengths)
        note = "" if len(lengths) == 1 else f", column lengths differ: {sorted(lengths)}"
        print(f"/{name}  ({rows} rows{note})")
        width = max(len(c) for c in columns)
        for c in columns:
            ds = group[c]
            unit = f"[{text(ds.attrs['unit'])}]" if text(ds.attrs.get("unit", "")) else ""
            tail = " ".join(fmt(v) for v in ds[max(0, len(ds) - last):].tolist())
            print(f"  {c:<{width}}  {str(ds.dtype):<7}  {unit:<8}  last: {tail}")


def print_series(f, path):
    if path not in f:
        sys.exit(f"h5summary.py: no '{path}' in {f.filename}; series groups: {', '.join(series_groups(f))}")
    obj = f[path]
    if isinstance(obj, h5py.Group):
        columns = column_order(obj)
    else:
        obj, columns = obj.parent, [obj.name.rsplit("/", 1)[1]]
        if "step" in obj and columns != ["step"]:
            columns = ["step"] + columns
    data = [obj[c][:] for c in columns]
    print("\t".join(columns))
    for row in zip(*data):
        print("\t".join(fmt(v, exact=True) for v in row))


TRAFFIC_CLASSES = ["tp", "pp_fwd", "pp_bwd", "dp", "embedding", "control", "outer"]  # /traffic class numbers (communicator.h)
LINKS = ["intra", "inter"]


def print_traffic(f):
    """Bytes of the last step per traffic class and link, per rank and in total (MB)."""
    if "traffic" not in f or f["traffic/step"].shape[0] == 0:
        return
    t = {k: f["traffic"][k][:] for k in ("step", "rank", "class", "link", "bytes")}
    last = t["step"].max()
    sel = t["step"] == last
    ranks = sorted(set(int(r) for r in t["rank"][sel]))
    print(f"traffic of step {last} (MB sent, by class/link):")
    keys = sorted(set((int(c), int(l)) for c, l in zip(t["class"][sel], t["link"][sel])))
    header = "  rank " + " ".join(f"{TRAFFIC_CLASSES[c] + '/' + LINKS[l]:>16}" for c, l in keys)
    print(header)
    totals = {k: 0 for k in keys}
    for r in ranks:
        row = []
        for c, l in keys:
            m = sel & (t["rank"] == r) & (t["class"] == c) & (t["link"] == l)
            b = int(t["bytes"][m].sum())
            totals[(c, l)] += b
            row.append(f"{b / 1e6:16.3f}")
        print(f"  {r:>4} " + " ".join(row))
    print("   all " + " ".join(f"{totals[k] / 1e6:16.3f}" for k in keys))


def print_short(path):
    """The run's result in a few lines (scripts/optcc_results.py reads it as the figures do)."""
    import os
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import optcc_results as R
    run = R.Run.from_paths([path])
    status, why = run.status()
    print(f"{path}: run {run.name}, {status}" + (f" ({why})" if why else f" at step {run.last_step}"))
    print(f"  compresses: {run.compression or run.scheme + ' (scheme; compression not recorded)'}; "
          f"layout {run.attr('layout', '?')}")
    final = run.final_eval()
    if final:
        print(f"  final validation loss {final[1]:.4f} nats, ppl {final[2]:.2f} (step {final[0]})")
    else:
        print("  no validation yet (train.eval_interval)")
    seconds, tokens = run.step_time()
    if seconds == seconds:
        rule = "median after the third step" if run.timed_steps()[1] == "median" else \
            "mean over whole DiLoCo periods after the third step"
        print(f"  speed: {tokens:,.0f} tokens/s, {seconds:.3f} s/step ({rule})")
    sent = run.bytes_per_step()
    if sent:
        data = sum(sent[c] for c in R.DATA_CLASSES)
        def part(c):
            wire = sent.get(R.wire_key(c))  # the stage-to-stage sends alone (optcc_results.WIRE_CLASSES)
            return f"{c} {sent[c] / 1e6:.3f}" + (f" (wire {wire / 1e6:.3f})" if wire is not None else "")
        parts = ", ".join(part(c) for c in R.DATA_CLASSES if sent[c])
        print(f"  sent per step, all ranks: {data / 1e6:.3f} MB ({parts or 'nothing'})")
    print(f"  the whole file: {sys.argv[0]} {path} --full")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file", help="results file written by optcc (one per run)")
    ap.add_argument("--full", action="store_true", help="every attribute and series group, not the short result")
    ap.add_argument("--series", help="a dataset (train/loss) or a group (train) to print in full")
    ap.add_argument("--last", type=int, default=3, help="values shown per series in the summary (3)")
    ap.add_argument("--lines", type=int, default=5, help="lines shown of multi-line attributes (5)")
    args = ap.parse_args()
    with open_results(args.file) as f:
        if args.series:
            print_series(f, args.series.strip("/"))
        elif not args.full:
            f.close()
            print_short(args.file)
        else:
            print_root(f, args.lines)
            print_groups(f, args.last)
            print_traffic(f)


if __name__ == "__main__":
    main()
