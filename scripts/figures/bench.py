"""Fig. 14: compressor throughput against rank, from Google Benchmark JSON (tests/bench's
bench_compression --benchmark_out=... --benchmark_out_format=json)."""
import json
import os
import re

import numpy as np

from figures.output import Table, about, footnote, plt

FIG14 = re.compile(r"^(?P<kind>codec|reducer)/(?P<name>[^/]+)/(?P<op>[^/]+)/fig14/(?P<shape>\d+x\d+)(?:/r(?P<r>\d+))?$")


def benchmark_points(doc):
    """{(name/op, shape): {rank or None: GB/s}} of the fig14 benchmarks (median aggregate if present)."""
    entries = doc.get("benchmarks", [])
    medians = {e.get("run_name", e["name"]) for e in entries
               if e.get("run_type") == "aggregate" and e.get("aggregate_name") == "median"}
    raw = {}
    for e in entries:
        base = e.get("run_name", e["name"])
        if base in medians and not (e.get("run_type") == "aggregate" and e.get("aggregate_name") == "median"):
            continue
        if e.get("run_type") == "aggregate" and e.get("aggregate_name") != "median":
            continue
        m = FIG14.match(base)
        if m and "bytes_per_second" in e:
            key = (f"{m['name']} {m['op']}", m["shape"])
            raw.setdefault(key, {}).setdefault(int(m["r"]) if m["r"] else None, []).append(e["bytes_per_second"] / 1e9)
    return {k: {r: float(np.median(v)) for r, v in d.items()} for k, d in sorted(raw.items())}


def repetitions(doc):
    """The most repetitions of one fig14 benchmark in the JSON (iteration entries per run name)."""
    counts = {}
    for e in doc.get("benchmarks", []):
        base = e.get("run_name", e.get("name", ""))
        if e.get("run_type", "iteration") == "iteration" and FIG14.match(base):
            counts[base] = counts.get(base, 0) + 1
    return max(counts.values(), default=0)


def fig14_outputs(title, doc, note=""):
    """(figure, table) of a benchmark JSON called `title` (its path under the results folder, without
    .json); `note` (the folder's ABOUT.txt) goes into the figure's footnote."""
    pts = benchmark_points(doc)
    ranked = {k: v for k, v in pts.items() if any(r is not None for r in v)}
    if not ranked:
        return None, None
    shapes = sorted({s for _, s in ranked}, key=lambda s: [int(x) for x in s.split("x")])
    fig, axes = plt.subplots(1, len(shapes), figsize=(4 * len(shapes), 3.6), squeeze=False)
    names = sorted({n for n, _ in ranked})
    for ax, shape in zip(axes[0], shapes):
        for i, n in enumerate(names):
            d = ranked.get((n, shape))
            if d:
                rs = sorted(r for r in d if r is not None)
                ax.plot(rs, [d[r] for r in rs], marker="o", color=f"C{i % 10}", label=n)
        ax.set(xlabel="rank r", ylabel="GB/s of fp32 input (one thread)", title=f"slice {shape}", ylim=(0, None))
    axes[0][0].legend()
    fig.suptitle(f"{title}: compression throughput against rank (Fig. 14)", y=1.02)
    ranks = sorted({r for d in ranked.values() for r in d if r is not None})
    reps = repetitions(doc)
    text = (f"{title}.json: {sum(len([r for r in d if r is not None]) for d in ranked.values())} benchmarks "
            f"({len(ranked)} compressor and shape series, ranks {', '.join(map(str, ranks))}), "
            + (f"median of {reps} repetitions each" if reps > 1 else "one repetition each"))
    footnote(fig, text + (f". {note}" if note else ""))
    header = ["compressor", "shape"] + [f"r={r}" for r in ranks]
    body = [[n, s] + [f"{d[r]:.2f}" if r in d else "" for r in ranks] for (n, s), d in ranked.items()]
    others = [[n, s, f"{d[None]:.2f}"] for (n, s), d in pts.items() if (n, s) not in ranked and None in d]
    notes = ["GB/s of fp32 input per second of one thread's CPU time (tests/bench/compression_bench.cpp)",
             "median over repetitions where the JSON holds aggregates"]
    notes += [f"at its defaults: {n} {s}: {g} GB/s" for n, s, g in others]
    return fig, Table(f"{title}: compression throughput (GB/s) against rank", header, body, notes)


def find_benchmarks(results_dir):
    """[(relative path without .json, document)] of the Google Benchmark JSON files under results_dir."""
    out = []
    for root, dirs, files in os.walk(results_dir):
        dirs.sort()
        for name in sorted(files):
            if not name.endswith(".json"):
                continue
            path = os.path.join(root, name)
            try:
                with open(path) as f:
                    if '"context"' not in f.read(4096):  # Google Benchmark writes it first; skips traces
                        continue
                    f.seek(0)
                    doc = json.load(f)
            except (OSError, ValueError):
                continue
            if isinstance(doc, dict) and "benchmarks" in doc and "context" in doc:
                out.append((os.path.relpath(path, results_dir)[:-len(".json")].replace(os.sep, "/"), doc))
    return out


def bench_figures(args, wanted, out):
    errors = 0
    benches = [(rel, doc) for rel, doc in find_benchmarks(args.results)
               if wanted is None or any(rel.startswith(w + "/") for w in wanted)]
    if not benches and wanted is None:
        print(f"make_figures: fig14 skipped (no Google Benchmark JSON under {args.results}/: run "
              "build/tests/bench/bench_compression --benchmark_out=results/bench/compression.json "
              "--benchmark_out_format=json)")
    for rel, doc in benches:
        try:
            fig, table = fig14_outputs(rel, doc, about(os.path.dirname(os.path.join(args.results, rel))))
        except Exception as e:  # noqa: BLE001
            print(f"make_figures: {rel}.json: FAILED fig14: {type(e).__name__}: {e}")
            errors += 1
            continue
        if fig is None:
            print(f"make_figures: {rel}.json: fig14 skipped (no codec/.../fig14/<shape>/r<rank> benchmarks)")
            continue
        out.figure(f"{rel}-fig14", fig)
        out.table(f"{rel}-fig14", table)
        print(f"make_figures: {rel}.json -> {os.path.join(args.out, rel)}-fig14.{{png,pdf,md,tex}}")
    return errors
