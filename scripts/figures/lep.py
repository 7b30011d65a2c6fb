"""Fig. 11: the LEP error against the activation change (/lep_orthogonality)."""
import numpy as np

from figures.output import Table, footnote, plt, runs_note
from figures.quality import draw

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
    footnote(fig, runs_note(experiment, have,
                            lambda c: [r for r in c.complete + c.partial if r.rows("lep_orthogonality")]))
    header = ["configuration", "rows", "mean abs(cos)", "mean cos", "std cos", "mean error", "mean Δ"]
    body = []
    for c in have:
        t = [r.table("lep_orthogonality") for r in c.used if r.rows("lep_orthogonality")]
        cos = np.concatenate([x["cosine"] for x in t])
        err = np.concatenate([x["error_mean"] for x in t])
        dlt = np.concatenate([x["delta_mean"] for x in t])
        body.append([c.display(), str(len(cos)), f"{np.mean(np.abs(cos)):.4f}", f"{np.mean(cos):+.4f}",
                     f"{np.std(cos):.4f}", f"{np.mean(err):+.3e}", f"{np.mean(dlt):+.3e}"])
    notes = ["all rows (steps, last-stage ranks, micro-batches) of the used runs; docs/design.md §3.3 defines the pairs"]
    return fig, Table(f"{experiment}: LEP error against activation change", header, body, notes)
