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
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(rows) + 3), 4))
    bottom = np.zeros(len(rows))
    for j, k in enumerate(R.MEMORY_COMPONENTS):
        v = np.array([r[1][k] for r in rows])
        ax.bar(range(len(rows)), v, bottom=bottom, color=f"C{j}", label=k)
        bottom += v
    rest = np.array([max(0.0, r[1]["tracked_peak"] - b) for r, b in zip(rows, bottom)])
    ax.bar(range(len(rows)), rest, bottom=bottom, color="0.85", hatch="//", edgecolor="0.6", lw=0,
           label="rest of the tracked peak")
    ax.set_xticks(range(len(rows)), [short(r[0].display()) for r in rows], rotation=20, ha="right")
    ax.set(ylabel="MiB", title=f"{experiment}: tensor memory by component (Fig. 12)")
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
