"""Fig. 12: tensor memory by component at the last recorded step (/memory_components)."""
import numpy as np

import optcc_results as R
from figures.output import Table, footnote, plt, runs_note, short

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
            per.append({k: float(m[k][last].max()) / 2**20 if k in m else 0.0
                        for k in R.MEMORY_COMPONENTS + ["tracked_peak"]})
        if per:
            out.append((c, {k: float(np.mean([p[k] for p in per])) for k in per[0]}))
    return out


def memory_outputs(experiment, configs):
    rows = memory_rows(configs)
    if not rows:
        return None, None
    # Horizontal bars, one per configuration, labelled on the left: labels of several lines (DiLoCo's
    # settings) overlapped each other under vertical bars.
    labels = [short(r[0].display(), 45) for r in rows]
    lines = sum(max(1, l.count("\n") + 1) for l in labels)
    fig, ax = plt.subplots(figsize=(9, max(2.5, 0.16 * lines + 0.35 * len(rows) + 1.2)))
    left = np.zeros(len(rows))
    for j, k in enumerate(R.MEMORY_COMPONENTS):
        v = np.array([r[1][k] for r in rows])
        ax.barh(range(len(rows)), v, left=left, color=f"C{j}", label=k)
        left += v
    rest = np.array([max(0.0, r[1]["tracked_peak"] - b) for r, b in zip(rows, left)])
    ax.barh(range(len(rows)), rest, left=left, color="0.85", hatch="//", edgecolor="0.6", lw=0,
            label="rest of the tracked peak")
    ax.set_yticks(range(len(rows)), labels)
    ax.invert_yaxis()  # the first configuration (the reference) on top
    ax.set(xlabel="MiB", title=f"{experiment}: tensor memory by component (Fig. 12)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1))
    footnote(fig, runs_note(experiment, [c for c, _ in rows],
                            lambda c: [r for r in c.used if r.rows("memory_components")]))
    header = ["configuration"] + [f"{k} MiB" for k in R.MEMORY_COMPONENTS] + ["tracked peak MiB"]
    body = [[c.display()] + [f"{m[k]:.3f}" for k in R.MEMORY_COMPONENTS] + [f"{m['tracked_peak']:.3f}"]
            for c, m in rows]
    notes = ["each component's largest value over the ranks at the last recorded step (so a bar may add "
             "parts of different ranks), mean over seeds; /memory_components, harness/records/memory_tracker.h",
             "activations_peak: peak during the pipeline schedule above the memory held when it started"]
    return fig, Table(f"{experiment}: tensor memory by component (MiB)", header, body, notes)
