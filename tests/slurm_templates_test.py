#!/usr/bin/env python3
"""Checks every slurm/*.sbatch against the tree a fresh clone has (git ls-files).

  slurm_templates_test.py REPO_ROOT

Slurm opens --output/--error/--input and enters --chdir BEFORE the batch script runs, so a
`mkdir -p` in the script comes too late: a missing directory kills the job with no output anywhere.
Paths are taken relative to --chdir when given, else to the submit directory (the repository root,
as the templates' usage lines submit from). Also checks that every #SBATCH line sits before the
first command (sbatch ignores the ones after it), and that slurm/experiment.sbatch (an array task of
slurm/submit) asks for no GPUs, memory or array range itself: those come from the experiment's slurm
block on submit's command line (--gpus-per-task, --mem, --exclusive, --array=...%N), and an #SBATCH
--gpus-per-node or --mem-per-cpu there would add to them or clash (sbatch refuses --mem with
--mem-per-cpu). A template that runs `optcc train` itself must ask for a stop signal before its time
limit (--signal=B:USR1@N), or the run dies there without a checkpoint (the array template gets it
from slurm/submit). Exit 0 = all good, 1 = a problem (each printed), 77 = not a git checkout (skipped).
"""
import os
import re
import shlex
import subprocess
import sys

# Options whose value is a path Slurm opens or enters before the script runs.
PATH_OPTIONS = {"--output": "o", "--error": "e", "--input": "i", "--chdir": "D"}
LONG_OF = {short: long for long, short in PATH_OPTIONS.items()}
# Set per experiment by slurm/submit; an array task's template must leave them to it.
SUBMIT_OWNED = {"--array", "-a", "--gpus", "-G", "--gpus-per-node", "--gpus-per-task", "--gres", "--mem",
                "--mem-per-cpu", "--mem-per-gpu", "--exclusive", "--ntasks", "-n", "--nodes", "-N"}
ARRAY_TEMPLATE = "experiment.sbatch"


def tracked_dirs(root):
    out = subprocess.run(["git", "-C", root, "ls-files", "-z"], capture_output=True, check=True).stdout
    dirs = {"."}
    for name in out.decode().split("\0"):
        parent = os.path.dirname(name)
        while parent:
            dirs.add(parent)
            parent = os.path.dirname(parent)
    return dirs


def sbatch_options(text):
    """(option, value, line number) of each #SBATCH line read by sbatch, and the misplaced ones."""
    options, ignored, seen_command = [], [], False
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("#SBATCH"):
            if seen_command:
                ignored.append(number)
                continue
            words = shlex.split(stripped[len("#SBATCH"):], comments=True)
            for i, word in enumerate(words):
                m = re.fullmatch(r"--([a-z-]+)(?:=(.*))?|-([a-zA-Z])(.*)", word)
                if not m:
                    continue
                name = "--" + m.group(1) if m.group(1) else LONG_OF.get(m.group(3), "-" + m.group(3))
                value = m.group(2) if m.group(1) else m.group(4)
                if not value and i + 1 < len(words) and not words[i + 1].startswith("-"):
                    value = words[i + 1]  # "--output PATH" / "-o PATH"
                options.append((name, value, number))
        elif stripped and not stripped.startswith("#"):
            seen_command = True
    return options, ignored


def check(root, path, dirs):
    problems = []
    with open(path) as f:
        options, ignored = sbatch_options(f.read())
    rel = os.path.relpath(path, root)
    for number in ignored:
        problems.append(f"{rel}:{number}: #SBATCH after the first command: sbatch ignores it")
    if os.path.basename(path) == ARRAY_TEMPLATE:
        for opt, _, number in options:
            if opt in SUBMIT_OWNED:
                problems.append(f"{rel}:{number}: #SBATCH {opt}: slurm/submit sets it from the experiment's slurm "
                                "block (GPUs per task, memory, throttle); here it would add to or clash with that. "
                                "Fix: remove it, and set the key in the experiment file's slurm: block")
    with open(path) as f:
        trains = re.search(r"\boptcc\b.*\btrain\b|\$OPTCC\S*\s+train\b", f.read()) is not None
    if trains and os.path.basename(path) != ARRAY_TEMPLATE and not any(opt == "--signal" and (value or "").startswith("B:USR1@") for opt, value, _ in options):
        problems.append(f"{rel}: trains but asks for no --signal=B:USR1@<seconds>: at its time limit the run dies "
                        "without a checkpoint. Fix: add #SBATCH --signal=B:USR1@300 and pass the signal on to srun")
    values = {opt: (value, number) for opt, value, number in options if opt in PATH_OPTIONS}
    base = "."
    if "--chdir" in values:
        base, number = values["--chdir"]
        if os.path.isabs(base) or os.path.normpath(base) not in dirs:
            problems.append(f"{rel}:{number}: --chdir={base} is not a directory of a fresh clone")
    for opt in ("--output", "--error", "--input"):
        if opt not in values:
            continue
        value, number = values[opt]
        directory = os.path.normpath(os.path.join(base, os.path.dirname(value) or "."))
        if "%" in directory or os.path.isabs(value) or directory not in dirs:
            problems.append(f"{rel}:{number}: {opt}={value}: directory '{directory}' does not exist in a fresh "
                            "clone (Slurm opens it before the script runs; the job dies with no output). Fix: "
                            "drop the option (Slurm's default is the submit directory) or use a tracked directory")
    return problems


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    try:
        dirs = tracked_dirs(root)
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"skipped: {root} is not a git checkout ({e})")
        return 77
    templates = sorted(os.path.join(root, "slurm", n) for n in os.listdir(os.path.join(root, "slurm"))
                       if n.endswith(".sbatch"))
    if not templates:
        print(f"no slurm/*.sbatch under {root}")
        return 1
    problems = [p for t in templates for p in check(root, t, dirs)]
    for p in problems:
        print(p)
    print(f"{len(templates)} templates, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
