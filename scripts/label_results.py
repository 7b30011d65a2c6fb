#!/usr/bin/env python3
"""Give results files written before optcc recorded what a run compresses their `compression` root
attribute, from the config each file stores, as optcc itself labels it (`optcc config label`,
compression_label in harness/config/config.h): baseline, a scheme's name, or e.g.
dp=powersgd(rank=4). Tables and figures (make_figures.py, scheme_table.py) name runs by it.

  label_results.py FILE.h5 [FILE.h5 ...] [--optcc build/optcc] [--dry-run]

A file that has the attribute is left as it is; one without a stored config is skipped with a line.
The label is added with a second attribute saying so: compression_added = "from the stored config by
scripts/label_results.py, <optcc --version>" (nothing else in the file changes).
"""
import argparse
import os
import subprocess
import sys
import tempfile

try:
    import h5py
except ImportError as e:
    sys.exit(f"label_results.py: {e}; run with /usr/bin/python3 (Debian's python3-h5py)")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from optcc_results import open_results  # noqa: E402  (a killed writer's flag is cleared first)


def text(v):
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def label_of(optcc, config_yaml):
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        f.write(config_yaml)
        f.flush()
        p = subprocess.run([optcc, "config", "label", "--config", f.name], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(p.stderr.strip() or f"exit {p.returncode}")
    return p.stdout.strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--optcc", default=os.path.join(ROOT, "build", "optcc"), help="the optcc binary (build/optcc)")
    ap.add_argument("--dry-run", action="store_true", help="print the labels, change nothing")
    args = ap.parse_args()
    version = subprocess.run([args.optcc, "--version"], capture_output=True, text=True).stdout.strip()
    failed = 0
    for path in args.files:
        with open_results(path) as f:
            if "compression" in f.attrs:
                print(f"{path}: has compression = {text(f.attrs['compression'])}")
                continue
            if "config" not in f.attrs:
                print(f"{path}: no stored config, skipped")
                continue
            config = text(f.attrs["config"])
        try:
            label = label_of(args.optcc, config)
        except RuntimeError as e:
            print(f"{path}: optcc could not label its config: {e}", file=sys.stderr)
            failed += 1
            continue
        print(f"{path}: compression = {label}" + (" (dry run)" if args.dry_run else ""))
        if not args.dry_run:
            with h5py.File(path, "a") as f:
                f.attrs["compression"] = label
                f.attrs["compression_added"] = f"from the stored config by scripts/label_results.py, {version}"
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
