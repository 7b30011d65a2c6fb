"""Model quality per configuration: Table 2's summary table (final validation, paired differences,
speed, bytes per class), Fig. 9's curves with seed bands, and the compressors' ppl-against-bytes
Pareto plot."""
import math

import numpy as np

import optcc_results as R
from figures.configs import band, final_stats, mb_per_step, paired_eval_difference, paired_loss_differences, speed
from figures.output import Table, footnote, plt, pm, runs_note, short
from matplotlib import ticker  # after figures.output, which names the package to install when it is missing

def summary_table(experiment, configs, ref, why):
    ref_time = speed(ref)[0]
    ref_ppl = R.mean_std([v[2] for v in final_stats(ref)])[0]
    mbs = {id(c): mb_per_step(c) for c in configs}
    # outer (DiLoCo's exchange) only where some configuration sends it
    classes = [k for k in R.DATA_CLASSES if k != "outer" or any(m and m.get(k) for m in mbs.values())]
    # the stage-to-stage wire beside each pipeline class's total, where some run has pipeline bytes and
    # every configuration's runs record the wire (files written before /traffic/p2p_bytes do not)
    wire = all(R.wire_key(c) in m for m in mbs.values() if m for c in R.WIRE_CLASSES) and \
        any(m and m.get(c) for m in mbs.values() for c in R.WIRE_CLASSES)
    columns = [k for c in classes for k in ([c, R.wire_key(c)] if wire and c in R.WIRE_CLASSES else [c])]
    header = ["configuration", "runs", "seeds", "steps", "valid ppl", "valid loss", "Δ loss vs ref (paired)",
              "ppl vs ref", "tokens/s", "speed-up"] + [f"{c} MB/step" for c in columns] + ["total MB/step"]
    rows = []
    for c in configs:
        fin = final_stats(c)
        ppl, loss = R.mean_std([v[2] for v in fin]), R.mean_std([v[1] for v in fin])
        d = R.mean_std(paired_loss_differences(c, ref) if c is not ref else [])
        sec, tok = speed(c)
        mb = mbs[id(c)]
        row = [c.display(), c.runs_text(), ",".join(str(r.seed) for r in c.used),
               ",".join(sorted({str(r.last_step) for r in c.used})), pm(ppl[0], ppl[1], 2), pm(loss[0], loss[1], 4),
               (f"{d[0]:+.4f}" + ("" if d[1] != d[1] else f" ± {d[1]:.4f}") + f" (n={d[2]})") if d[2] else "",
               f"{100 * (ppl[0] / ref_ppl - 1):+.1f}%" if ppl[2] and ref_ppl == ref_ppl else "",
               f"{tok[0]:.0f}" if tok[0] == tok[0] else "",
               f"{ref_time[0] / sec[0]:.3f}" if sec[0] == sec[0] and ref_time[0] == ref_time[0] else ""]
        row += [f"{mb[k]:.3f}" if mb else "" for k in columns]
        row.append(f"{sum(mb[k] for k in R.DATA_CLASSES):.3f}" if mb else "")
        rows.append(row)
    notes = [f"reference: {ref.label} ({why}); configurations differ in: {', '.join(ref.differ) or 'nothing'}",
             "valid ppl/loss: last evaluation of each run; mean ± sample std (n - 1) over seeds of the complete runs "
             "(partial runs: up to their last flush)",
             "Δ loss: this run's final valid loss minus the reference run's of the same seed",
             "tokens/s and speed-up: median step time after step 3 (timeline steps left out; DiLoCo: mean over the "
             "whole periods of diloco.inner_steps steps after step 3, which hold the outer exchange), mean over seeds; "
             "speed-up = reference step time / this step time",
             "MB/step: bytes all ranks sent per training step, mean of the last 20 steps (DiLoCo: of the last "
             "whole periods of diloco.inner_steps steps, at least 20; control traffic left out)"]
    if wire:
        notes.append("pp_fwd and pp_bwd MB/step: the class total, i.e. the stage-to-stage sends plus the receiving "
                     "stage's tensor-parallel all-gather of the scatter-gathered slices (uncompressed, on the TP "
                     "link); wire: the stage-to-stage sends alone, what a pipeline codec compresses")
    return Table(f"{experiment}: final validation and traffic per configuration", header, rows, notes)


