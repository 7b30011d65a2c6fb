#!/usr/bin/env python3
"""Predicted (optcc simulate) vs measured (emulated runs) step time per scheme.

  simulator_validation.py RUN.h5 [RUN.h5 ...] [--config C] [--profile this-machine]
                          [--dp-rank 16] [--max-error 0.15] [--optcc build/optcc] [--json]

RUN.h5: results of scripts/run_emulation.sh (one per scheme). Each file's scheme (root attribute
compression_scheme) is simulated on --config with that scheme (cb_fe_sc with PowerSGD rank
--dp-rank, as run_emulation.sh runs it) on --profile (calibrate it first on a quiet machine:
`optcc calibrate --config C`), and compared with the file's median step (scripts/emulation_table.py's
method). Exit status 1 when any |predicted - measured| / measured exceeds --max-error.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from emulation_table import summarise  # noqa: E402


def predict(args, scheme):
    cmd = [args.optcc, "simulate", "--config", args.config, "--profile", args.profile, "--schemes", "config",
           "--json", "--set", f"compression.scheme={scheme}"]
    if args.vocab:
        cmd += ["--set", f"model.vocab_size={args.vocab}"]
    if scheme == "cb_fe_sc":
        cmd += ["--set", f"compression.dp={{name: powersgd, rank: {args.dp_rank}, error_feedback: true, warmup_steps: 0}}"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["schemes"][0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--config", default="experiments/emulation/mini-3d-paper-regime.yaml")
    ap.add_argument("--profile", default="this-machine")
    ap.add_argument("--vocab", type=int, default=0, help="model.vocab_size when the dataset is not prepared")
    ap.add_argument("--dp-rank", type=int, default=16)
    ap.add_argument("--max-error", type=float, default=0.15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--optcc", default="build/optcc")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows, worst = [], 0.0
    for path in args.files:
        m = summarise(path, args.warmup)
        p = predict(args, m["scheme"])
        err = (p["iteration_s"] - m["step_s"]) / m["step_s"]
        worst = max(worst, abs(err))
        rows.append({"scheme": m["scheme"], "measured_s": m["step_s"], "predicted_s": p["iteration_s"],
                     "error": err, "file": path})
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"{'scheme':<10} {'measured':>10} {'predicted':>10} {'error':>8}")
        for r in rows:
            print(f"{r['scheme']:<10} {r['measured_s']:>9.3f}s {r['predicted_s']:>9.3f}s {r['error'] * 100:>7.1f}%")
        print(f"worst |error| {worst * 100:.1f}% (limit {args.max_error * 100:.0f}%)")
    return 1 if worst > args.max_error else 0


if __name__ == "__main__":
    sys.exit(main())
