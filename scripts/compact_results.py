#!/usr/bin/env python3
"""Rewrite optcc results files compressed (gzip), with the same groups, datasets, values and attributes;
with --trim, also without the data that no figure, table or number of the repository reads.

  compact_results.py [--trim] FILE.h5 [FILE.h5 ...]      in place (through a temporary file and a rename)

The trainer writes chunks of 1,024 rows per column (harness/records/metrics.h), so a short run's file
is mostly unused chunk space (~0.6 MB for 10 steps on 8 ranks). This copy stores each column as one
gzip-compressed chunk (shuffle filter), keeping every dataset's dtype, shape, values and attributes
(`unit`), every group's `columns` and every root attribute (UTF-8 strings); the copy is read back
and compared with the original before it replaces it. Used for the committed reference results
(results/reference/); h5py, optcc's results reader and `optcc trace` read it like the original.

--trim (the committed reference results; scripts/reference_results.sh and lep_study_runs.sh pass it)
leaves out what TRIM below lists, and only that: the copy is compared with the original less those
parts, the group's `columns` attribute loses a dropped column, and the root attribute `trimmed` says
what was left out, one line per part (a file already trimmed is trimmed again to the same result). A trimmed file is the
run's record for every figure and table `make figures` draws and every number docs/ and paper/ quote,
not a complete record of the run: keep the untrimmed files of runs you may analyse in other ways.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import optcc_results as R  # noqa: E402
import h5py  # noqa: E402
import numpy as np  # noqa: E402

# What --trim leaves out, with the reason a reader of the reference results gets in `trimmed`.
#   (table, column): a column no script under scripts/ reads;
#   (table, None):   the rows before first_step(file), which the one script reading the table skips.
TRIM_COLUMNS = {("traffic", "seconds"): "each collective's wall time, which no figure or table reads: "
                                        "step times are in /train and /timing"}
TRIM_ROWS = {"lep_diagnostics": ("the run's first half, which scripts/lep_study.py does not read",
                                 lambda f: R.lep_diagnostics_first_step(train_steps(f)))}


def train_steps(f):
    """train.train_steps of the file's recorded config (0 without one)."""
    try:
        cfg = R.yaml.safe_load(R.attr(f, "config")) or {}
    except R.yaml.YAMLError:
        return 0
    return int(((cfg.get("train") or {}) if isinstance(cfg, dict) else {}).get("train_steps", 0) or 0)


def plan_of(f, trim):
    """{table: (dropped columns, first kept step or None)} for file f; {} without --trim."""
    plan = {}
    if not trim:
        return plan
    for (table, column) in TRIM_COLUMNS:
        if table in f and column in f[table]:
            plan.setdefault(table, [set(), None])[0].add(column)
    for table, (_, first_step) in TRIM_ROWS.items():
        if table in f and "step" in f[table] and f[table]["step"].shape[0]:
            plan.setdefault(table, [set(), None])[1] = first_step(f)
    return {t: (cols, step) for t, (cols, step) in plan.items()}


def trimmed_note(f, plan):
    """The root attribute `trimmed`: what this and any earlier --trim left out."""
    notes = [n for n in R.attr(f, "trimmed").split("\n") if n]
    for table, (cols, step) in sorted(plan.items()):
        for c in sorted(cols):
            notes.append(f"/{table}/{c} dropped ({TRIM_COLUMNS[(table, c)]})")
        if step is not None and step > 1:
            notes.append(f"/{table} rows of steps < {step} dropped ({TRIM_ROWS[table][0]})")
    seen = []
    for n in notes:
        if n not in seen:
            seen.append(n)
    return "\n".join(seen)


def copy_attrs(src, dst, skip=()):
    for k in src.attrs:
        if k in skip:
            continue
        v = src.attrs[k]
        dst.attrs[k] = R.text(v) if isinstance(v, (str, bytes)) else v


def kept(group, plan, name):
    """The rows of dataset `name` of `group` that the plan keeps, as an array."""
    data = group[name][...]
    step = plan[1] if plan else None
    if step is not None and data.ndim == 1 and "step" in group:
        data = data[group["step"][...] >= step]
    return data


