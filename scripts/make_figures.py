#!/usr/bin/env python3
"""Regenerate every figure and table the stored results allow, into paper/ (default).

  make_figures.py [--results DIR] [--out DIR] [--experiment NAME ...]

Inputs: the runs under DIR (default results/), one experiment per folder (results/<experiment>/
<run>.h5, with resumed and re-attempted files merged: scripts/optcc_results.py), and every Google
Benchmark JSON under DIR (tests/bench's bench_compression --benchmark_out=... --benchmark_out_format=json).
Files directly in DIR belong to no experiment: they are indexed (results_index.py), not plotted.
--experiment NAME (repeatable; the folder relative to DIR, e.g. table2 or reference/table2) limits
the work to those experiments (and the benchmark JSONs inside their folders).

Runs are grouped into configurations: equal config apart from train.seed, log.run_name/dir/level
and checkpoint.dir (optcc_results.NON_CONFIG_KEYS). A configuration is labelled by its runs' name
without the seed part (`optcc sweep` names runs by their grid values: baseline-seed1 -> baseline)
when those names tell the configurations apart, else by the config keys whose values differ
between the experiment's configurations (compression.scheme first; keys the scheme determines left
out); the table notes name the differing keys. The reference configuration (speed-ups, ratios,
paired differences; listed first) is the first without any compression, else the first with
compression.scheme = baseline, else the first. Statistics use a configuration's complete runs; one
with only partial runs (still going or killed) is shown up to its last flush and marked "partial"
(dashed lines, table rows); partial runs next to complete ones are drawn dashed, one line each.
Means ± sample standard deviations (n - 1) are over seeds; "paired" differences compare runs of
the same train.seed.

Per experiment, into OUT/<experiment>/ (PNG and PDF for figures, Markdown and LaTeX for tables):
  table.{md,tex}          final validation ppl and loss, paired loss difference and ppl ratio to the
                          reference, tokens/s, speed-up, MB sent per step per traffic class (Table 2;
                          the ablations' and compressor comparisons' tables)
  curves.{png,pdf}        training loss (running mean over 2% of the steps), validation ppl and the
                          validation loss minus the reference's (paired by seed) against step, with
                          seed bands (Fig. 9)
  pareto.{png,pdf}        final validation ppl against MB per step, Pareto front (compressor comparison)
  memory.{png,pdf,md,tex} tensor memory by component (each component's largest value over the ranks)
                          at the last step, and the tracked peak (Fig. 12)
  breakdown.{png,pdf,md,tex}  mean time breakdown of the timeline steps (Fig. 10; emulation_table.py)
  lep_orthogonality.{png,pdf,md,tex}  the Fig. 11 traces: mean |cos|, mean error, mean delta per step
  index.md                the experiment file's header (question, claim, expected outcome) and the above
Per benchmark JSON DIR/<path>/<name>.json, into OUT/<path>/<name>-fig14.{png,pdf,md,tex}: compression
and decompression throughput (GB/s of input) against rank on the Fig. 14 slice shapes.
A figure whose inputs are absent is skipped with one line saying what is missing. Output is
deterministic (fixed styles, sorted inputs, no timestamps); a file whose bytes would not change is
not rewritten. Exit status 1 when a figure failed for another reason (the line names it).
"""
import argparse
import io
import json
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import optcc_results as R  # noqa: E402
import emulation_table  # noqa: E402
import numpy as np  # noqa: E402

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError as e:
    sys.exit(f"make_figures.py: {e}; install python3-matplotlib (scripts/deps.sh) or run with /usr/bin/python3")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEME_ORDER = ["baseline", "cb", "cb_fe", "cb_fe_sc", "cb_nonlep"]
STYLE = {"figure.dpi": 100, "savefig.dpi": 120, "font.size": 9, "axes.grid": True, "grid.alpha": 0.3,
         "legend.fontsize": 7, "axes.prop_cycle": matplotlib.cycler(color=plt.get_cmap("tab10").colors)}
PNG_META = {"Software": None}
PDF_META = {"Creator": None, "Producer": None, "CreationDate": None}


# --- output -------------------------------------------------------------------------------------

