#!/usr/bin/env python3
"""The runs of an experiment file, as `optcc sweep --json` expands them, and the rules every runner
shares (slurm/submit's array tasks, slurm/local): where a run's files are, when it is finished, how it
is started or resumed. Also the entry point of one array task:

  python3 slurm/experiment_runs.py task EXP.yaml SCALE INDEX [-- extra optcc train args]

Environment (all optional; slurm/submit and slurm/local document the same list):
  OPTCC              the optcc binary (default build/optcc, relative to the repository root)
  PYTHON             the Python with h5py/matplotlib for the index and figures (default /usr/bin/python3)
  OPTCC_RESULTS      the results root (default results): a run writes OPTCC_RESULTS/<experiment>/<run>.h5;
                     any other value adds --set log.dir=... and --set checkpoint.dir=... to each run, so
                     its results and checkpoints go there instead (tests use a temporary directory)
  OPTCC_FIGURES      where make_figures.py writes (default paper; OPTCC_RESULTS/figures when
                     OPTCC_RESULTS is set to another place, so a trial leaves nothing in the repository)

A run of kind train is `optcc train <args> <extra> --resume auto`; a run of kind benchmark is its
program with the sweep's options (extra train args are not passed to it), one process.
Rules:
  finished  <results dir>/<run>.done exists. It is written after `optcc train` exits 0, i.e. the run
            reached train.train_steps; a finished run is skipped (delete the .done file, and the
            run's checkpoint directory to start from step 0, to run it again).
  resume    every train run is started with --resume auto: it continues from its checkpoint directory's
            newest checkpoint when there is one (a requeued or resubmitted task), else starts at step 0.
"""
import datetime
import json
import os
import re
import shlex
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Settings:
    """The scripts' environment variables, resolved against the repository root."""

    def __init__(self, env=os.environ):
        self.optcc = os.path.join(ROOT, env.get("OPTCC", "build/optcc"))
        default_python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else "python3"
        self.python = env.get("PYTHON", default_python)
        self.results = env.get("OPTCC_RESULTS", "results")
        # A trial's figures go with its results (one place, given once); the repository's otherwise.
        self.figures = env.get("OPTCC_FIGURES", os.path.join(self.results, "figures") if self.redirected() else "paper")

    def redirected(self):
        """True when results go somewhere else than the experiment files' results/."""
        return os.path.normpath(self.results) != "results"


