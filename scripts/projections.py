#!/usr/bin/env python3
"""Writes paper/projected-speedups.md: the scale simulator's iteration time per scheme for the
paper's models (and GPT-3 175B) under the paper's cluster profile and a current H100 profile.

    scripts/projections.py [--optcc build/optcc] [--output paper/projected-speedups.md]

Runs `optcc simulate --json --recompute --reference-powersgd` (the paper's recipe: full activation
recomputation, PowerSGD on every >= 2-D DP gradient) for each model and profile; nothing trains.
`make projections` calls it.
"""
import argparse
import json
import subprocess
import sys

MODELS = [
    ("GPT-2.5B", "experiments/paper/gpt-2.5b.yaml", "TP8 x PP4 x DP4, 128 GPUs, m = 16 (docs/design.md §8.1)"),
    ("GPT-8.3B", "experiments/paper/gpt-8.3b.yaml", "TP8 x PP4 x DP4, 128 GPUs, m = 16 (docs/design.md §8.1)"),
    ("GPT-175B", "experiments/paper/gpt-175b.yaml", "TP8 x PP16 x DP4, 512 GPUs, m = 64 (see the config)"),
]
PROFILES = ["paper-a100-ib200", "h100-ndr400x8"]
SCHEMES = "baseline,cb,cb_fe,cb_fe_sc,cb_nonlep"


def simulate(optcc, config, profile, schemes=SCHEMES, sets=()):
    """`optcc simulate --json` with the paper's recipe (full recomputation, PowerSGD on every >= 2-D DP
    gradient), `--set` each of `sets`; its parsed output. scripts/schedules_study.py uses it too."""
    cmd = [optcc, "simulate", "--config", config, "--profile", profile, "--schemes", schemes, "--json",
           "--recompute", "--reference-powersgd"]
    for s in sets:
        cmd += ["--set", s]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def comm_class(breakdown):
    comm = {k: v for k, v in breakdown.items() if k in ("tp", "pp_fwd", "pp_bwd", "dp", "embedding")}
    return max(comm, key=comm.get)


def profile_text(p):
    return (f"- **{p['name']}** ({p['description']}): {p['forward_flops_per_s'] / 1e12:.1f} TFLOP/s achieved per "
            f"GPU, memory {p['memory_bytes_per_s'] / 1e9:.0f} GB/s, {p['devices_per_node']} GPUs per node, "
            f"intra-node {p['intra_bytes_per_s'] / 1e9:.0f} GB/s per pair, {p['nics_per_node']} NIC(s) of "
            f"{p['inter_bytes_per_s'] / 1e9:.0f} GB/s per node, latencies {p['intra_latency_s'] * 1e6:.1f} / "
            f"{p['inter_latency_s'] * 1e6:.1f} us (file: experiments/profiles/{p['name']}.yaml, sources there).")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--optcc", default="build/optcc")
    ap.add_argument("--output", default="paper/projected-speedups.md")
    args = ap.parse_args()
    rows, profiles, sc = [], {}, {}
    for model, config, layout in MODELS:
        for prof in PROFILES:
            j = simulate(args.optcc, config, prof)
            profiles[prof] = j["profile"]
            for s in j["schemes"]:
                b = s["breakdown_s"]
                rows.append(f"| {model} | {prof} | {s['scheme']} | {s['iteration_s']:.3f} | {s['speedup']:.3f} | "
                            f"{s['dominant']} | {comm_class(b)} ({b[comm_class(b)] / s['iteration_s'] * 100:.0f}%) | "
                            f"{s['inter_node_share'] * 100:.1f}% |")
                if s["scheme"] == "cb_fe_sc":
                    sc[(model, prof)] = s["speedup"]
    lines = [
        "# Projected iteration time per scheme (scale simulator)",
        "",
        "Written by `scripts/projections.py` (`make projections`) from `optcc simulate --json --recompute "
        "--reference-powersgd` (harness/perfmodel/simulator.h): a discrete-event replay of one iteration "
        "(1F1B, every micro-batch's forward and backward, TP all-reduces, p2p messages, DP and embedding "
        "collectives, compression arithmetic, shared NICs) with the traffic model's bytes. Predictions, "
        "not measurements: nothing here ran on these clusters.",
        "",
        "Layouts: " + "; ".join(f"{m}: {lay}" for m, _, lay in MODELS) + ". The paper's recipe: fp32 "
        "parameters and communication, full activation recomputation (backward = 3x forward FLOPs, 6 TP "
        "all-reduces per layer), CB = low-rank rank 16 on epilogue gradients with LEP, FE, SC = PowerSGD "
        "rank 128 on stages 0-2 (every >= 2-D gradient).",
        "",
        "Profiles (assumptions):",
        "",
    ]
    lines += [profile_text(profiles[p]) for p in PROFILES]
    lines += [
        "",
        "Not modelled: overlap of communication with computation (optcc and the paper's Megatron v2.5 "
        "local DDP overlap none), kernel launch and framework overheads, data loading, control traffic.",
        "",
        "| model | profile | scheme | iteration (s) | speed-up | dominant class | largest communication class "
        "(share) | inter-node share |",
        "|---|---|---|---|---|---|---|---|",
    ] + rows
    a = ", ".join(f"{m} {sc[(m, PROFILES[0])]:.3f}x" for m, _, _ in MODELS)
    h = ", ".join(f"{m} {sc[(m, PROFILES[1])]:.3f}x" for m, _, _ in MODELS)
    lines += [
        "",
        f"CB+FE+SC over the baseline: on the paper's cluster profile {a}; on the H100 profile {h}. "
        "The paper claims CB+FE+SC gives a real speed-up on its cluster (its Table 2 numbers are not known "
        "here, docs/design.md §11); the simulator agrees in direction: with one 200 Gb/s HCA per 8 GPUs the DP and "
        "embedding all-reduces after the pipeline are the inter-node time that FE and SC remove. On the "
        "H100 profile every GPU has its own 400 Gb/s NIC (16x the inter-node bandwidth per GPU) while "
        "compute is 3.2x faster, so the inter-node share and with it the gain from compression shrink. "
        "CB alone moves little here: epilogue-only CB compresses only the gradients sent in the "
        "cool-down flush, and the PP messages are a small part of the critical path; nearly all of "
        "the gain is SC's (PowerSGD on the DP all-reduce of stages 0-2). Shares are of the critical "
        "rank's iteration, and the critical rank can change between schemes (175B: stages 3-15 keep "
        "raw DP all-reduces under SC).",
        "",
    ]
    with open(args.output, "w") as f:
        f.write("\n".join(lines))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    sys.exit(main())
