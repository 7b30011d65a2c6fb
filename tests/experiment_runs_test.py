#!/usr/bin/env python3
"""slurm/experiment_runs.py's shared runner rules without Slurm or optcc: --only selection, the .done
marker's record of extra arguments and the warning when they differ. And slurm/submit's sbatch lines
and its refusal of a GPU scale with a build without CUDA: with a fake optcc (canned `sweep --json`)
and a fake sbatch on PATH that records its arguments, and with the real build/optcc (or $OPTCC) on
experiments/table2.yaml --scale paper when it is built (those cases are skipped otherwise).

  experiment_runs_test.py REPO_ROOT
"""
import contextlib
import importlib.machinery
import importlib.util
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
sys.path.insert(0, os.path.join(REPO, "slurm"))
import experiment_runs as er  # noqa: E402

SUBMIT = os.path.join(REPO, "slurm", "submit")

NAMES = ["baseline-seed1", "lazy-r16-seed1", "lazy-r64-seed1", "off-r16-seed1"]


def plan(names):
    """Runs named AXISVALUE-seedN as `optcc sweep --json` gives them: axes {variant, seed}, and the
    compression label (baseline for the variant `baseline`)."""
    def run(i, n):
        variant, _, seed = n.rpartition("-") if "-" in n else (n, "", "seed1")  # seed: the part seedN
        return {"index": i, "run": n, "world_size": 2, "args": ["train", "--config", "x.yaml"],
                "results": f"results/exp/{n}.h5", "checkpoint_dir": f"results/exp/ckpt/{n}",
                "axes": {"variant": variant, "seed": seed},
                "compression": "baseline" if variant == "baseline" else f"pipeline_backward=lowrank({variant})"}
    return {"results_dir": "results/exp", "runs": [run(i, n) for i, n in enumerate(names)]}


class RunnerRulesTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.settings = er.Settings({"OPTCC_RESULTS": self.tmp.name})
        p = plan(NAMES)
        self.runs = [er.Run(self.settings, p, r) for r in p["runs"]]

    def tearDown(self):
        self.tmp.cleanup()

    def test_only_selects_by_grid_values_and_adds_the_uncompressed_reference(self):
        p = plan([f"{v}-seed{s}" for s in (1, 2) for v in ("baseline", "lazy-r16", "off-r16")])
        runs = [er.Run(self.settings, p, r) for r in p["runs"]]
        names = lambda sel: [r.name for r in sel[0]]  # noqa: E731
        # The reference of the same seed joins; the other seed's does not.
        self.assertEqual(names(er.select_runs(runs, ["variant=lazy-r16,off-r16", "seed=2"], "exp.yaml")),
                         ["baseline-seed2", "lazy-r16-seed2", "off-r16-seed2"])
        self.assertIn("baseline-seed2", er.select_runs(runs, ["variant=off-r16", "seed=2"], "exp.yaml")[1])
        self.assertEqual(names(er.select_runs(runs, ["variant=off-r16"], "exp.yaml")),
                         ["baseline-seed1", "off-r16-seed1", "baseline-seed2", "off-r16-seed2"])
        self.assertEqual(er.select_runs(runs, ["variant=baseline", "seed=1"], "exp.yaml"), ([runs[0]], ""))
        self.assertEqual(names(er.select_runs(runs, ["run=off-r16-seed1"], "exp.yaml")), ["off-r16-seed1"])
        self.assertEqual(len(er.select_runs(runs, None, "exp.yaml")[0]), 6)
        self.assertEqual(er.compression_axes(runs), {"variant"})
        # Without an uncompressed run the note says what the comparison is against.
        q = plan(["lazy-r16-seed1", "off-r16-seed1"])
        only = [er.Run(self.settings, q, r) for r in q["runs"]]
        self.assertIn("no uncompressed run", er.select_runs(only, ["variant=off-r16"], "exp.yaml")[1])
        for bad, said in ((["r16|baseline"], "AXIS=VALUE"), (["dp=powersgd_r4"], "no grid axis 'dp'"),
                          (["variant=lazy-r64"], "no value 'lazy-r64'"), (["seed="], "AXIS=VALUE"),
                          (["variant=lazy-r16", "seed=1", "run=off-r16-seed2"], "selects no run")):
            with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()) as err:
                er.select_runs(runs, bad, "exp.yaml")
            self.assertIn("--only", err.getvalue())
            self.assertIn(said, err.getvalue())
            if said in ("AXIS=VALUE", "no grid axis 'dp'"):
                self.assertIn("variant: baseline, lazy-r16, off-r16; seed: seed1, seed2", err.getvalue())

    def test_extra_arguments_are_set_or_resume(self):
        er.check_extra(["--set", "train.train_steps=20", "--set=log.interval=5", "--resume", "--resume", "auto"])
        for bad in (["--onyl", "x"], ["--set"], ["--set", "novalue"], ["--nproc", "4"]):
            with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()) as err:
                er.check_extra(bad)
            self.assertIn("extra argument", err.getvalue())

    def test_set_where_sets_a_key_only_in_the_matching_rows(self):
        extra = ["--set", "train.train_steps=20", "--set-where", "variant=lazy-r16,lazy-r64", "model.x=1",
                 "--set-where", "run=off-r16-seed1", "model.y=2"]
        er.check_extra(extra)
        with contextlib.redirect_stdout(io.StringIO()) as out:
            er.bind_set_where(self.runs, extra, "exp.yaml")
        self.assertIn("# --set-where variant=lazy-r16,lazy-r64 model.x=1: 2 of the experiment's 4 runs", out.getvalue())
        own = {r.name: r.own_extra(extra) for r in self.runs}
        self.assertEqual(own["baseline-seed1"], ["--set", "train.train_steps=20"])
        self.assertEqual(own["lazy-r16-seed1"], ["--set", "train.train_steps=20", "--set", "model.x=1"])
        self.assertEqual(own["lazy-r64-seed1"], own["lazy-r16-seed1"])
        self.assertEqual(own["off-r16-seed1"], ["--set", "train.train_steps=20", "--set", "model.y=2"])
        # the command and the .done record carry the run's own settings; resolving twice changes nothing
        self.assertEqual(self.runs[1].train_args(extra)[-4:], ["--set", "model.x=1", "--resume", "auto"])
        self.assertEqual(self.runs[1].own_extra(own["lazy-r16-seed1"]), own["lazy-r16-seed1"])
        for bad, why in ((["variant=nothing", "model.x=1"], "has no value 'nothing'"),
                         (["variant=lazy-r16"], "--set-where needs AXIS=VALUE"),
                         (["lazy-r16", "model.x=1"], "--set-where needs AXIS=VALUE")):
            with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()) as err, \
                    contextlib.redirect_stdout(io.StringIO()):
                er.check_extra(["--set-where", *bad])
                er.bind_set_where(self.runs, ["--set-where", *bad], "exp.yaml")
            self.assertIn(why, err.getvalue())

    def test_marker_records_extra_arguments(self):
        run = self.runs[1]
        self.assertTrue(run.marker.startswith(self.tmp.name))  # redirected results root
        self.assertIsNone(run.finished_with_other_extra([]))  # not finished
        run.mark_finished(["optcc", "train"], ["--set", "train.train_steps=20"])
        self.assertTrue(run.finished())
        self.assertIsNone(run.finished_with_other_extra(["--set", "train.train_steps=20"]))
        self.assertEqual(run.finished_with_other_extra([]), "--set train.train_steps=20")
        with contextlib.redirect_stderr(io.StringIO()) as err:
            er.warn_other_extra(self.runs, [])
        self.assertEqual(err.getvalue().count("warning:"), 1)
        self.assertIn("lazy-r16-seed1 finished with other extra arguments (--set train.train_steps=20)", err.getvalue())
        plain = self.runs[0]
        plain.mark_finished(["optcc", "train"])
        self.assertEqual(plain.finished_with_other_extra(["--set", "a=b"]), "none")


