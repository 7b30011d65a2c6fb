#!/usr/bin/env python3
"""The LEP study's tables and figures (experiments/lep-study/*.yaml), into paper/lep-study/.

  lep_study.py [--results DIR] [--out DIR]

Inputs: RESULTS/lep-study-*/ (one experiment per cell: pp2-m8, pp4-m16 and pp4-m16-small,
from experiments/lep-study/*.yaml; any other lep-study-* folder is a cell too),
each a grid of `<variant>-r<rank>-seed<N>` runs plus `baseline-seed<N>` (optcc sweep's run names).
Runs are read and grouped into configurations as make_figures.py does (scripts/figures/configs.py);
each variant is compared with the baseline run of the same seed (paired, the protocol's rule).

Writes, into OUT (default paper/lep-study/):
  table.{md,tex}        per variant (rows) and cell (layout x CB rank, columns): the mean paired
                        difference of the final validation loss against the baseline, nats, ± the
                        sample standard deviation over seeds, and the per-seed values
  diagnostics.{md,tex}  per variant and cell, means over every compressed send of the run's last
                        half (steps > train_steps / 2) and over seeds: ‖e‖/‖slice‖,
                        ‖carried‖/‖slice‖, cos(carried, slice), |cos(carried, X_src − X_now)|,
                        the share of sends whose carried error came from an earlier iteration;
                        and ‖e‖/‖slice‖, ‖carried‖/‖slice‖ over the last stage's sends alone (the
                        loss gradient's first hop; the other boundaries' errors are smaller)
  predictors.md         across every (variant, cell, seed) point where the diagnostic exists (the
                        ‖e‖ rows include `off`'s points, the carried-error rows cannot): the
                        Pearson correlation of each diagnostic with the paired loss difference,
                        over all points, within cells and within configurations (each one's mean
                        removed)
  verdict.md            which variant, if any, beats both lazy and off in every cell at every seed
  curves-<cell>.{png,pdf}  validation loss minus the baseline's (paired by seed, mean and range)
                        against step, one line per variant, at every CB rank of the cell
An expected cell (pp2-m8, pp4-m16) without runs is named on stdout; partial runs are marked.
Needs h5py, numpy, PyYAML, matplotlib (/usr/bin/python3 on Debian: scripts/deps.sh).
"""
import argparse
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from figures import configs as FC  # noqa: E402
from figures.output import STYLE, Output, Table, plt  # noqa: E402
import optcc_results as R  # noqa: E402
import numpy as np  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPECTED_CELLS = ["pp2-m8", "pp4-m16"]
VARIANTS = ["lazy", "off", "per_microbatch", "lazy_iteration", "lazy_decay"]
NAME = re.compile(r"^(?P<variant>[a-z_]+)-r(?P<rank>\d+)$")
DIAGNOSTICS = [("relative_error", "‖e‖/‖slice‖"), ("carried_ratio", "‖carried‖/‖slice‖"),
               ("cos_carried_slice", "cos(carried, slice)"), ("abs_cos_carried_delta", "abs cos(carried, ΔX)"),
               ("cross_iteration", "carried from an earlier iteration"),
               ("last_relative_error", "last stage: ‖e‖/‖slice‖"), ("last_carried_ratio", "last stage: ‖carried‖/‖slice‖")]


def nanmean(values):
    a = np.asarray(values, dtype=float)
    return float(np.mean(a[np.isfinite(a)])) if np.isfinite(a).any() else float("nan")


def cell_name(experiment):
    return experiment[len("lep-study-"):] if experiment.startswith("lep-study-") else experiment


