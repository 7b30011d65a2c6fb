#!/usr/bin/env python3
"""The result checks of slurm/testing/integration_test.sh, on an expanded experiment's runs:

  check_results.py runs  PLAN.json RESULTS_ROOT   each run's <run>.h5 exists and its train table reaches
                                                  the config's train.train_steps (h5py)
  check_results.py index PLAN.json RESULTS_ROOT   RESULTS_ROOT/index.csv lists every run of the
                                                  experiment, status complete, last step = train_steps

PLAN.json is `optcc sweep EXP --scale S --json`. Exit 0 = all good; 1 = failures, each printed.
"""
import csv
import json
import os
import sys

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from optcc_results import open_results  # noqa: E402  (SWMR read: also while a run flushes)


def results_path(plan, root, run):
    return os.path.join(root, os.path.relpath(plan["results_dir"], "results"), run["run"] + ".h5")


def check_run(plan, root, run):
    """(train_steps, problems) of one run's results file."""
    path = results_path(plan, root, run)
    if not os.path.isfile(path):
        return None, [f"{run['run']}: {path} does not exist"]
    with open_results(path) as f:
        config = f.attrs["config"]
        config = yaml.safe_load(config.decode() if isinstance(config, bytes) else config)
        steps = int(config["train"]["train_steps"])
        if "train/step" not in f or f["train/step"].shape[0] == 0:
            return steps, [f"{run['run']}: {path} has no train/step rows"]
        last = int(f["train/step"][-1])
    if last != steps:
        return steps, [f"{run['run']}: {path} ends at step {last}, train.train_steps is {steps}"]
    print(f"ok: {path}: train/step reaches {last} = train.train_steps")
    return steps, []


def check_runs(plan, root):
    return [p for run in plan["runs"] for p in check_run(plan, root, run)[1]]


def check_index(plan, root):
    path = os.path.join(root, "index.csv")
    if not os.path.isfile(path):
        return [f"{path} does not exist"]
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("experiment") == plan["experiment"]]
    by_run = {r["run"]: r for r in rows}
    problems = []
    for run in plan["runs"]:
        row = by_run.get(run["run"])
        if row is None:
            problems.append(f"{path}: no row for experiment {plan['experiment']}, run {run['run']} (rows: {rows})")
            continue
        steps, _ = check_run(plan, root, run)
        if row.get("status") != "complete" or (steps is not None and str(row.get("last_step")) != str(steps)):
            problems.append(f"{path}: run {run['run']}: status {row.get('status')!r}, last_step "
                            f"{row.get('last_step')!r}; expected 'complete' and {steps}")
        else:
            print(f"ok: {path}: {run['run']} complete at step {steps}")
    return problems


def main(argv):
    if len(argv) != 3 or argv[0] not in ("runs", "index"):
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        plan = json.load(f)
    problems = (check_runs if argv[0] == "runs" else check_index)(plan, argv[2])
    for p in problems:
        print(f"FAIL: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