def count(n, noun):
    """'1 run', '2 runs'."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def run_optcc(settings, args):
    """Runs optcc in the repository root; its stdout, or exits with its error."""
    if not os.access(settings.optcc, os.X_OK):
        fail(f"OPTCC={settings.optcc} is not an executable. Fix: build it (make build) or set OPTCC to the binary.")
    p = subprocess.run([settings.optcc, *args], cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        fail(f"`{shlex.join(['optcc', *args])}` exited {p.returncode} (its error is above)")
    return p.stdout


def experiment_path(path):
    """EXP as optcc sees it from the repository root (relative when inside it)."""
    full = os.path.abspath(path)
    if not os.path.isfile(full):
        fail(f"experiment file {path} does not exist (looked at {full})")
    rel = os.path.relpath(full, ROOT)
    return full if rel.startswith("..") else rel


def check_runs(settings, exp, scale):
    """`optcc sweep EXP --scale S --check`: every run's config loads and validates (and a scale that
    asks for GPUs has a CUDA build), else optcc names the problem and this exits."""
    run_optcc(settings, ["sweep", exp, "--scale", scale, "--check"])


def expand(settings, exp, scale, check=False):
    """`optcc sweep EXP --scale S --json` as a dict; with check, check_runs first."""
    if check:
        check_runs(settings, exp, scale)
    return json.loads(run_optcc(settings, ["sweep", exp, "--scale", scale, "--json"]))


class Run:
    """One run of an expanded experiment, with its files under the results root in force."""

    def __init__(self, settings, plan, run):
        self.index = run["index"]
        self.name = run["run"]
        self.kind = run.get("kind", "train")  # train | benchmark (args start with the program)
        self.world_size = run["world_size"]
        self.args = list(run["args"])
        self.axes = dict(run.get("axes") or {})       # grid axis -> this run's value
        self.compression = run.get("compression") or ""  # what it compresses (optcc's compression label)
        self.match_regime = run.get("match_regime") or ""  # network.match_regime ("" off; from:FILE reuses)
        experiment_dir = os.path.relpath(plan["results_dir"], "results")
        self.results_dir = os.path.join(settings.results, experiment_dir)
        self.results = os.path.join(self.results_dir, os.path.basename(run["results"]))
        self.checkpoint_dir = run.get("checkpoint_dir") or ""
        if settings.redirected():
            self.redirect(plan, run)
        self.marker = os.path.join(self.results_dir, self.name + ".done")
        self.set_where = {}  # (TERM, K=V) of each --set-where -> whether this run matches TERM (bind_set_where)

    def own_extra(self, extra):
        """The extra arguments this run gets: each `--set-where TERM K=V` becomes `--set K=V` where the run
        matches TERM and is left out elsewhere (bind_set_where decided which); the rest as given."""
        out, i = [], 0
        while i < len(extra):
            if extra[i] == "--set-where":
                term, kv = extra[i + 1], extra[i + 2]
                if (term, kv) not in self.set_where:
                    fail(f"internal: --set-where {term} {kv} was not bound to the runs (bind_set_where)")
                if self.set_where[(term, kv)]:
                    out += ["--set", kv]
                i += 3
            else:
                out.append(extra[i])
                i += 1
        return out

    def redirect(self, plan, run):
        """Results (and checkpoints) under settings.results: later options win over the sweep's."""
        if self.kind == "benchmark":
            self.args.append(f"--benchmark_out={self.results}")
            return
        rel = os.path.relpath(run["checkpoint_dir"], plan["results_dir"])
        if rel.startswith(".."):  # checkpoints outside the results dir: give them one inside
            rel = os.path.join("ckpt", self.name)
        self.checkpoint_dir = os.path.join(self.results_dir, rel)
        self.args += ["--set", f"log.dir={self.results_dir}", "--set", f"checkpoint.dir={self.checkpoint_dir}"]

    def finished(self):
        return os.path.exists(os.path.join(ROOT, self.marker))

    def derives_regime(self):
        """True when the run derives its emulated links at its start (network.match_regime: a paper config)."""
        return self.kind == "train" and bool(self.match_regime) and not self.match_regime.startswith("from:")

    def has_checkpoint(self):
        return bool(self.checkpoint_dir) and os.path.exists(os.path.join(ROOT, self.checkpoint_dir, "latest"))

    def state(self):
        """'finished: ... skipped', 'resumes from DIR' or 'starts at step 0'."""
        if self.finished():
            return f"finished: {self.marker} exists, skipped"
        if self.has_checkpoint():
            return f"resumes from {self.checkpoint_dir}"
        return "starts at step 0"

    def train_args(self, extra):
        """optcc's arguments: the sweep's, the caller's extra ones, then --resume auto (unless given).
        A benchmark run's are the sweep's (program and options) only: extra train args do not apply."""
        if self.kind == "benchmark":
            return list(self.args)
        extra = self.own_extra(extra)
        args = self.args + list(extra)
        if not any(a == "--resume" or a.startswith("--resume=") for a in extra):
            args += ["--resume", "auto"]
        return args

    def mark_finished(self, command, extra=()):
        os.makedirs(os.path.join(ROOT, self.results_dir), exist_ok=True)
        with open(os.path.join(ROOT, self.marker), "w") as f:
            f.write(f"finished {datetime.datetime.now().isoformat(timespec='seconds')}\n")
            f.write(f"slurm job {os.environ.get('SLURM_JOB_ID', '-')}\n")
            f.write(f"command {shlex.join(command)}\n")
            f.write(f"extra {shlex.join(extra)}\n")

    def finished_with_other_extra(self, extra):
        """The extra arguments the finished run had, when they differ from `extra` (else None). A
        marker without an `extra` line (older runners) counts as no extra arguments."""
        if not self.finished():
            return None
        recorded = ""
        with open(os.path.join(ROOT, self.marker)) as f:
            for line in f:
                if line.startswith("extra "):
                    recorded = line[len("extra "):].strip()
        return None if recorded == shlex.join(extra) else (recorded or "none")