def run_diagnostics(run):
    """Means over the compressed sends of the run's second half; None without /lep_diagnostics rows."""
    t = run.table("lep_diagnostics", since=R.lep_diagnostics_first_step(run.train_steps))
    if not t or len(t["step"]) == 0:
        return None
    carried = t["carried_age"] >= 0
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = t["carried_norm"] / t["slice_norm"]
    out = {"relative_error": nanmean(t["relative_error"]), "sends": int(len(t["step"]))}
    # The last pipeline stage's sends (the loss gradient's first hop): stage = rank // (TP·DP), the
    # rank order of harness/parallel/layout.h.
    per_stage = int(run.cfg("parallel", "tp", 1)) * int(run.cfg("parallel", "dp", 1))
    stage = np.asarray(t["rank"]) // max(1, per_stage)
    last = stage == stage.max()
    out["last_relative_error"] = nanmean(t["relative_error"][last])
    # Sends that carried no error (`off`, or none in the window) leave the carried diagnostics NaN.
    out.update({k: float("nan") for k, _ in DIAGNOSTICS if k not in out})
    if carried.any():
        out["carried_ratio"] = nanmean(ratio[carried])
        out["cos_carried_slice"] = nanmean(t["cos_carried_slice"][carried])
        out["abs_cos_carried_delta"] = nanmean(np.abs(t["cos_carried_delta"][carried]))
        out["cross_iteration"] = float(np.mean(t["carried_age"][carried] > 0))
        if (carried & last).any():
            out["last_carried_ratio"] = nanmean(ratio[carried & last])
    return out


def eval_difference_curve(config, ref):
    """(steps, mean, min, max) of the validation loss minus the reference's, paired by seed."""
    m = FC.paired_eval_matrix(config, ref)
    if m is None:
        return None
    steps, d = m
    return steps, d.mean(axis=0), d.min(axis=0), d.max(axis=0)


class Cell:
    """One experiment (a pipeline layout): its baseline and its (variant, rank) configurations."""

    def __init__(self, experiment, runs):
        self.name = cell_name(experiment)
        self.configs = FC.group_configurations(experiment, runs)
        self.ref, self.why = FC.reference(self.configs)
        self.by_key = {}  # (variant, rank) -> Configuration
        for c in self.configs:
            m = NAME.match(FC.name_stem(c) or "")  # the grid's variant-rank part (labels say what it compresses)
            if m and c is not self.ref:
                self.by_key[(m["variant"], int(m["rank"]))] = c
        self.ranks = sorted({r for _, r in self.by_key})


def fmt_diff(values):
    if not values:
        return "–"
    v = list(values.values())
    mean = float(np.mean(v))
    spread = f" ± {np.std(v, ddof=1):.3f}" if len(v) > 1 else ""
    seeds = ", ".join(f"{x:+.3f}" for x in v)
    return f"{mean:+.3f}{spread} ({seeds})"


def study_tables(cells):
    columns = [(c, r) for c in cells for r in c.ranks]
    head = ["variant"] + [f"{c.name} r{r}" for c, r in columns]
    diff = Table("LEP study: final validation loss minus the baseline's at the same seed (nats)", head, [])
    diag = Table("LEP diagnostics per variant and cell",
                   ["variant", "cell"] + [label for _, label in DIAGNOSTICS] + ["sends (last half)"], [])
    points = []  # (diagnostics, paired difference, configuration) for predictors.md
    paired = {}  # (variant, cell, rank) -> {seed: diff}
    for v in VARIANTS:
        row = [v]
        for c, r in columns:
            conf = c.by_key.get((v, r))
            if conf is None:
                row.append("–")
                continue
            d = FC.paired_loss_by_seed(conf, c.ref)
            paired[(v, c.name, r)] = d
            row.append(fmt_diff(d) + (" partial" if conf.is_partial else ""))
            per_seed = {str(run.seed): run_diagnostics(run) for run in conf.used}
            ok = [x for x in per_seed.values() if x]
            if ok:
                diag.rows.append([v, f"{c.name} r{r}"] + [f"{nanmean([x[k] for x in ok]):.4f}" for k, _ in DIAGNOSTICS]
                         + [str(sum(x["sends"] for x in ok))])
            for seed, x in per_seed.items():
                if x and seed in d:
                    points.append((x, d[seed], (v, c.name, r)))
        diff.rows.append(row)
    return diff, diag, points, paired