class Output:
    """Writes files under a root, leaving unchanged ones alone; counts what it did."""

    def __init__(self, root):
        self.root, self.written, self.unchanged = root, [], []

    def write(self, rel, data):
        path = os.path.join(self.root, rel)
        data = data.encode() if isinstance(data, str) else data
        if os.path.exists(path):
            with open(path, "rb") as f:
                if f.read() == data:
                    self.unchanged.append(path)
                    return path
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        self.written.append(path)
        return path

    def figure(self, rel_stem, fig):
        for ext, meta in (("png", PNG_META), ("pdf", PDF_META)):
            buf = io.BytesIO()
            fig.savefig(buf, format=ext, metadata=meta, bbox_inches="tight")
            self.write(f"{rel_stem}.{ext}", buf.getvalue())
        plt.close(fig)

    def table(self, rel_stem, table):
        self.write(f"{rel_stem}.md", table.markdown())
        self.write(f"{rel_stem}.tex", table.latex())


class Table:
    """A table of text cells rendered as Markdown and as a LaTeX tabular (booktabs)."""

    def __init__(self, title, header, rows, notes=()):
        self.title, self.header, self.rows, self.notes = title, header, rows, list(notes)

    def markdown(self):
        lines = [f"**{self.title}**", "", "| " + " | ".join(self.header) + " |",
                 "|" + "---|" * len(self.header)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in self.rows]
        return "\n".join(lines + [""] + [f"- {n}" for n in self.notes]) + "\n"

    def latex(self):
        def esc(s):
            s = s.replace("\\", r"\textbackslash{}")
            for a, b in (("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"), ("±", r"$\pm$"),
                         ("Δ", r"$\Delta$"), ("×", r"$\times$"), ("|", r"$|$")):
                s = s.replace(a, b)
            return s
        lines = [f"% {esc(self.title)}", "% generated by scripts/make_figures.py; do not edit"]
        lines += [f"% {esc(n)}" for n in self.notes]
        lines += [r"\begin{tabular}{l" + "r" * (len(self.header) - 1) + "}", r"\toprule",
                  " & ".join(esc(h) for h in self.header) + r" \\", r"\midrule"]
        lines += [" & ".join(esc(c) for c in r) + r" \\" for r in self.rows]
        return "\n".join(lines + [r"\bottomrule", r"\end{tabular}"]) + "\n"


def pm(mean, std, digits):
    """'m ± s' with `digits` decimals; 'm' alone when std is NaN (one value); '' when no value."""
    if mean != mean:
        return ""
    return f"{mean:.{digits}f}" if std != std else f"{mean:.{digits}f} ± {std:.{digits}f}"


# --- configurations -----------------------------------------------------------------------------

class Configuration:
    """Runs of one experiment with the same config apart from the seed."""

    def __init__(self, key, runs):
        self.key = key
        self.runs = sorted(runs, key=lambda r: (_value_sort(r.seed), r.name))
        by = {s: [r for r in self.runs if r.status()[0] == s] for s in R.STATUSES}
        self.complete, self.partial, self.failed = by["complete"], by["partial"], by["failed"]
        self.flat = R.flatten(self.runs[0].configuration())
        self.label, self.color, self.differ = "", "C0", []

    @property
    def used(self):
        """The runs the statistics use: the complete ones, else the partial ones."""
        return self.complete or self.partial

    @property
    def is_partial(self):
        return not self.complete and bool(self.partial)

    def runs_text(self):
        parts = [str(len(self.complete))]
        if self.partial:
            steps = ", ".join(f"{r.last_step}/{r.train_steps}" for r in self.partial)
            parts.append(f"{len(self.partial)} partial (step {steps})")
        if self.failed:
            parts.append(f"{len(self.failed)} failed")
        return " + ".join(parts)

    def display(self):
        return self.label + (" (partial)" if self.is_partial else "")


def _value_sort(v):
    if v is None:
        return (0, 0.0, "")
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return (1, float(v), "")
    return (2, 0.0, str(v))


def _short_names(keys):
    """Shortest dotted suffix of each key that is unique among `keys`."""
    out = {}
    for k in keys:
        parts = k.split(".")
        for n in range(1, len(parts) + 1):
            cand = ".".join(parts[-n:])
            if sum(1 for o in keys if o == cand or o.endswith("." + cand)) == 1:
                out[k] = cand
                break
    return out


