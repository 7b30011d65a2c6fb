#!/usr/bin/env python3
"""bw_fraction per compressor and Fig. 14 slice, from bench_compression's Google Benchmark JSON.

  bench_table.py FILE.json [FILE.json ...]

Prints one markdown table per file: a row per compressor and operation (codec encode/decode,
reducer reduce, and the low-rank products gemm/<product>/<how>), a column per Fig. 14 slice
(1024x1920, 1024x3072, 2048x12288); each cell the median bw_fraction over the repetitions (the
fraction of the memory-bandwidth bound reached, tests/bench/compression_bench.cpp) with GB/s of
input. The context line gives the bandwidth and sgemm the run measured. Reads JSON only: no build.
"""
import json
import re
import statistics
import sys

NAME = re.compile(r"^(?P<kind>codec|reducer|gemm)/(?P<a>[^/]+)(?:/(?P<b>[^/]+))?/fig14/(?P<shape>\d+x\d+)"
                  r"(?:/r(?P<r>\d+))?(?:/(?P<how>[a-z_0-9]+))?$")
SHAPES = ["1024x1920", "1024x3072", "2048x12288"]


def rows_of(doc):
    cells = {}
    for e in doc.get("benchmarks", []):
        if e.get("run_type") == "aggregate" or "bw_fraction" not in e:
            continue
        m = NAME.match(e.get("run_name", e["name"]))
        if not m or (m["r"] and m["r"] != "16"):
            continue
        if m["kind"] == "gemm":
            row = f"gemm {m['a']} ({m['how']})"
        else:
            row = f"{m['kind']} {m['a']} {m['b']}" + (" r16" if m["r"] else "")
        cells.setdefault(row, {}).setdefault(m["shape"], []).append((e["bw_fraction"], e.get("bytes_per_second", 0) / 1e9))
    return cells


def main(paths):
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        ctx = doc.get("context", {})
        print(f"### {path}\n")
        print(f"memory bandwidth {ctx.get('memory_bandwidth_GBps', '?')} GB/s, sgemm 1024 "
              f"{ctx.get('sgemm_1024_GFLOPs', '?')} GFLOP/s, {ctx.get('date', '')}\n")
        print("| compressor | " + " | ".join(SHAPES) + " |")
        print("|---|" + "---|" * len(SHAPES))
        for row, by_shape in sorted(rows_of(doc).items()):
            out = []
            for s in SHAPES:
                v = by_shape.get(s)
                if not v:
                    out.append("")
                    continue
                frac = statistics.median(x for x, _ in v)
                gbs = statistics.median(g for _, g in v)
                out.append(f"{frac:.2f} ({gbs:.1f} GB/s)")
            print(f"| {row} | " + " | ".join(out) + " |")
        print()


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