def copy_tree(src, dst, plan, where=""):
    table_plan = plan.get(where.strip("/"))
    copy_attrs(src, dst, skip=("columns", "trimmed"))
    if "columns" in src.attrs:
        cols = [c for c in R.text(src.attrs["columns"]).split(",") if not table_plan or c not in table_plan[0]]
        dst.attrs["columns"] = ",".join(cols)
    for name in src:
        obj = src[name]
        if isinstance(obj, h5py.Group):
            gcpl = h5py.h5p.create(h5py.h5p.GROUP_CREATE)
            gcpl.set_obj_track_times(False)  # no creation times: the same input gives the same bytes
            copy_tree(obj, h5py.Group(h5py.h5g.create(dst.id, name.encode(), gcpl=gcpl)), plan, f"{where}{name}/")
            continue
        if table_plan and name in table_plan[0]:
            continue
        data = kept(src, table_plan, name)
        chunk = (max(1, min(len(data), 1 << 20)),) if data.ndim == 1 else True
        ds = dst.create_dataset(name, data=data, dtype=obj.dtype, maxshape=(None,) * data.ndim, chunks=chunk,
                                compression="gzip", compression_opts=9, shuffle=True, track_times=False)
        copy_attrs(obj, ds)


def same_tree(a, b, plan, where="/"):
    """'' when b holds what a holds less the plan's parts: attributes, groups and dataset values; else the
    difference."""
    table_plan = plan.get(where.strip("/"))
    skip = {"columns", "trimmed"}
    if sorted(set(a.attrs) - skip) != sorted(set(b.attrs) - skip) or \
            any(R.text(a.attrs[k]) != R.text(b.attrs[k]) for k in a.attrs if k not in skip):
        return f"attributes of {where}"
    names = [n for n in a if not (table_plan and n in table_plan[0])]
    if sorted(names) != sorted(b):
        return f"members of {where}"
    for name in names:
        x, y = a[name], b[name]
        if isinstance(x, h5py.Group):
            diff = same_tree(x, y, plan, f"{where}{name}/")
            if diff:
                return diff
        elif x.dtype != y.dtype or not np.array_equal(kept(a, table_plan, name), y[...], equal_nan=x.dtype.kind == "f"):
            return f"dataset {where}{name}"
        elif sorted(x.attrs) != sorted(y.attrs) or any(R.text(x.attrs[k]) != R.text(y.attrs[k]) for k in x.attrs):
            return f"attributes of {where}{name}"
    return ""


def compact(path, trim):
    path = os.path.realpath(path)  # a symbolic link (one reference folder reuses another's runs) stays one
    tmp = path + ".compact.tmp"
    fcpl = h5py.h5p.create(h5py.h5p.FILE_CREATE)
    fcpl.set_obj_track_times(False)
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_libver_bounds(h5py.h5f.LIBVER_LATEST, h5py.h5f.LIBVER_LATEST)
    h5py.h5f.create(tmp.encode(), h5py.h5f.ACC_TRUNC, fcpl=fcpl, fapl=fapl).close()
    with R.open_results(path) as src, h5py.File(tmp, "r+") as dst:
        plan = plan_of(src, trim)
        copy_tree(src, dst, plan)
        note = trimmed_note(src, plan)
        if note:
            dst.attrs["trimmed"] = note
    with R.open_results(path) as a, h5py.File(tmp, "r") as b:
        diff = same_tree(a, b, plan)
        if not diff and R.attr(b, "trimmed") != note:
            diff = "the attribute trimmed"
    if diff:
        os.unlink(tmp)
        sys.exit(f"compact_results.py: {path}: the copy differs in {diff}; original kept")
    before = os.path.getsize(path)
    os.replace(tmp, path)
    print(f"{path}: {before} -> {os.path.getsize(path)} bytes" + (" (trimmed)" if plan else ""))


def main():
    args = sys.argv[1:]
    trim = "--trim" in args
    paths = [a for a in args if a != "--trim"]
    if not paths or any(a in ("-h", "--help") for a in args) or any(a.startswith("-") for a in paths):
        sys.exit(__doc__)
    for p in paths:
        compact(p, trim)


if __name__ == "__main__":
    main()