def name_stem(config):
    """The run name without its seed part: `optcc sweep` names runs by their grid values joined with
    '-' (baseline-seed1), so the tokens that differ between the configuration's runs, or a lone
    `seed<N>` token, are the seed. None when the names do not split alike."""
    tokens = [r.name.split("-") for r in config.runs]
    if len({len(t) for t in tokens}) != 1:
        return None
    if len(tokens) > 1:
        kept = [p for i, p in enumerate(tokens[0]) if len({t[i] for t in tokens}) == 1]
    else:
        kept = [p for p in tokens[0] if not re.fullmatch(r"seed\d+", p)]
    return "-".join(kept) or None


SCHEME_KEY = "compression.scheme"


def varying_keys(known):
    """Config keys whose values differ between the configurations; with compression.scheme among
    them, it comes first and the keys it determines are left out."""
    keys = sorted({k for c in known for k in c.flat})
    varying = [k for k in keys if len({json.dumps(c.flat.get(k)) for c in known}) > 1]
    if SCHEME_KEY not in varying:
        return varying

    def determined(k):
        seen = {}
        return all(seen.setdefault(c.flat.get(SCHEME_KEY), json.dumps(c.flat.get(k))) == json.dumps(c.flat.get(k))
                   for c in known)
    return [SCHEME_KEY] + [k for k in varying if k != SCHEME_KEY and not determined(k)]


def label_configurations(experiment, configs, known, varying):
    """Sets each configuration's label (see the docstring at the top) and the keys that differ."""
    short = _short_names(varying)
    for c in configs:
        c.differ = [k + (" (and the keys it sets)" if k == SCHEME_KEY else "") for k in varying]
        if not c.runs[0].config:
            c.label = f"{c.runs[0].name} (no config)"
            continue
        parts = [str(c.flat.get(k)) if k == SCHEME_KEY else f"{short[k]}={'-' if c.flat.get(k) is None else c.flat.get(k)}"
                 for k in varying]
        c.label = ", ".join(parts) or (c.runs[0].scheme if c.runs[0].scheme != "(none)" else experiment)
    stems = [name_stem(c) for c in known]
    if known and None not in stems and len(set(stems)) == len(stems):  # the sweep's names: grid values
        for c, stem in zip(known, stems):
            c.label = stem


def group_configurations(experiment, runs):
    """The experiment's configurations, labelled and sorted by their differing config values."""
    groups = {}
    for r in runs:
        groups.setdefault(r.configuration_hash() if r.config else f"failed:{r.name}", []).append(r)
    configs = [Configuration(k, v) for k, v in groups.items()]
    known = [c for c in configs if c.runs[0].config]  # a file without a config has no values to compare
    varying = varying_keys(known)
    label_configurations(experiment, configs, known, varying)

    def sort_key(c):
        out = []
        for k in varying:
            v = c.flat.get(k)
            out.append((SCHEME_ORDER.index(v) if v in SCHEME_ORDER else len(SCHEME_ORDER), str(v))
                       if k == SCHEME_KEY else _value_sort(v))
        return (out, c.label)
    return sorted(configs, key=sort_key)


def reference(configs):
    """(configuration, why) the others are compared with: the first without any compression (as the
    baseline scheme is), else the first with compression.scheme = baseline, else the first."""
    def off(spec):  # a CompressorSpec as the effective config writes it: none, fp16, {name: ..., ...}
        return spec in (None, "none") or (isinstance(spec, dict) and spec.get("name") == "none")
    for c in configs:
        comp = c.runs[0].configuration().get("compression") or {}
        if all(off(comp.get(k)) for k in ("dp", "pipeline_backward", "pipeline_forward", "embedding", "tp")) \
                and not comp.get("fused_embedding", False):
            return c, "no compression"
    for c in configs:
        if c.flat.get("compression.scheme") == "baseline":
            return c, "compression.scheme = baseline"
    return configs[0], "the first configuration"


# --- per-configuration statistics ---------------------------------------------------------------

def final_stats(config):
    """[(seed, loss, ppl)] of the used runs' last evaluation."""
    out = []
    for r in config.used:
        e = r.final_eval()
        if e:
            out.append((r.seed, e[1], e[2]))
    return out


def paired_loss_by_seed(config, ref):
    """{seed: final loss minus the reference's} for the seeds both have (each side's mean over its
    runs of that seed), in seed order."""
    def by_seed(stats):
        d = {}
        for seed, loss, _ in stats:
            d.setdefault(str(seed), []).append(loss)
        return {s: float(np.mean(v)) for s, v in d.items()}
    mine, theirs = by_seed(final_stats(config)), by_seed(final_stats(ref))
    return {s: mine[s] - theirs[s] for s in sorted(mine) if s in theirs}


