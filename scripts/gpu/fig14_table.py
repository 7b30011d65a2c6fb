#!/usr/bin/env python3
"""Fig. 14 side by side: GB/s of input of the low-rank compressors at ranks 8-40 on the three slices,
from bench_compression's JSON (optcc: lowrank codec encode/decode, powersgd reducer reduce) and from
reference_lowrank.py's JSON (the PyTorch-Python compressor: compress/decompress), one column group
per file.

  fig14_table.py LABEL=FILE.json [LABEL=FILE.json ...]

A file is read as bench_compression's when it has "benchmarks", as reference_lowrank.py's when it
is a list. Prints one markdown table: a row per (slice, rank), a column per measurement. Both
programs count the same bytes (rows x cols x 4 per call), so the columns compare directly.
"""
import json
import re
import sys

NAME = re.compile(r"^(codec/lowrank/(encode|decode)|reducer/powersgd/reduce)/fig14/(\d+x\d+)/r(\d+)(/real_time)?$")
SLICES = ["1024x1920", "1024x3072", "2048x12288"]


def read(label, path):
    """{(slice, rank): {column: GB/s}} and the column names in order."""
    with open(path) as f:
        doc = json.load(f)
    cells, cols = {}, []
    if isinstance(doc, list):
        for row in doc:
            for op, key in (("compress", "compress_GBps"), ("decompress", "decompress_GBps")):
                col = f"{label} {op}"
                cells.setdefault((row["slice"], int(row["rank"])), {})[col] = row[key]
                if col not in cols:
                    cols.append(col)
        return cells, cols
    for e in doc.get("benchmarks", []):
        if e.get("run_type") == "aggregate":
            continue
        m = NAME.match(e.get("run_name", e["name"]))
        if not m:
            continue
        op = {"encode": "lowrank encode", "decode": "lowrank decode"}.get(m.group(2), "powersgd reduce")
        col = f"{label} {op}"
        cells.setdefault((m.group(3), int(m.group(4))), {})[col] = e["bytes_per_second"] / 1e9
        if col not in cols:
            cols.append(col)
    return cells, cols


def main():
    if len(sys.argv) < 2 or any("=" not in a for a in sys.argv[1:]):
        sys.exit(__doc__)
    cells, cols = {}, []
    for arg in sys.argv[1:]:
        label, path = arg.split("=", 1)
        c, names = read(label, path)
        for k, v in c.items():
            cells.setdefault(k, {}).update(v)
        cols += [n for n in names if n not in cols]
    print("| slice | r | " + " | ".join(cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    for key in sorted(cells, key=lambda k: (SLICES.index(k[0]) if k[0] in SLICES else 99, k[1])):
        row = cells[key]
        print(f"| {key[0]} | {key[1]} | " + " | ".join(f"{row[c]:.2f}" if c in row else "" for c in cols) + " |")


if __name__ == "__main__":
    main()
