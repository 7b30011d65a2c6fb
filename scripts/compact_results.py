#!/usr/bin/env python3
"""Rewrite optcc results files compressed (gzip), with the same groups, datasets, values and attributes.

  compact_results.py FILE.h5 [FILE.h5 ...]      in place (through a temporary file and a rename)

The trainer writes chunks of 1,024 rows per column (harness/records/metrics.h), so a short run's file
is mostly unused chunk space (~0.6 MB for 10 steps on 8 ranks). This copy stores each column as one
gzip-compressed chunk (shuffle filter), keeping every dataset's dtype, shape, values and attributes
(`unit`), every group's `columns` and every root attribute (UTF-8 strings); the copy is read back
and compared with the original before it replaces it. Used for the committed reference results
(results/reference/); h5py, optcc's results reader and `optcc trace` read it like the original.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import optcc_results as R  # noqa: E402
import h5py  # noqa: E402
import numpy as np  # noqa: E402


def copy_attrs(src, dst):
    for k in src.attrs:
        v = src.attrs[k]
        dst.attrs[k] = R.text(v) if isinstance(v, (str, bytes)) else v


def copy_tree(src, dst):
    copy_attrs(src, dst)
    for name in src:
        obj = src[name]
        if isinstance(obj, h5py.Group):
            copy_tree(obj, dst.create_group(name))
            continue
        data = obj[...]
        chunk = (max(1, min(len(data), 1 << 20)),) if data.ndim == 1 else True
        ds = dst.create_dataset(name, data=data, dtype=obj.dtype, maxshape=(None,) * data.ndim, chunks=chunk,
                                compression="gzip", compression_opts=9, shuffle=True)
        copy_attrs(obj, ds)


def same_tree(a, b, where="/"):
    """'' when the two groups hold the same attributes, groups and dataset values; else the difference."""
    if sorted(a.attrs) != sorted(b.attrs) or any(R.text(a.attrs[k]) != R.text(b.attrs[k]) for k in a.attrs):
        return f"attributes of {where}"
    if sorted(a) != sorted(b):
        return f"members of {where}"
    for name in a:
        x, y = a[name], b[name]
        if isinstance(x, h5py.Group):
            diff = same_tree(x, y, f"{where}{name}/")
            if diff:
                return diff
        elif x.dtype != y.dtype or not np.array_equal(x[...], y[...], equal_nan=x.dtype.kind == "f"):
            return f"dataset {where}{name}"
        elif sorted(x.attrs) != sorted(y.attrs) or any(R.text(x.attrs[k]) != R.text(y.attrs[k]) for k in x.attrs):
            return f"attributes of {where}{name}"
    return ""


def compact(path):
    tmp = path + ".compact.tmp"
    with R.open_results(path) as src, h5py.File(tmp, "w", libver="latest") as dst:
        copy_tree(src, dst)
    with R.open_results(path) as a, h5py.File(tmp, "r") as b:
        diff = same_tree(a, b)
    if diff:
        os.unlink(tmp)
        sys.exit(f"compact_results.py: {path}: the copy differs in {diff}; original kept")
    before = os.path.getsize(path)
    os.replace(tmp, path)
    print(f"{path}: {before} -> {os.path.getsize(path)} bytes")


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        sys.exit(__doc__)
    for p in sys.argv[1:]:
        compact(p)


if __name__ == "__main__":
    main()