class RegimeTest(unittest.TestCase):
    """One regime per comparison: runs that derive their emulated links (network.match_regime) reuse the
    first recorded derivation (--set network.match_regime=from:FILE); before one exists nothing is pinned."""

    def test_later_runs_reuse_the_first_recorded_regime(self):
        with tempfile.TemporaryDirectory() as tmp:
            settings = er.Settings({"OPTCC_RESULTS": tmp})  # PYTHON: /usr/bin/python3, with h5py

            def write(name, attrs):  # a results file with these root attributes, by the runners' python
                code = "import sys, h5py\nwith h5py.File(sys.argv[1], 'w') as f:\n    f.attrs[sys.argv[2]] = sys.argv[3]\n"
                subprocess.run([settings.python, "-c", code, os.path.join(tmp, "exp", name), *attrs], check=True)

            p = plan(NAMES)
            for r in p["runs"]:
                r["match_regime"] = "experiments/paper/gpt-2.5b.yaml"
            p["runs"][3]["match_regime"] = ""  # this run emulates nothing
            runs = [er.Run(settings, p, r) for r in p["runs"]]
            self.assertEqual(er.regime_args(settings, runs[1], runs, []), [])  # nothing recorded yet: it derives
            os.makedirs(os.path.join(tmp, "exp"))
            # A file without the attribute (its run did not derive, or has not flushed) is not a source.
            write("baseline-seed1.h5", ["config", "{}"])
            self.assertIsNone(er.recorded_regime(settings, runs))
            write("lazy-r16-seed1.h5", ["network_regime", "scale 53.3 from experiments/paper/gpt-2.5b.yaml"])
            source = runs[1].results
            self.assertEqual(er.recorded_regime(settings, runs), source)
            pinned = ["--set", f"network.match_regime=from:{source}"]
            self.assertEqual(er.regime_args(settings, runs[0], runs, []), pinned)
            self.assertEqual(er.regime_args(settings, runs[2], runs, []), pinned)
            self.assertEqual(er.regime_args(settings, runs[1], runs, []), [])  # the recording run itself
            self.assertEqual(er.regime_args(settings, runs[3], runs, []), [])  # no derivation to pin
            self.assertEqual(er.regime_args(settings, runs[0], runs, ["--set", "network.match_regime=from:x.h5"]), [])