def _pearson(xs, ys):
    xs, ys = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    flat = lambda a: a.std() <= 1e-12 * (1.0 + np.abs(a).max())  # noqa: E731 -- constant up to round-off
    return float(np.corrcoef(xs, ys)[0, 1]) if len(xs) > 2 and not flat(xs) and not flat(ys) else float("nan")


def _within(pts, key_of):
    """Pearson r after removing each group's mean (groups by key_of(configuration)) from both."""
    groups = {key_of(g) for _, _, g in pts}
    mean = {k: (np.mean([x for x, _, h in pts if key_of(h) == k]), np.mean([y for _, y, h in pts if key_of(h) == k]))
            for k in groups}
    return _pearson([x - mean[key_of(g)][0] for x, _, g in pts], [y - mean[key_of(g)][1] for _, y, g in pts])


def predictors_text(points):
    """Pearson r of each diagnostic with the paired loss difference, over all (configuration, seed)
    points; within cells (each (cell, CB rank)'s mean removed from both), which compares the
    variants of a cell without the cells' differences in scale; and within configurations (each
    configuration's mean removed), which tells a diagnostic that follows the seed-to-seed spread
    from one that only separates variants."""
    lines = ["| diagnostic | Pearson r with the paired loss difference | within cells | within configurations | points | "
             "configurations |", "|---|---|---|---|---|---|"]
    for key, label in DIAGNOSTICS:
        pts = [(p[key], y, g) for p, y, g in points if math.isfinite(p.get(key, float("nan")))]
        groups = sorted({g for _, _, g in pts})
        if len(pts) < 3:
            lines.append(f"| {label} | – | – | – | {len(pts)} | {len(groups)} |")
            continue
        r = _pearson([x for x, _, _ in pts], [y for _, y, _ in pts])
        in_cells = _within(pts, lambda g: (g[1], g[2]))
        in_configs = _within(pts, lambda g: g)
        lines.append(f"| {label} | {r:+.3f} | {in_cells:+.3f} | {in_configs:+.3f} | {len(pts)} | {len(groups)} |")
    return "\n".join(lines) + "\n"


def verdict_text(cells, paired):
    """Which variant beats both lazy and off in every (cell, rank) run so far, at every seed."""
    lines = []
    winners = []
    totals = []
    # The (cell, CB rank) pairs where a new variant was run: tier 2's ranks hold lazy and off alone.
    ran = [(c, r) for c in cells for r in c.ranks
           if any((v, r) in c.by_key for v in VARIANTS if v not in ("lazy", "off"))]
    runs = [f"{c.name} r{r}" for c, r in ran]
    for v in VARIANTS:
        if v in ("lazy", "off"):
            continue
        counts = {}
        for other in ("lazy", "off"):
            beaten, total = 0, 0
            for c in cells:
                for r in c.ranks:
                    mine, theirs = paired.get((v, c.name, r), {}), paired.get((other, c.name, r), {})
                    for s in mine:
                        if s in theirs:
                            total += 1
                            beaten += mine[s] < theirs[s]
            counts[other] = (beaten, total)
        totals.append(counts["lazy"][1] + counts["off"][1])
        lines.append(f"- {v}: lower final loss than lazy at {counts['lazy'][0]} of {counts['lazy'][1]} paired seeds, "
                     f"than off at {counts['off'][0]} of {counts['off'][1]}")
        if all(t and b == t for b, t in counts.values()):
            winners.append(v)
    if not any(t for t in totals):
        return "No comparison yet: no new variant has a run paired with lazy and off at the same seed.\n"
    where = f"the {len(runs)} (cell, CB rank) pairs where the variants ran ({', '.join(runs)})"
    head = (f"Recommended: {', '.join(winners)} (beats lazy and off at every seed in {where})."
            if winners else f"No variant beats both lazy and off at every seed in {where}.")
    # A pair where a variant ran but lazy or off did not (tier 3 runs off alone) adds to one count only.
    missing = []
    for other in ("lazy", "off"):
        lacking = [f"{c.name} r{r}" for c, r in ran if (other, r) not in c.by_key]
        if lacking:
            missing.append(f"no {other} run in {', '.join(lacking)}")
    if missing:
        lines.append(f"- a paired seed is one where both runs exist; {'; '.join(missing)}")
    return head + "\n\n" + "\n".join(lines) + "\n"