def paired_loss_differences(config, ref):
    """Final loss minus the reference's, per seed both have (paired_loss_by_seed's values)."""
    return list(paired_loss_by_seed(config, ref).values())


def speed(config):
    times = [r.step_time() for r in config.used]
    return R.mean_std([t[0] for t in times]), R.mean_std([t[1] for t in times])


def mb_per_step(config):
    """{class: mean MB per step over the used runs} ({} without traffic)."""
    per_run = [r.bytes_per_step() for r in config.used]
    per_run = [p for p in per_run if p]
    if not per_run:
        return {}
    return {c: float(np.mean([p[c] for p in per_run])) / 1e6 for c in R.TRAFFIC_CLASSES}


def summary_table(experiment, configs, ref, why):
    ref_time = speed(ref)[0]
    ref_ppl = R.mean_std([v[2] for v in final_stats(ref)])[0]
    header = ["configuration", "runs", "seeds", "steps", "valid ppl", "valid loss", "Δ loss vs ref (paired)",
              "ppl vs ref", "tokens/s", "speed-up"] + [f"{c} MB/step" for c in R.DATA_CLASSES] + ["total MB/step"]
    rows = []
    for c in configs:
        fin = final_stats(c)
        ppl, loss = R.mean_std([v[2] for v in fin]), R.mean_std([v[1] for v in fin])
        d = R.mean_std(paired_loss_differences(c, ref) if c is not ref else [])
        sec, tok = speed(c)
        mb = mb_per_step(c)
        row = [c.display(), c.runs_text(), ",".join(str(r.seed) for r in c.used),
               ",".join(sorted({str(r.last_step) for r in c.used})), pm(ppl[0], ppl[1], 2), pm(loss[0], loss[1], 4),
               (f"{d[0]:+.4f}" + ("" if d[1] != d[1] else f" ± {d[1]:.4f}") + f" (n={d[2]})") if d[2] else "",
               f"{100 * (ppl[0] / ref_ppl - 1):+.1f}%" if ppl[2] and ref_ppl == ref_ppl else "",
               f"{tok[0]:.0f}" if tok[0] == tok[0] else "",
               f"{ref_time[0] / sec[0]:.3f}" if sec[0] == sec[0] and ref_time[0] == ref_time[0] else ""]
        row += [f"{mb[k]:.3f}" if mb else "" for k in R.DATA_CLASSES]
        row.append(f"{sum(mb[k] for k in R.DATA_CLASSES):.3f}" if mb else "")
        rows.append(row)
    notes = [f"reference: {ref.label} ({why}); configurations differ in: {', '.join(ref.differ) or 'nothing'}",
             "valid ppl/loss: last evaluation of each run; mean ± sample std (n - 1) over seeds of the complete runs "
             "(partial runs: up to their last flush)",
             "Δ loss: this run's final valid loss minus the reference run's of the same seed",
             "tokens/s and speed-up: median step time after step 3 (timeline steps left out), mean over seeds; "
             "speed-up = reference step time / this step time",
             "MB/step: bytes all ranks sent per training step, mean of the last 20 steps (control traffic left out)"]
    return Table(f"{experiment}: final validation and traffic per configuration", header, rows, notes)


# --- figures ------------------------------------------------------------------------------------

def series(run, table, column):
    t = run.table(table)
    if not t or not len(t["step"]):
        return None, None
    return t["step"], t[column]


def band(runs, table, column, reduce=None):
    """(steps common to all runs, mean, std) of a column (reduce: per-step aggregation of rows)."""
    per = []
    for r in runs:
        s, v = series(r, table, column)
        if s is None:
            continue
        if reduce is not None:
            s, v = reduce(s, v)
        per.append(dict(zip(s.tolist(), v.tolist())))
    if not per:
        return None
    common = sorted(set.intersection(*(set(p) for p in per)))
    if not common:
        return None
    m = np.array([[p[s] for s in common] for p in per])
    std = m.std(axis=0, ddof=1) if len(per) > 1 else np.zeros(len(common))
    return np.array(common), m.mean(axis=0), std


