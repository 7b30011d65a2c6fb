#!/usr/bin/env python3
"""The schedules study (experiments/schedules/pp4.yaml): does compressed backpropagation still pay
when the pipeline schedule has already removed most of the bubble? Writes paper/schedules-study.md.

    scripts/schedules_study.py [--optcc build/optcc] [--output paper/schedules-study.md]

Part 1, paper scale (nothing trains): `optcc simulate --json --recompute --reference-powersgd` (the
paper's recipe, as scripts/projections.py) for GPT-2.5B and GPT-8.3B on the paper's cluster profile,
every schedule (1f1b; interleaved_1f1b with v = 2 where the layers split into p·v chunks; zb_h1) and
scheme (baseline, cb, cb_fe_sc). Per row: the iteration, the speed-up over the same schedule's
baseline, the critical rank's idle share (the bubble, with waits for peers) and its pp_bwd time.
Part 2, the measured cpu-scale runs of the experiment file, is added when they exist (its section
says so when they do not).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from projections import simulate as paper_recipe_simulate  # noqa: E402

MODELS = [("GPT-2.5B", "experiments/paper/gpt-2.5b.yaml", 52), ("GPT-8.3B", "experiments/paper/gpt-8.3b.yaml", 72)]
PROFILE = "paper-a100-ib200"
SCHEDULES = [("1f1b", 1), ("interleaved_1f1b", 2), ("zb_h1", 1)]
SCHEMES = "baseline,cb,cb_fe_sc"
PP = 4  # both paper configs: TP8 x PP4 x DP4


def simulate(optcc, config, schedule, chunks):
    return paper_recipe_simulate(optcc, config, PROFILE, SCHEMES,
                                 [f"parallel.schedule={schedule}", f"parallel.virtual_stages={chunks}"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--optcc", default="build/optcc")
    ap.add_argument("--output", default="paper/schedules-study.md")
    args = ap.parse_args()
    rows, gains = [], {}
    for model, config, layers in MODELS:
        for schedule, chunks in SCHEDULES:
            if layers % (PP * chunks):
                rows.append(f"| {model} | {schedule} (v={chunks}) | – | – | – | – | – | {layers} layers do not split "
                            f"into {PP}·{chunks} equal chunks (config refuses it) |")
                continue
            j = simulate(args.optcc, config, schedule, chunks)
            label = f"{schedule} (v={chunks})" if chunks > 1 else schedule
            for s in j["schemes"]:
                b = s["breakdown_s"]
                rows.append(f"| {model} | {label} | {s['scheme']} | {s['iteration_s']:.3f} | {s['speedup']:.3f} | "
                            f"{b['idle'] / s['iteration_s'] * 100:.1f}% | {b['pp_bwd'] * 1e3:.1f} | |")
                gains[(model, label, s["scheme"])] = (s["speedup"], s["iteration_s"])
    lines = [
        "# Pipeline schedules with compressed traffic",
        "",
        "Written by `scripts/schedules_study.py` for the experiment `experiments/schedules/pp4.yaml`. The "
        "question: does compressed backpropagation (CB) still pay when the schedule has already removed most "
        "of the bubble? The schedules (docs/design.md §1.3, §1.5, §1.6): Megatron's non-interleaved 1F1B, "
        "interleaved 1F1B with v = 2 model chunks per stage, and ZB-H1 (each backward split into B, the input "
        "gradient, and W, the weight gradients, with the W's filling the cool-down). Analytic bubbles with "
        "equal F, B and W (schedule_test's closed forms): 1F1B (p−1)/(m+p−1); interleaved (p−1)/(v·m+p−1); "
        "ZB-H1 (p−1)/(3m+p−1), for m ≥ p.",
        "",
        "## Paper scale (simulator)",
        "",
        f"`optcc simulate --json --recompute --reference-powersgd` on `{PROFILE}` (the paper's cluster "
        "profile; the recipe of paper/projected-speedups.md), TP8 x PP4 x DP4, m = 16. Predictions, not "
        "measurements. The speed-up is over the same schedule's baseline; idle is the critical rank's "
        "time waiting (the bubble and waits for peers); pp_bwd its time in backward pipeline messages.",
        "",
        "| model | schedule | scheme | iteration (s) | speed-up | idle share | pp_bwd (ms) | note |",
        "|---|---|---|---|---|---|---|---|",
    ] + rows
    summary = []
    for model, _, _ in MODELS:
        parts = []
        for schedule, chunks in SCHEDULES:
            label = f"{schedule} (v={chunks})" if chunks > 1 else schedule
            if (model, label, "cb_fe_sc") in gains:
                cb = gains[(model, label, "cb")][0]
                parts.append(f"{label}: cb {cb:.3f}x, cb_fe_sc {gains[(model, label, 'cb_fe_sc')][0]:.3f}x")
        summary.append(f"- {model}: " + "; ".join(parts) + ".")
    lines += ["", "Speed-ups over each schedule's own baseline:", ""] + summary
    cb = [v[0] for k, v in gains.items() if k[2] == "cb"]
    full = [v[0] for k, v in gains.items() if k[2] == "cb_fe_sc"]
    lines += ["", f"The simulator's answer at paper scale: CB alone gains {min(cb):.3f}x to {max(cb):.3f}x and "
              f"CB+FE+SC {min(full):.3f}x to {max(full):.3f}x whatever the schedule. Epilogue-only CB compresses "
              "few messages and the backward messages were a small part of the critical path under 1F1B already; "
              "the schedules that shrink the bubble leave the DP and embedding all-reduces after the pipeline, "
              "which FE and SC shorten, as they were. A prediction of the cost model, not a measurement; the "
              "cpu-scale runs below measure it."]
    lines += [
        "",
        "## CPU scale (measured)",
        "",
        "Not run yet: `slurm/local experiments/schedules/pp4.yaml` (54 runs of the mini GPT with 8 layers "
        "on TP1 x PP4 x DP2) gives the measured bubble per rank (`/timing`: 1 − pipeline_compute_seconds / "
        "pipeline_seconds), the activation peak per rank (`/memory_components`) and the paired "
        "validation-loss differences; this section will hold them.",
        "",
    ]
    with open(args.output, "w") as f:
        f.write("\n".join(lines))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    sys.exit(main())
