"""Fig. 10: the mean time breakdown of the timeline steps (/breakdown; scripts/emulation_table.py)."""
import numpy as np

import emulation_table
from figures.output import Table, footnote, plt, runs_note, short

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
    ax.set_yticks(range(len(rows)), [short(c.display()) for c, _ in rows])
    ax.invert_yaxis()
    ax.set(xlabel="ms per step on the critical-path rank", title=f"{experiment}: time breakdown (Fig. 10)")
    ax.legend(ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    footnote(fig, runs_note(experiment, [c for c, _ in rows], lambda c: [r for r in c.used if r.rows("breakdown")]))
    header = ["configuration", "step ms"] + [f"{k} ms" for k in emulation_table.CATEGORIES] + \
        ["step s", "speed-up", "speed-up at equal compute", "inter-node emulated s/step (all ranks)"]
    body = []
    for c, m in rows:
        eq = (base["pipeline_s"] + base["after_pipeline_s"]) / (base["pipeline_s"] + m["after_pipeline_s"])
        body.append([c.display(), f"{m['breakdown_step_ms']:.1f}"] +
                    [f"{m[k + '_ms']:.1f}" for k in emulation_table.CATEGORIES] +
                    [f"{m['step_s']:.3f}", f"{base['step_s'] / m['step_s']:.3f}", f"{eq:.3f}",
                     f"{m['inter_emulated_s_per_step']:.3f}"])
    notes = ["breakdown: mean over the timeline steps (log.timeline_steps) and seeds; the other columns: "
             "scripts/emulation_table.py defines them (median over the steps after the third; under DiLoCo the mean over "
             "its whole periods of H steps, outer exchange included); the emulated "
             "inter-node seconds do not depend on the machine's load, the measured times do"]
    return fig, Table(f"{experiment}: time breakdown per step", header, body, notes)