def check_extra(extra):
    """The extra arguments for optcc train: only --set K=V, --set-where AXIS=VALUES K=V (bind_set_where)
    and --resume [DIR|auto] (the sweep gives --config, the runner --nproc). Calls fail() naming the
    first other token (a typo such as --onyl would otherwise fail every run)."""
    i = 0
    while i < len(extra):
        a = extra[i]
        if a.startswith("--set=") or a.startswith("--resume="):
            i += 1
        elif a == "--set":
            if i + 1 >= len(extra) or "=" not in extra[i + 1]:
                fail("extra arguments: --set needs section.key=value after it")
            i += 2
        elif a == "--set-where":
            if i + 2 >= len(extra) or "=" not in extra[i + 1] or "=" not in extra[i + 2]:
                fail("extra arguments: --set-where needs AXIS=VALUE[,VALUE...] and section.key=value after it, "
                     "e.g. --set-where dp=diloco_h16 diloco.inner_steps=10")
            i += 3
        elif a == "--resume":
            i += 2 if i + 1 < len(extra) and not extra[i + 1].startswith("-") else 1
        else:
            fail(f"extra argument {a!r}: extra arguments go to every run's optcc train, which takes only "
                 "--set section.key=value, --set-where AXIS=VALUES section.key=value and --resume [DIR|auto] "
                 "here (the runner's own options: --scale, --only, --dry-run)")


def bind_set_where(runs, extra, experiment):
    """Decides, for every `--set-where TERM K=V` in `extra`, which of `runs` (the experiment's, all of
    them) match TERM: an --only term (parse_only: AXIS=VALUE[,VALUE...] of the grid, or run=NAME,...).
    Those runs get --set K=V, the others nothing (Run.own_extra): a setting for the rows that read a key,
    e.g. DiLoCo's period in a trial, which an uncompressed row would refuse. Calls fail() for a bad term
    or one that matches no run."""
    i = 0
    while i < len(extra):
        if extra[i] != "--set-where":
            i += 1
            continue
        term, kv = extra[i + 1], extra[i + 2]
        wanted = parse_only([term], runs, experiment)
        hits = 0
        for r in runs:
            hit = all((r.name if a == "run" else r.axes.get(a)) in v for a, v in wanted.items())
            r.set_where[(term, kv)] = hit
            hits += hit
        if not hits:
            fail(f"--set-where {term} {kv}: no run of {experiment} has {term} (`optcc sweep {experiment}` lists them)")
        print(f"# --set-where {term} {kv}: {hits} of the experiment's {count(len(runs), 'run')} (before --only)",
              flush=True)
        i += 3


def parse_only(terms, runs, experiment):
    """`--only` terms, `AXIS=VALUE[,VALUE...]` each (the grid's own axis names and values, as
    `optcc sweep EXP` lists them; `run=NAME[,NAME...]` names runs), as {axis: set of values}. Calls
    fail() for a term that is not AXIS=VALUES, an unknown axis or an unknown value, naming the
    experiment's axes and values."""
    axes = {}
    for r in runs:
        for axis, value in r.axes.items():
            values = axes.setdefault(axis, [])
            if value not in values:
                values.append(value)
    axes["run"] = [r.name for r in runs]
    known = "; ".join(f"{a}: {', '.join(v)}" for a, v in axes.items() if a != "run")
    wanted = {}
    for term in terms:
        axis, eq, values = term.partition("=")
        if not eq or not values:
            fail(f"--only {term!r}: a selection is AXIS=VALUE[,VALUE...] (the grid's axes and values; "
                 f"{experiment} has {known}), e.g. --only {next(iter(axes))}={axes[next(iter(axes))][0]}")
        if axis not in axes:
            fail(f"--only {term!r}: {experiment} has no grid axis {axis!r}. Its axes: {known} (or run=NAME)")
        chosen = []
        for v in (v for v in values.split(",") if v):
            # A values axis names its runs label + value (seed1): seed=1 means that one.
            part = v if v in axes[axis] else axis + v if axis + v in axes[axis] else None
            if part is None:
                fail(f"--only {term!r}: axis {axis} has no value {v!r}. Its values: {', '.join(axes[axis])}")
            chosen.append(part)
        wanted.setdefault(axis, set()).update(chosen)
    return wanted


def compression_axes(runs):
    """The grid axes whose value changes what a run compresses (its `compression` label): e.g. dp in
    the compressor comparison, not seed."""
    out = set()
    for axis in {a for r in runs for a in r.axes}:
        for r in runs:
            for o in runs:
                same_elsewhere = all(o.axes.get(a) == v for a, v in r.axes.items() if a != axis)
                if same_elsewhere and o.axes.get(axis) != r.axes.get(axis) and o.compression != r.compression:
                    out.add(axis)
    return out