def draw(ax, configs, table, column, reduce=None):
    """Mean ± std over the complete runs of each configuration; partial runs dashed, one line each."""
    drawn = False
    for c in configs:
        color = c.color
        if c.complete:
            b = band(c.complete, table, column, reduce)
            if b is not None:
                s, m, sd = b
                ax.plot(s, m, color=color, lw=1.2, label=f"{c.label} (n={len(c.complete)})")
                if len(c.complete) > 1:
                    ax.fill_between(s, m - sd, m + sd, color=color, alpha=0.2, lw=0)
                drawn = True
        for r in c.partial:
            b = band([r], table, column, reduce)
            if b is not None:
                ax.plot(b[0], b[1], color=color, lw=1.0, ls="--",
                        label=f"{c.label} seed {r.seed} (partial, step {r.last_step}/{r.train_steps})")
                ax.plot(b[0][-1:], b[1][-1:], color=color, marker="x")
                drawn = True
    return drawn


def _running_mean(window):
    """Per-run reduction: the mean of the last `window` values at each step (1 = unchanged)."""
    def reduce(steps, values):
        if window <= 1 or len(values) < window:
            return steps, values
        c = np.cumsum(np.concatenate([[0.0], values]))
        return steps[window - 1:], (c[window:] - c[:-window]) / window
    return reduce


def paired_eval_matrix(config, ref):
    """(steps, d): d[i, t] is the validation loss minus the reference's at steps[t] for the i-th seed
    both ran (used runs), at the evaluation steps all those pairs share; None without a pair."""
    def by_seed(c):
        return {str(r.seed): dict(zip(*(x.tolist() for x in series(r, "eval", "loss")))) for r in c.used
                if series(r, "eval", "loss")[0] is not None}
    mine, theirs = by_seed(config), by_seed(ref)
    pairs = [(mine[s], theirs[s]) for s in sorted(mine) if s in theirs]
    if not pairs:
        return None
    steps = sorted(set.intersection(*(set(a) & set(b) for a, b in pairs)))
    if not steps:
        return None
    return np.array(steps), np.array([[a[t] - b[t] for t in steps] for a, b in pairs])


def paired_eval_difference(config, ref):
    """(steps, mean, std, n) over the seeds of paired_eval_matrix; None without a pair."""
    m = paired_eval_matrix(config, ref)
    if m is None:
        return None
    steps, d = m
    std = d.std(axis=0, ddof=1) if len(d) > 1 else np.zeros(len(steps))
    return steps, d.mean(axis=0), std, len(d)