def curves_figure(cell):
    fig, axes = plt.subplots(1, max(1, len(cell.ranks)), figsize=(4 * max(1, len(cell.ranks)), 3.2), sharey=True,
                             squeeze=False)
    for ax, r in zip(axes[0], cell.ranks):
        for i, v in enumerate(VARIANTS):
            conf = cell.by_key.get((v, r))
            cur = eval_difference_curve(conf, cell.ref) if conf else None
            if cur is None:
                continue
            steps, mean, lo, hi = cur
            ax.plot(steps, mean, color=f"C{i}", label=v, linestyle="--" if conf.is_partial else "-")
            ax.fill_between(steps, lo, hi, color=f"C{i}", alpha=0.15)
        ax.axhline(0, color="k", linewidth=0.8)
        ax.set_title(f"{cell.name}, CB rank {r}")
        ax.set_xlabel("step")
    axes[0][0].set_ylabel("valid loss − baseline (nats, paired)")
    # One legend for the figure: a panel may hold only some variants (tier 2 runs lazy and off alone).
    drawn = {}
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            drawn.setdefault(lab, h)
    if drawn:
        ncol = len(drawn) if len(axes[0]) > 1 else min(len(drawn), 3)  # a single panel: two rows
        fig.legend(list(drawn.values()), list(drawn.keys()), loc="upper center", ncol=ncol,
                   bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.9 if len(axes[0]) > 1 else 0.84))
    return fig


def main():
    summary, _, details = __doc__.partition("\n\n")
    ap = argparse.ArgumentParser(description=summary, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=details)
    ap.add_argument("--results", default=os.path.join(REPO, "results"),
                    help="the results root holding lep-study-*/ (default: the repository's results/)")
    ap.add_argument("--out", default=os.path.join(REPO, "paper", "lep-study"),
                    help="where the tables and figures go (default: paper/lep-study/)")
    args = ap.parse_args()
    runs = {}
    for run in R.load_runs(args.results):
        if run.experiment.startswith("lep-study-"):
            runs.setdefault(run.experiment, []).append(run)
    if not runs:
        sys.exit(f"lep_study.py: no results/lep-study-*/ runs under {args.results}: run experiments/lep-study/*.yaml "
                 "(slurm/local or slurm/submit) first")
    cells = [Cell(e, rs) for e, rs in sorted(runs.items(), key=lambda kv: (kv[0].count("small"), kv[0]))]
    for expected in EXPECTED_CELLS:
        if f"lep-study-{expected}" not in runs:
            print(f"lep_study.py: no runs of cell {expected} (results/lep-study-{expected}/) yet: left out")
    out = Output(args.out)
    diff, diag, points, paired = study_tables(cells)
    refs = "; ".join(f"{c.name}: the baseline at seed{'s' if len(c.ref.used) != 1 else ''} "
                     + ", ".join(str(r.seed) for r in c.ref.used)
                     + (f" ({c.ref.runs_text()} runs)" if c.ref.partial or c.ref.failed else "") for c in cells)
    diff.notes = ["mean ± sample std over seeds, then each seed's value; negative = better than the baseline",
                  f"reference: {refs}",
                  f"generated by scripts/lep_study.py from {os.path.relpath(args.results, REPO)}/lep-study-*/"]
    diag.notes = ["means over the compressed sends of each run's second half, then over seeds; the carried "
                  "quantities over the sends that carried an error", "ΔX = X_src − X_now, Fig. 11's activation change"]
    out.table("table", diff)
    out.table("diagnostics", diag)
    out.write("predictors.md", predictors_text(points))
    out.write("verdict.md", verdict_text(cells, paired))
    with plt.rc_context(STYLE):
        for c in cells:
            if c.ranks:
                fig = curves_figure(c)
                out.figure(f"curves-{c.name}", fig)
    print(f"lep_study.py: {len(out.written)} written, {len(out.unchanged)} unchanged in {args.out}")


if __name__ == "__main__":
    main()