def select_runs(runs, terms, experiment):
    """(selected runs in grid order, note). `terms` are --only's AXIS=VALUES (parse_only); a run is
    selected when its value is chosen on every axis named (all runs when there are no terms). A
    comparison always has its reference: the experiment's uncompressed runs (compression label
    `baseline`) equal to a selected run on every axis that does not change compression (e.g. the
    same seed) are added when the selection lacks them; runs named with run=... are taken as they
    are. The note says what was added, or that there is no uncompressed run to compare with. Calls
    fail() for bad terms or a selection of no run."""
    if not terms:
        return runs, ""
    wanted = parse_only(terms, runs, experiment)

    def matches(r, axes):
        return all((r.name if a == "run" else r.axes.get(a)) in wanted[a] for a in axes)
    out = [r for r in runs if matches(r, wanted)]
    if not out:
        fail(f"--only {' '.join(terms)} selects no run of {experiment} (no run has all those values; "
             f"`optcc sweep {experiment}` lists the runs)")
    if "run" in wanted:  # runs named one by one: exactly those
        return out, ""
    baseline = [r for r in runs if r.compression == "baseline"]
    if not baseline:
        return out, (f"{experiment} has no uncompressed run: the comparison is against its first configuration"
                     if any(r.compression for r in runs) else "")
    fixed = [a for a in {a for r in runs for a in r.axes} if a not in compression_axes(runs)]

    def same_setting(b, r):  # equal on every axis that does not change compression (e.g. the seed)
        return all(b.axes.get(a) == r.axes.get(a) for a in fixed)
    added = [b for b in baseline if b not in out and any(same_setting(b, r) for r in out)]
    out = [r for r in runs if r in out or r in added]
    if not any(r.compression == "baseline" for r in out):
        return out, "no uncompressed run matches the selection: the comparison is against its first configuration"
    note = f"added the uncompressed reference: {', '.join(r.name for r in added)}" if added else ""
    return out, note


def warn_other_extra(runs, extra):
    """One line per finished run whose .done records other extra arguments than `extra`: it stays
    skipped, and its results are those of the other arguments."""
    for r in runs:
        mine = r.own_extra(extra)
        other = r.finished_with_other_extra(mine)
        if other is not None:
            print(f"warning: {r.name} finished with other extra arguments ({other}), not ({shlex.join(mine) or 'none'}); "
                  f"it is skipped: delete {r.marker} (and its results) to run it with these", file=sys.stderr)


def launch_command(settings, run, extra, launcher):
    """The command that trains `run`: srun starts world_size tasks in a Slurm allocation; local starts
    the ranks as processes of this machine (--nproc). A benchmark run is its program, one process."""
    if run.kind == "benchmark":
        program, *options = run.train_args(extra)
        train = [os.path.join(ROOT, program), *options]
    else:
        train = [settings.optcc, *run.train_args(extra)]
    if launcher == "local":
        return train if run.kind == "benchmark" else train + ["--nproc", str(run.world_size)]
    srun = ["srun", "--kill-on-bad-exit=1"]
    if os.environ.get("SLURM_CPUS_PER_TASK"):  # srun does not inherit sbatch's --cpus-per-task (22.05+)
        srun.append(f"--cpus-per-task={os.environ['SLURM_CPUS_PER_TASK']}")
    if os.environ.get("SLURM_GPUS_PER_TASK"):
        # One GPU binding per rank: srun --gpus-per-task gives each task its own GPUs (it implies
        # --gpu-bind=per_task, and Slurm sets each task's CUDA_VISIBLE_DEVICES; with ConstrainDevices
        # the task cannot even open the others). Given explicitly, as --cpus-per-task above, instead of
        # trusting every Slurm version to carry the job's request over to the step.
        srun.append(f"--gpus-per-task={os.environ['SLURM_GPUS_PER_TASK']}")
    return srun + train


def recorded_regime(settings, runs):
    """One regime per comparison: the results file whose derived links the experiment's other runs reuse,
    the first run (index order) that derives its links and whose file already records them (root attribute
    network_regime); None while none does. A run started after it gets
    --set network.match_regime=from:<that file> (regime_args), so all of them cross the same links, however
    much the machine's speed, and with it the derived scale, moves between their starts. The files are read
    by settings.python (h5py), as the index and the figures are."""
    candidates = [r.results for r in sorted(runs, key=lambda r: r.index)
                  if r.derives_regime() and os.path.exists(os.path.join(ROOT, r.results))]
    if not candidates:
        return None
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import optcc_results as R\n"
             "for p in sys.argv[2:]:\n"
             "    try:\n"
             "        with R.open_results(p) as f:\n"
             "            if 'network_regime' in f.attrs:\n"
             "                print(p); break\n"
             "    except OSError:\n"
             "        pass\n")
    found = subprocess.run([settings.python, "-c", probe, os.path.join(ROOT, "scripts"),
                            *[os.path.join(ROOT, c) for c in candidates]], capture_output=True, text=True)
    hit = found.stdout.strip()
    if found.returncode != 0 or not hit:
        if found.returncode != 0:
            print(f"warning: could not read the runs' recorded regimes ({found.stderr.strip()[-300:]}); this run "
                  "derives its own links", file=sys.stderr)
        return None
    return candidates[[os.path.join(ROOT, c) for c in candidates].index(hit)]