def draw(ax, configs, table, column, reduce=None, wrap=30):
    """Mean ± std over the complete runs of each configuration; partial runs dashed, one line each.
    Labels are wrapped at `wrap` characters (figures.output.short)."""
    drawn = False
    for c in configs:
        color = c.color
        if c.complete:
            b = band(c.complete, table, column, reduce)
            if b is not None:
                s, m, sd = b
                ax.plot(s, m, color=color, lw=1.2, label=short(f"{c.label} (n={len(c.complete)})", wrap))
                if len(c.complete) > 1:
                    ax.fill_between(s, m - sd, m + sd, color=color, alpha=0.2, lw=0)
                drawn = True
        for r in c.partial:
            b = band([r], table, column, reduce)
            if b is not None:
                ax.plot(b[0], b[1], color=color, lw=1.0, ls="--",
                        label=short(f"{c.label} seed {r.seed} (partial, step {r.last_step}/{r.train_steps})", wrap))
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


def log_ticks(ax):
    """Labelled ticks at 1, 2 and 5 times each power of ten on a log y axis, written as plain numbers:
    perplexities span less than a decade late in a run, where matplotlib's default labels one tick
    (10^3) or none."""
    ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())


def curves_figure(experiment, configs, ref):
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 3.8))
    longest = max((r.last_step for cf in configs for r in cf.used), default=0)
    window = max(1, longest // 50)
    ok_train = draw(a, configs, "train", "loss", _running_mean(window), wrap=60)  # 60: the legend spans the figure
    ok_eval = draw(b, configs, "eval", "ppl", wrap=60)
    if not ok_train and not ok_eval:
        plt.close(fig)
        return None
    a.set(xlabel="step", ylabel="training loss (nats)",
          title=f"{experiment}: training loss" + (f" (running mean of {window})" if window > 1 else ""))
    b.set(xlabel="step", ylabel="validation perplexity", title="validation perplexity (Fig. 9)", yscale="log")
    log_ticks(b)
    for cf in configs:
        d = paired_eval_difference(cf, ref) if cf is not ref else None
        if d is not None:
            c.plot(d[0], d[1], color=cf.color, lw=1.2, ls="--" if cf.is_partial else "-")
            if d[3] > 1:
                c.fill_between(d[0], d[1] - d[2], d[1] + d[2], color=cf.color, alpha=0.2, lw=0)
    c.axhline(0, color=ref.color, lw=1.0)
    c.set(xlabel="step", ylabel="Δ validation loss (nats)", title=f"minus {ref.label}, paired by seed")
    # One legend for the three panels, under them (a configuration has one colour everywhere): legends
    # inside the panels covered the curves and each other once labels are long (DiLoCo's settings).
    handles, labels = (a if ok_train else b).get_legend_handles_labels()
    if handles:
        columns = 3 if len(handles) > 2 else len(handles)
        fig.legend(handles, labels, loc="upper center",
                   bbox_to_anchor=(0.5, 0.0), ncol=columns, frameon=False)
    footnote(fig, runs_note(experiment, configs, lambda cf: cf.complete + cf.partial))
    return fig


PARETO_MIN_SPREAD = 0.01  # the plot needs configurations whose MB per step differ by more than 1%


def pareto_figure(experiment, configs):
    """Final validation ppl against total MB per step, one point per configuration, and the Pareto
    front; None with fewer than 2 such points or when their MB per step lie within 1% of each other."""
    pts = []
    for c in configs:
        mb = mb_per_step(c)
        ppl = R.mean_std([v[2] for v in final_stats(c)])
        if mb and ppl[2]:
            pts.append((sum(mb[k] for k in R.DATA_CLASSES), ppl[0], 0.0 if ppl[1] != ppl[1] else ppl[1], c))
    if len(pts) < 2:
        return None
    xs = [p[0] for p in pts]
    if max(xs) - min(xs) <= PARETO_MIN_SPREAD * max(xs):  # one byte count: a front would mean nothing
        return None
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for x, y, e, c in pts:
        ax.errorbar([x], [y], yerr=[e], fmt="o", mfc="none" if c.is_partial else None, color=c.color,
                    capsize=3, label=short(c.display(), 45))
    front, best = [], math.inf
    for x, y, _, _ in sorted(pts, key=lambda p: (p[0], p[1])):
        if y < best:
            front.append((x, y))
            best = y
    ax.plot([p[0] for p in front], [p[1] for p in front], color="0.4", lw=0.8, ls=":", label="Pareto front")
    if min(xs) > 0 and max(xs) / min(xs) > 10:
        ax.set_xscale("log")
    ax.set(xlabel="MB sent per training step (all ranks)", ylabel="final validation perplexity",
           title=f"{experiment}: perplexity against traffic")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the axes: long labels covered the points
    footnote(fig, runs_note(experiment, [p[3] for p in pts]))
    return fig