def load_submit():
    loader = importlib.machinery.SourceFileLoader("optcc_submit", SUBMIT)
    spec = importlib.util.spec_from_loader("optcc_submit", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


GPU_SLURM = {"nodes": 16, "tasks_per_node": 8, "gpus_per_node": 8, "cpus_per_task": 8, "time": "48:00:00",
             "array_limit": 2, "mem": "0", "exclusive": True, "gpus_per_task": 1}
CPU_SLURM = {"nodes": 1, "tasks_per_node": 8, "gpus_per_node": 0, "cpus_per_task": 1, "time": "01:00:00",
             "array_limit": None, "mem": None, "exclusive": False, "gpus_per_task": 0}


class StopSignalTest(unittest.TestCase):
    """A stop signal before the time limit: the runner, and slurm/stoppable inside a task, pass SIGUSR1
    on to optcc (here a child that exits 75 on it, as optcc train does after its checkpoint), and
    stoppable requeues the job (a fake scontrol on PATH records the call)."""

    def test_sigusr1_is_forwarded_and_the_stop_code_comes_back(self):
        import signal
        import threading
        import time
        with tempfile.TemporaryDirectory() as tmp:
            ready = os.path.join(tmp, "ready")
            child = [sys.executable, "-c", "import signal, sys, time\n"
                     "signal.signal(signal.SIGUSR1, lambda *a: sys.exit(75))\n"
                     f"open({ready!r}, 'w').close()\n"
                     "time.sleep(60)\nsys.exit(3)"]

            def signal_when_ready():  # once the child's handler is in place (a loaded machine is slow)
                for _ in range(600):
                    if os.path.exists(ready):
                        os.kill(os.getpid(), signal.SIGUSR1)
                        return
                    time.sleep(0.05)

            thread = threading.Thread(target=signal_when_ready)
            thread.start()
            try:
                self.assertEqual(er.run_forwarding_signals(child), er.STOPPED_EXIT_CODE)
            finally:
                thread.join()
        self.assertEqual(signal.getsignal(signal.SIGUSR1), signal.SIG_DFL)  # put back

    def run_stoppable(self, env, sig=None):
        """slurm/stoppable around a child that exits 75 on SIGUSR1 or SIGTERM (as optcc train does);
        `sig` (default SIGUSR1) to stoppable once the child says its handler is in place (a loaded
        machine may take seconds to start it)."""
        import signal
        sig = sig or signal.SIGUSR1
        child = [sys.executable, "-c", "import signal, sys, time\n"
                 "signal.signal(signal.SIGUSR1, lambda *a: sys.exit(75))\n"
                 "signal.signal(signal.SIGTERM, lambda *a: sys.exit(75))\n"
                 "print('ready', flush=True)\n"
                 "time.sleep(60)\nsys.exit(3)"]
        p = subprocess.Popen([os.path.join(REPO, "slurm", "stoppable"), *child], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        first = p.stdout.readline()
        self.assertEqual(first.strip(), "ready")
        p.send_signal(sig)
        out, _ = p.communicate(timeout=60)
        return p.returncode, first + out

    def test_stoppable_passes_the_signal_on_and_requeues_the_job_on_75(self):
        with tempfile.TemporaryDirectory() as tmp:
            log = os.path.join(tmp, "scontrol.log")
            with open(os.path.join(tmp, "scontrol"), "w") as f:
                f.write(f"#!/bin/sh\necho \"$@\" >> {log}\n")
            os.chmod(os.path.join(tmp, "scontrol"), 0o755)
            env = dict(os.environ, PATH=tmp + os.pathsep + os.environ["PATH"], SLURM_JOB_ID="4711")
            code, out = self.run_stoppable(env)
            self.assertEqual(code, 75, out)
            self.assertIn("requeueing job 4711", out)
            with open(log) as f:
                self.assertEqual(f.read().split(), ["requeue", "4711"])
            # SIGTERM (scancel): the same checkpoint and exit code, but the job stays cancelled.
            import signal
            code, out = self.run_stoppable(env, signal.SIGTERM)
            self.assertEqual(code, 75, out)
            self.assertIn("the job is not requeued. To resume it: scontrol requeue 4711", out)
            with open(log) as f:
                self.assertEqual(f.read().split(), ["requeue", "4711"], "a cancelled job was requeued")
            env.pop("SLURM_JOB_ID")
            # The child may end, and bash reap it, before stoppable looks again after its trap ran (a
            # loaded machine: stoppable returned 138, the signal's code, instead of the child's 75).
            for _ in range(8):
                code, out = self.run_stoppable(env)
                self.assertEqual(code, 75, out)
                self.assertIn("run the same command again to resume", out)


class SbatchOptionsTest(unittest.TestCase):
    """slurm/submit's translation of the slurm block into sbatch options."""

    def setUp(self):
        self.submit = load_submit()

    def test_stop_signal_before_the_time_limit(self):
        self.assertEqual(self.submit.resource_options(dict(CPU_SLURM, stop_signal_seconds=300))[-1],
                         "--signal=B:USR1@300")
        self.assertFalse([o for o in self.submit.resource_options(dict(CPU_SLURM, stop_signal_seconds=0))
                          if o.startswith("--signal")])

    def test_cpu_scale_lines_are_unchanged(self):
        self.assertEqual(self.submit.resource_options(CPU_SLURM),
                         ["--nodes=1", "--ntasks-per-node=8", "--cpus-per-task=1", "--time=01:00:00"])
        self.assertEqual(self.submit.array_option([0, 1, 2, 5], CPU_SLURM), "--array=0-2,5")

    def test_gpu_scale_gets_throttle_memory_exclusive_and_gpus_per_task(self):
        self.assertEqual(self.submit.resource_options(GPU_SLURM),
                         ["--nodes=16", "--ntasks=128", "--ntasks-per-node=8", "--gpus-per-task=1",
                          "--cpus-per-task=8", "--time=48:00:00", "--mem=0", "--exclusive"])
        self.assertEqual(self.submit.array_option(list(range(15)), GPU_SLURM), "--array=0-14%2")
        self.assertNotIn("--gpus-per-node=8", self.submit.resource_options(GPU_SLURM))

    def test_srun_binds_the_jobs_gpus_per_task(self):
        run = er.Run(er.Settings({}), plan(["a"]), plan(["a"])["runs"][0])
        old = {k: os.environ.get(k) for k in ("SLURM_GPUS_PER_TASK", "SLURM_CPUS_PER_TASK")}
        try:
            os.environ["SLURM_GPUS_PER_TASK"] = "1"
            os.environ.pop("SLURM_CPUS_PER_TASK", None)
            self.assertEqual(er.launch_command(er.Settings({}), run, [], "srun")[:3],
                             ["srun", "--kill-on-bad-exit=1", "--gpus-per-task=1"])
            os.environ.pop("SLURM_GPUS_PER_TASK")
            self.assertNotIn("--gpus-per-task=1", er.launch_command(er.Settings({}), run, [], "srun"))
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


FAKE_OPTCC = """\
#!{python}
import json, os, sys
with open(os.environ["FAKE_OPTCC_LOG"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
if "--check" in sys.argv:
    sys.exit(0)
print(json.dumps(json.load(open(os.environ["FAKE_OPTCC_PLAN"]))))
"""
FAKE_SBATCH = """\
#!{python}
import json, os, sys
with open(os.environ["FAKE_SBATCH_LOG"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
print(4242 + sum(1 for _ in open(os.environ["FAKE_SBATCH_LOG"])))
"""


class SubmitTest(unittest.TestCase):
    """slurm/submit end to end, with a fake optcc and a fake sbatch on PATH."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        t = self.tmp.name
        os.makedirs(os.path.join(t, "bin"))
        for name, text in (("optcc", FAKE_OPTCC), ("bin/sbatch", FAKE_SBATCH)):
            path = os.path.join(t, name)
            with open(path, "w") as f:
                f.write(text.format(python=sys.executable))
            os.chmod(path, 0o755)
        self.exp = os.path.join(t, "fake.yaml")
        open(self.exp, "w").close()
        self.env = dict(os.environ, OPTCC=os.path.join(t, "optcc"), PATH=os.path.join(t, "bin") + os.pathsep +
                        os.environ.get("PATH", ""), OPTCC_RESULTS=os.path.join(t, "results"),
                        OPTCC_SLURM_LOGS=os.path.join(t, "logs"), FAKE_OPTCC_LOG=os.path.join(t, "optcc.log"),
                        FAKE_SBATCH_LOG=os.path.join(t, "sbatch.log"), FAKE_OPTCC_PLAN=os.path.join(t, "plan.json"))
        self.env.pop("SBATCH_EXTRA", None)

    def tearDown(self):
        self.tmp.cleanup()

    def submit(self, slurm, cuda, *args):
        p = dict(plan(["baseline-seed1", "cb-seed1"]), experiment="fake-gpu", scale="paper", kind="train",
                 slurm=slurm, needs_gpus=bool(slurm["gpus_per_node"]),
                 gpus=f"{slurm['nodes']} nodes x {slurm['gpus_per_node']} GPUs" if slurm["gpus_per_node"] else None,
                 build={"cuda": cuda, "description": "LibTorch 9.9.9, CUDA" if cuda else
                        "LibTorch 1.13.1, CPU only (built without CUDA)"})
        with open(self.env["FAKE_OPTCC_PLAN"], "w") as f:
            json.dump(p, f)
        return subprocess.run([sys.executable, SUBMIT, self.exp, "--scale", "paper", *args], cwd=REPO,
                              env=self.env, capture_output=True, text=True)

    def calls(self, name):
        if not os.path.exists(self.env[name]):
            return []
        with open(self.env[name]) as f:
            return [json.loads(line) for line in f]

    def test_gpu_scale_with_a_cuda_build_is_submitted_with_its_resources(self):
        p = self.submit(GPU_SLURM, True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("WARNING", p.stderr)
        self.assertIn(["sweep", self.exp, "--scale", "paper", "--check"], self.calls("FAKE_OPTCC_LOG"))  # outside REPO
        array, results = self.calls("FAKE_SBATCH_LOG")
        for option in ("--array=0-1%2", "--ntasks=128", "--gpus-per-task=1", "--mem=0", "--exclusive",
                       "--nodes=16", "--ntasks-per-node=8", "--cpus-per-task=8", "--time=48:00:00"):
            self.assertIn(option, array)
        self.assertFalse([a for a in array if a.startswith("--gpus-per-node")])
        self.assertIn("--dependency=afterany:4243", results)
        self.assertIn("submitted array job 4243", p.stdout)

    def test_gpu_scale_without_cuda_is_refused_before_any_sbatch(self):
        p = self.submit(GPU_SLURM, False)
        self.assertEqual(p.returncode, 2)
        self.assertNotIn("Traceback", p.stderr)
        self.assertIn("error: fake-gpu (", p.stderr)
        self.assertIn("--scale paper asks for GPUs (16 nodes x 8 GPUs), but", p.stderr)
        self.assertIn("is LibTorch 1.13.1, CPU only (built without CUDA): it cannot use a GPU", p.stderr)
        self.assertIn("Nothing was submitted. Fix: build optcc against a CUDA LibTorch", p.stderr)
        self.assertEqual(self.calls("FAKE_SBATCH_LOG"), [])
        self.assertFalse(os.path.exists(self.env["OPTCC_SLURM_LOGS"]))

    def test_gpu_scale_without_cuda_dry_run_warns_and_prints_the_jobs(self):
        p = self.submit(GPU_SLURM, False, "--dry-run")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(p.stderr.startswith("WARNING: fake-gpu ("), p.stderr)
        self.assertIn("LibTorch 1.13.1, CPU only (built without CUDA)", p.stderr)
        self.assertIn("without --dry-run these jobs would be refused", p.stderr)
        lines = p.stdout.splitlines()
        self.assertIn("--array=0-1%2", lines[1])
        self.assertIn("--gpus-per-task=1", lines[1])
        self.assertEqual(sum(line.startswith("# task ") for line in lines), 2)
        self.assertEqual(self.calls("FAKE_SBATCH_LOG"), [])

    def test_cpu_scale_has_no_warning(self):
        p = self.submit(CPU_SLURM, False, "--dry-run")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stderr, "")
        self.assertIn("--array=0-1 ", p.stdout)


def real_optcc():
    path = os.path.join(REPO, os.environ.get("OPTCC", "build/optcc"))
    return path if os.access(path, os.X_OK) else None


@unittest.skipUnless(real_optcc(), "build/optcc (or $OPTCC) is not built")
class Table2PaperTest(unittest.TestCase):
    """The real binary on experiments/table2.yaml --scale paper (16 nodes x 8 GPUs, 15 runs)."""

    def setUp(self):
        self.optcc = real_optcc()
        self.tmp = tempfile.TemporaryDirectory()
        os.makedirs(os.path.join(self.tmp.name, "bin"))
        sbatch = os.path.join(self.tmp.name, "bin", "sbatch")
        with open(sbatch, "w") as f:
            f.write(FAKE_SBATCH.format(python=sys.executable))
        os.chmod(sbatch, 0o755)
        self.env = dict(os.environ, OPTCC=self.optcc, OPTCC_RESULTS=os.path.join(self.tmp.name, "results"),
                        OPTCC_SLURM_LOGS=os.path.join(self.tmp.name, "logs"),
                        FAKE_SBATCH_LOG=os.path.join(self.tmp.name, "sbatch.log"),
                        PATH=os.path.join(self.tmp.name, "bin") + os.pathsep + os.environ.get("PATH", ""))
        self.env.pop("SBATCH_EXTRA", None)
        out = subprocess.run([self.optcc, "sweep", "experiments/table2.yaml", "--scale", "paper", "--json"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout
        self.plan = json.loads(out)

    def tearDown(self):
        self.tmp.cleanup()

    def submit(self, *args):
        return subprocess.run([sys.executable, SUBMIT, "experiments/table2.yaml", "--scale", "paper", *args], cwd=REPO,
                              env=self.env, capture_output=True, text=True)

    def test_json_carries_the_build_and_the_gpu_keys(self):
        self.assertTrue(self.plan["needs_gpus"])
        self.assertEqual(self.plan["slurm"]["array_limit"], 2)
        self.assertEqual(self.plan["slurm"]["gpus_per_task"], 1)
        self.assertTrue(self.plan["slurm"]["exclusive"])
        self.assertIn(self.plan["build"]["cuda"], (True, False))
        self.assertTrue(self.plan["build"]["description"].startswith("LibTorch "))

    def test_dry_run_line(self):
        p = self.submit("--dry-run")
        corpus = os.path.join(REPO, "data", "corpus.json")
        if self.plan["build"]["cuda"] and os.path.exists(corpus):
            with open(corpus) as f:
                vocab = json.load(f).get("vocab_size")
            if vocab != 50257:
                # A CUDA build passes the GPU check, so sweep --check reaches the dataset: the demo
                # corpus (8000 pieces) is refused for the paper's GPT-2 vocabulary, nothing submitted.
                self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
                self.assertIn(f"model.vocab_size = 50257 but the dataset data/corpus was tokenized with a vocabulary of "
                              f"{vocab} pieces", p.stderr)
                self.assertFalse(os.path.exists(self.env["FAKE_SBATCH_LOG"]))
                return
        self.assertEqual(p.returncode, 0, p.stderr)
        array = p.stdout.splitlines()[1]
        for option in ("--array=0-14%2", "--exclusive", "--mem=0", "--gpus-per-task=1", "--ntasks=128"):
            self.assertIn(option, array.split())
        self.assertNotIn("--gpus-per-node", array)
        if not self.plan["build"]["cuda"]:
            self.assertIn("WARNING: table2 (experiments/table2.yaml) --scale paper asks for GPUs (16 nodes x 8 GPUs)",
                          p.stderr)
            self.assertIn(self.plan["build"]["description"], p.stderr)

    def test_check_and_submit_refuse_without_cuda(self):
        if self.plan["build"]["cuda"]:
            self.skipTest("optcc is built with CUDA")
        check = subprocess.run([self.optcc, "sweep", "experiments/table2.yaml", "--scale", "paper", "--check"],
                               cwd=REPO, capture_output=True, text=True)
        self.assertEqual(check.returncode, 2)
        self.assertIn("experiment table2, --scale paper: its slurm block asks for 16 nodes x 8 GPUs", check.stderr)
        self.assertIn(self.plan["build"]["description"], check.stderr)
        self.assertIn("Fix: build optcc against a CUDA LibTorch", check.stderr)
        p = self.submit()
        self.assertEqual(p.returncode, 2)
        self.assertIn("Nothing was submitted", p.stderr)
        self.assertNotIn("Traceback", p.stderr)
        self.assertFalse(os.path.exists(self.env["FAKE_SBATCH_LOG"]))


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