def regime_args(settings, run, runs, extra):
    """The --set that pins `run` to the comparison's recorded regime (recorded_regime), or [] when the run
    derives none, is that recording run itself, none is recorded yet, or the caller sets match_regime."""
    if not run.derives_regime() or any("network.match_regime" in a for a in extra):
        return []
    source = recorded_regime(settings, runs)
    if source is None or os.path.normpath(source) == os.path.normpath(run.results):
        return []
    return ["--set", f"network.match_regime=from:{source}"]


# optcc train's exit code after a stop on SIGTERM/SIGUSR1 with its checkpoint written
# (harness/parallel/stop_signal.h).
STOPPED_EXIT_CODE = 75


def run_forwarding_signals(command):
    """Runs `command`; SIGUSR1 and SIGTERM sent to this process (sbatch --signal=B:USR1@N sends the
    batch script's process one before the time limit) are passed on to it. Returns its exit code."""
    child = None

    def forward(signum, _frame):
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGUSR1, signal.SIGTERM)}
    try:
        child = subprocess.Popen(command, cwd=ROOT)
        return child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def run_one(settings, run, extra, launcher, runs=()):
    """Trains `run` unless finished; writes its .done marker when optcc exits 0. Returns the exit code.
    `runs`: the experiment's runs, for the comparison's recorded regime (regime_args)."""
    if run.finished():
        print(f"[{run.index}] {run.name}: finished ({run.marker} exists), skipped", flush=True)
        return 0
    extra = run.own_extra(extra)  # --set-where resolved for this run
    pin = regime_args(settings, run, runs, extra)
    if pin:
        print(f"[{run.index}] {run.name}: reuses the comparison's links ({pin[1]})", flush=True)
    elif run.derives_regime():
        print(f"[{run.index}] {run.name}: derives the emulated links (network.match_regime); the experiment's later "
              "runs reuse them", flush=True)
    command = launch_command(settings, run, list(extra) + pin, launcher)
    os.makedirs(os.path.join(ROOT, run.results_dir), exist_ok=True)  # a benchmark's --benchmark_out needs it
    print(f"[{run.index}] {run.name}: {run.state()}\n  {shlex.join(command)}", flush=True)
    if launcher == "srun":  # a stop signal before the time limit: checkpoint, then requeue the task
        command = [os.path.join(ROOT, "slurm", "stoppable"), *command]
    code = run_forwarding_signals(command)
    if code == STOPPED_EXIT_CODE:
        print(f"[{run.index}] {run.name}: stopped on a signal after writing a checkpoint (exit {code}); it resumes "
              "from there when the task runs again", flush=True)
    elif code == 0:
        run.mark_finished(command, extra)
        print(f"[{run.index}] {run.name}: done -> {run.results}", flush=True)
    if code not in (0, STOPPED_EXIT_CODE):
        print(f"[{run.index}] {run.name}: optcc exited {code}; not marked finished (a rerun resumes it)",
              file=sys.stderr, flush=True)
    return code


def task_main(argv):
    """`task EXP SCALE INDEX [-- extra]`: one array task (slurm/experiment.sbatch)."""
    if len(argv) < 3:
        fail("usage: experiment_runs.py task EXP.yaml SCALE INDEX [-- extra optcc train args]")
    exp, scale, index = argv[0], argv[1], argv[2]
    extra = argv[3:]
    if extra and extra[0] == "--":
        extra = extra[1:]
    settings = Settings()
    plan = expand(settings, experiment_path(exp), scale)
    runs = {r["index"]: r for r in plan["runs"]}
    if not index.isdigit() or int(index) not in runs:
        fail(f"run index {index} is not in {exp} at scale {scale} (indices {sorted(runs)})")
    all_runs = [Run(settings, plan, r) for r in plan["runs"]]
    bind_set_where(all_runs, extra, exp)
    return run_one(settings, all_runs[[r.index for r in all_runs].index(int(index))], extra, "srun", all_runs)


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] != "task":
        fail("usage: experiment_runs.py task EXP.yaml SCALE INDEX [-- extra optcc train args]")
    sys.exit(task_main(sys.argv[2:]))