def curves_figure(experiment, configs, ref):
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 3.8))
    longest = max((r.last_step for cf in configs for r in cf.used), default=0)
    window = max(1, longest // 50)
    ok_train = draw(a, configs, "train", "loss", _running_mean(window))
    ok_eval = draw(b, configs, "eval", "ppl")
    if not ok_train and not ok_eval:
        plt.close(fig)
        return None
    a.set(xlabel="step", ylabel="training loss (nats)",
          title=f"{experiment}: training loss" + (f" (running mean of {window})" if window > 1 else ""))
    b.set(xlabel="step", ylabel="validation perplexity", title="validation perplexity (Fig. 9)", yscale="log")
    b.legend(loc="upper right")
    for cf in configs:
        d = paired_eval_difference(cf, ref) if cf is not ref else None
        if d is not None:
            c.plot(d[0], d[1], color=cf.color, lw=1.2, ls="--" if cf.is_partial else "-",
                   label=f"{cf.display()} (n={d[3]})")
            if d[3] > 1:
                c.fill_between(d[0], d[1] - d[2], d[1] + d[2], color=cf.color, alpha=0.2, lw=0)
    c.axhline(0, color=ref.color, lw=1.0)
    c.set(xlabel="step", ylabel="Δ validation loss (nats)", title=f"minus {ref.label}, paired by seed")
    if c.get_legend_handles_labels()[0]:
        c.legend()
    return fig


def pareto_figure(experiment, configs):
    pts = []
    for c in configs:
        mb = mb_per_step(c)
        ppl = R.mean_std([v[2] for v in final_stats(c)])
        if mb and ppl[2]:
            pts.append((sum(mb[k] for k in R.DATA_CLASSES), ppl[0], 0.0 if ppl[1] != ppl[1] else ppl[1], c))
    if len(pts) < 2:
        return None
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for x, y, e, c in pts:
        ax.errorbar([x], [y], yerr=[e], fmt="o", mfc="none" if c.is_partial else None, color=c.color,
                    capsize=3, label=c.display())
    front, best = [], math.inf
    for x, y, _, _ in sorted(pts, key=lambda p: (p[0], p[1])):
        if y < best:
            front.append((x, y))
            best = y
    ax.plot([p[0] for p in front], [p[1] for p in front], color="0.4", lw=0.8, ls=":", label="Pareto front")
    xs = [p[0] for p in pts]
    if min(xs) > 0 and max(xs) / min(xs) > 10:
        ax.set_xscale("log")
    ax.set(xlabel="MB sent per training step (all ranks)", ylabel="final validation perplexity",
           title=f"{experiment}: perplexity against traffic")
    ax.legend()
    return fig


def memory_rows(configs):
    """[(configuration, {component: MiB})]: each component's largest value over the ranks at the
    last recorded step, mean over the used runs."""
    out = []
    for c in configs:
        per = []
        for r in c.used:
            m = r.table("memory_components", since=r.last_step - 50)  # rows: steps x ranks; read the tail
            if not m or not len(m["step"]):
                continue
            last = m["step"] == m["step"].max()
            per.append({k: float(m[k][last].max()) / 2**20 for k in R.MEMORY_COMPONENTS + ["tracked_peak"]})
        if per:
            out.append((c, {k: float(np.mean([p[k] for p in per])) for k in per[0]}))
    return out


def memory_outputs(experiment, configs):
    rows = memory_rows(configs)
    if not rows:
        return None, None
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(rows) + 3), 4))
    bottom = np.zeros(len(rows))
    for j, k in enumerate(R.MEMORY_COMPONENTS):
        v = np.array([r[1][k] for r in rows])
        ax.bar(range(len(rows)), v, bottom=bottom, color=f"C{j}", label=k)
        bottom += v
    rest = np.array([max(0.0, r[1]["tracked_peak"] - b) for r, b in zip(rows, bottom)])
    ax.bar(range(len(rows)), rest, bottom=bottom, color="0.85", hatch="//", edgecolor="0.6", lw=0,
           label="rest of the tracked peak")
    ax.set_xticks(range(len(rows)), [r[0].display() for r in rows], rotation=20, ha="right")
    ax.set(ylabel="MiB", title=f"{experiment}: tensor memory by component (Fig. 12)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1))
    header = ["configuration"] + [f"{k} MiB" for k in R.MEMORY_COMPONENTS] + ["tracked peak MiB"]
    body = [[c.display()] + [f"{m[k]:.3f}" for k in R.MEMORY_COMPONENTS] + [f"{m['tracked_peak']:.3f}"]
            for c, m in rows]
    notes = ["each component's largest value over the ranks at the last recorded step (so a bar may add "
             "parts of different ranks), mean over seeds; /memory_components, harness/records/memory_tracker.h",
             "activations_peak: peak during the pipeline schedule above the memory held when it started"]
    return fig, Table(f"{experiment}: tensor memory by component (MiB)", header, body, notes)


def breakdown_outputs(experiment, configs, ref):
    rows = []
    for c in configs:
        per = [emulation_table.summarise_run(r, 3) for r in c.used if r.rows("breakdown")]
        if per:
            rows.append((c, {k: float(np.mean([p[k] for p in per])) for k in per[0]
                             if isinstance(per[0][k], float)}))
    if not rows:
        return None, None
    base = next((m for c, m in rows if c is ref), rows[0][1])
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(rows) + 1.8))
    left = np.zeros(len(rows))
    for j, k in enumerate(emulation_table.CATEGORIES):
        v = np.array([m[f"{k}_ms"] for _, m in rows])
        ax.barh(range(len(rows)), v, left=left, color=f"C{j}", label=k)
        left += v
    ax.set_yticks(range(len(rows)), [c.display() for c, _ in rows])
    ax.invert_yaxis()
    ax.set(xlabel="ms per step on the critical-path rank", title=f"{experiment}: time breakdown (Fig. 10)")
    ax.legend(ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    header = ["configuration", "step ms"] + [f"{k} ms" for k in emulation_table.CATEGORIES] + \
        ["median step s", "speed-up", "speed-up at equal compute", "inter-node emulated s/step (all ranks)"]
    body = []
    for c, m in rows:
        eq = (base["pipeline_s"] + base["after_pipeline_s"]) / (base["pipeline_s"] + m["after_pipeline_s"])
        body.append([c.display(), f"{m['breakdown_step_ms']:.1f}"] +
                    [f"{m[k + '_ms']:.1f}" for k in emulation_table.CATEGORIES] +
                    [f"{m['median_step_s']:.3f}", f"{base['median_step_s'] / m['median_step_s']:.3f}", f"{eq:.3f}",
                     f"{m['inter_emulated_s_per_step']:.3f}"])
    notes = ["breakdown: mean over the timeline steps (log.timeline_steps) and seeds; the other columns: "
             "scripts/emulation_table.py defines them (median over the steps after the third); the emulated "
             "inter-node seconds do not depend on the machine's load, the measured times do"]
    return fig, Table(f"{experiment}: time breakdown per step", header, body, notes)


def _per_step_mean(abs_value=False):
    def reduce(steps, values):
        v = np.abs(values) if abs_value else values
        u, inv = np.unique(steps, return_inverse=True)
        return u, np.bincount(inv, weights=v) / np.bincount(inv)
    return reduce


def orthogonality_outputs(experiment, configs):
    have = [c for c in configs if any(r.rows("lep_orthogonality") for r in c.used)]
    if not have:
        return None, None
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, (col, absval, title) in zip(axes, [("cosine", True, "mean |cos(error, Δ activation)|"),
                                               ("error_mean", False, "mean of the LEP error"),
                                               ("delta_mean", False, "mean of Δ activation")]):
        draw(ax, have, "lep_orthogonality", col, _per_step_mean(absval))
        ax.set(xlabel="step", title=title)
        ax.axhline(0, color="0.5", lw=0.6)
    axes[0].set_ylim(bottom=0)
    axes[0].legend()
    fig.suptitle(f"{experiment}: LEP error against activation change (Fig. 11)", y=1.02)
    header = ["configuration", "rows", "mean abs(cos)", "mean cos", "std cos", "mean error", "mean Δ"]
    body = []
    for c in have:
        t = [r.table("lep_orthogonality") for r in c.used if r.rows("lep_orthogonality")]
        cos = np.concatenate([x["cosine"] for x in t])
        err = np.concatenate([x["error_mean"] for x in t])
        dlt = np.concatenate([x["delta_mean"] for x in t])
        body.append([c.display(), str(len(cos)), f"{np.mean(np.abs(cos)):.4f}", f"{np.mean(cos):+.4f}",
                     f"{np.std(cos):.4f}", f"{np.mean(err):+.3e}", f"{np.mean(dlt):+.3e}"])
    notes = ["all rows (steps, last-stage ranks, micro-batches) of the used runs; spec §3.3 defines the pairs"]
    return fig, Table(f"{experiment}: LEP error against activation change", header, body, notes)


# --- Fig. 14 from Google Benchmark JSON --------------------------------------------------------

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


def fig14_outputs(title, doc):
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


# --- driver -------------------------------------------------------------------------------------

def experiment_header(experiment):
    """The leading comment of experiments/<last part of the name>.yaml, if that file exists."""
    path = os.path.join(REPO, "experiments", experiment.split("/")[-1] + ".yaml")
    if not os.path.exists(path):
        return None, None
    lines = []
    with open(path) as f:
        for line in f:
            if not line.startswith("#"):
                break
            lines.append(line[1:].strip())
    return os.path.relpath(path, REPO), lines


class Experiment:
    def __init__(self, name, runs, out):
        self.name, self.out = name, out
        self.configs = group_configurations(name, runs)
        self.usable = [c for c in self.configs if c.used]  # with a training step to show
        self.ref, self.why = reference(self.usable) if self.usable else (None, "")
        if self.ref is not None:  # the reference first, the others in their order
            self.usable.remove(self.ref)
            self.usable.insert(0, self.ref)
        for i, c in enumerate(self.usable):  # one colour per configuration in every figure of the experiment
            c.color = f"C{i % 10}"
        self.made, self.skipped, self.errors = [], [], []

    def step(self, what, make):
        """Runs one output; a missing input is a skip line, any other failure an error line."""
        try:
            missing = make()
        except Exception as e:  # noqa: BLE001 -- one line per failed figure, never a traceback
            self.errors.append(f"{what}: {type(e).__name__}: {e}")
            return
        if missing:
            self.skipped.append(f"{what} ({missing})")
        else:
            self.made.append(what)

    def render(self):
        d, usable = self.name, self.usable
        self.step("table", lambda: "no run with a training step" if not usable else
                  self.out.table(f"{d}/table", summary_table(d, usable, self.ref, self.why)))
        self.step("curves", lambda: self._figure("curves", curves_figure(d, usable, self.ref), "no /train or /eval rows"))
        self.step("pareto", lambda: self._figure("pareto", pareto_figure(d, usable),
                                                 "fewer than 2 configurations with a final ppl and /traffic"))
        self.step("memory", lambda: self._pair("memory", memory_outputs(d, usable), "no /memory_components rows"))
        self.step("breakdown", lambda: self._pair("breakdown", breakdown_outputs(d, usable, self.ref),
                                                  "no /breakdown rows: set log.timeline_steps"))
        self.step("lep_orthogonality", lambda: self._pair("lep_orthogonality", orthogonality_outputs(d, usable),
                                                          "no /lep_orthogonality rows: set log.lep_orthogonality"))
        self._index()

    def _figure(self, stem, fig, missing):
        if fig is None:
            return missing
        self.out.figure(f"{self.name}/{stem}", fig)

    def _pair(self, stem, outputs, missing):
        fig, table = outputs
        if fig is None:
            return missing
        self.out.figure(f"{self.name}/{stem}", fig)
        self.out.table(f"{self.name}/{stem}", table)

    def _index(self):
        src, header = experiment_header(self.name)
        lines = [f"# {self.name}", ""]
        if self.name.startswith("reference/"):
            lines += ["Committed reference results (`results/reference/`, made by `scripts/reference_results.sh`: "
                      "some are the experiment file's real cpu-scale runs, others smaller placeholders); "
                      "`paper/README.md` says which, and what they can and cannot show.", ""]
        if header:
            lines += [f"From `{src}`:", "", "```"] + header + ["```", ""]
        for what in self.made:
            if what in ("table",):
                with open(os.path.join(self.out.root, self.name, "table.md")) as f:
                    lines += [f.read()]
            elif what in ("memory", "breakdown", "lep_orthogonality"):
                with open(os.path.join(self.out.root, self.name, f"{what}.md")) as f:
                    lines += [f"![{what}]({what}.png)", "", f.read()]
            else:
                lines += [f"![{what}]({what}.png)", ""]
        if self.skipped:
            lines += ["Not drawn: " + "; ".join(self.skipped) + "."]
        self.out.write(f"{self.name}/index.md", "\n".join(lines).rstrip() + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default="results", help="results folder (default results/)")
    ap.add_argument("--out", default="paper", help="output folder (default paper/)")
    ap.add_argument("--experiment", action="append", metavar="NAME",
                    help="only this experiment (folder under --results); repeatable")
    args = ap.parse_args()
    if not os.path.isdir(args.results):
        sys.exit(f"make_figures.py: --results {args.results}: no such folder")
    plt.rcParams.update(STYLE)
    wanted = set(args.experiment) if args.experiment else None
    runs = R.load_runs(args.results, wanted)
    by_exp = {}
    for r in runs:
        by_exp.setdefault(r.experiment, []).append(r)
    out, errors = Output(args.out), 0
    if wanted:
        for name in sorted(wanted - set(by_exp)):
            print(f"make_figures: {name}: no results under {os.path.join(args.results, name)}")
    if "" in by_exp:
        print(f"make_figures: {len(by_exp.pop(''))} runs directly in {args.results}/ belong to no experiment: "
              "indexed, not plotted (an experiment's runs go to results/<experiment>/)")
    for name in sorted(by_exp):
        e = Experiment(name, by_exp[name], out)
        e.render()
        print(f"make_figures: {name}: {len(by_exp[name])} runs, {len(e.configs)} configurations -> "
              f"{os.path.join(args.out, name)}/: {', '.join(e.made) or 'nothing'}")
        if e.skipped:
            print(f"make_figures: {name}: skipped " + "; ".join(e.skipped))
        for line in e.errors:
            print(f"make_figures: {name}: FAILED {line}")
        errors += len(e.errors)
    errors += bench_figures(args, wanted, out)
    print(f"make_figures: {len(out.written)} files written, {len(out.unchanged)} unchanged under {args.out}/")
    sys.exit(1 if errors else 0)


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
            fig, table = fig14_outputs(rel, doc)
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


if __name__ == "__main__":
    main()
