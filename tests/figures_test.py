#!/usr/bin/env python3
"""scripts/results_index.py and scripts/make_figures.py on results files built here with h5py in the
trainer's layout (harness/train/run_records.cpp: the same tables, columns and root attributes), then
make_figures.py on the committed reference results.

  figures_test.py SOURCE_DIR

Runs (experiment "exp", train.train_steps = 10; one root file outside any experiment):
  baseline seeds 1, 2, 3    complete
  cb seeds 1, 2             complete; seed 2 in two files: cb-seed2.h5 flushed steps 1..7 and was resumed
                            from its step-5 checkpoint into cb-seed2.resumed-5.h5 (steps 6..10, other
                            losses): steps 6 and 7 must come from the resumed file
  cb_fe seed 1              partial: steps 1..6 flushed
  broken                    not an HDF5 file: failed
  empty                     a results file without a training row: failed
Expected values are computed here from the numbers written (statistics.mean/stdev), not read back.
"""
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import unittest

import h5py
import numpy as np
import yaml

SOURCE = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
STEPS = 10
SCHEME = {  # the parts of the effective config a scheme sets (harness/config)
    "baseline": {"dp": "none", "pipeline_backward": "none", "fused_embedding": False, "lep": "lazy"},
    "cb": {"dp": "none", "pipeline_backward": {"name": "lowrank", "rank": 16}, "fused_embedding": False,
           "lep": "lazy"},
    "cb_fe": {"dp": "none", "pipeline_backward": {"name": "lowrank", "rank": 16}, "fused_embedding": True,
              "lep": "lazy"},
}
# bytes per step per class (tp, pp_fwd, pp_bwd, dp, embedding, control), two ranks each sending half
BYTES = {"baseline": [4000000, 1000000, 1000000, 8000000, 2000000, 1000],
         "cb": [4000000, 1000000, 250000, 8000000, 2000000, 1000],
         "cb_fe": [4000000, 1000000, 250000, 8000000, 1000000, 1000]}
STEP_SECONDS = {"baseline": 2.0, "cb": 1.6, "cb_fe": 1.5}
FINAL = {("baseline", 1): (5.1, 164.02190729990173), ("baseline", 2): (5.3, 200.33680997479166),
         ("baseline", 3): (5.17, 175.91483748598365), ("cb", 1): (5.19, 179.46838917787342),
         ("cb", 2): (5.41, 223.63158363960034)}

TABLES = {
    "train": ["step", "loss", "lr", "grad_norm", "step_seconds", "tokens_per_second"],
    "eval": ["step", "loss", "ppl", "ppl_capped"],
    "traffic": ["step", "rank", "class", "link", "bytes", "calls", "seconds", "emulated_seconds"],
    "memory_components": ["step", "rank", "parameters", "gradients", "optimizer", "activations_peak",
                          "lep_buffers", "ef_buffers", "pq_buffers", "tracked_peak"],
    "lep_orthogonality": ["step", "rank", "microbatch", "cosine", "error_mean", "delta_mean"],
}
INT_COLUMNS = {"step", "rank", "class", "link", "bytes", "calls", "ppl_capped", "microbatch", "parameters",
               "gradients", "optimizer", "activations_peak", "lep_buffers", "ef_buffers", "pq_buffers",
               "tracked_peak"}


def config(scheme, seed, run):
    return {"model": {"preset": "tiny", "num_layers": 2, "hidden_size": 64},
            "parallel": {"tp": 1, "pp": 2, "dp": 1},
            "train": {"train_steps": STEPS, "seed": seed, "lr": 0.001},
            "compression": {"scheme": scheme, **SCHEME[scheme]},
            "log": {"dir": "results/exp", "run_name": run, "interval": 1, "level": "info"},
            "checkpoint": {"dir": f"ckpt/{run}", "interval": 5}}


def write_file(path, attrs, rows):
    """A results file as Hdf5MetricsSink writes it: string root attributes, one group per table."""
    with h5py.File(path, "w", libver="latest") as f:
        for k, v in attrs.items():
            f.attrs[k] = v
        for group, cols in TABLES.items():
            g = f.create_group(group)
            g.attrs["columns"] = ",".join(cols)
            data = rows.get(group, [])
            for i, c in enumerate(cols):
                values = [r[i] for r in data]
                dtype = np.int64 if c in INT_COLUMNS else np.float64
                g.create_dataset(c, data=np.array(values, dtype=dtype), maxshape=(None,), chunks=(1024,))


def run_rows(scheme, seed, first, last, final, loss_shift=0.0):
    """Rows of steps first..last: train, eval at every 5th step and at the end, traffic, memory."""
    rows = {k: [] for k in TABLES}
    for s in range(first, last + 1):
        loss = 9.0 - 0.3 * s + loss_shift
        rows["train"].append([s, loss, 1e-3, 1.0, STEP_SECONDS[scheme], 256 / STEP_SECONDS[scheme]])
        for c, b in enumerate(BYTES[scheme]):
            for rank in (0, 1):
                rows["traffic"].append([s, rank, c, 1, b // 2, 1, 0.01, 0.0])
        for rank in (0, 1):
            lep = 65536 if scheme != "baseline" else 0
            rows["memory_components"].append([s, rank, 1000000, 1000000, 2000000, 3000000 + rank, lep, 0, 0,
                                              7000000 + rank + lep])
        if scheme == "cb":
            for j in range(3):  # Fig. 11 rows: cosine alternating in sign
                rows["lep_orthogonality"].append([s, 1, j, (-1) ** j * 0.01 * (j + 1), 1e-5, -2e-5])
        if s == STEPS or s % 5 == 0:
            loss_e, ppl_e = final if s == STEPS else (loss + 0.1, math.exp(loss + 0.1))
            rows["eval"].append([s, loss_e, ppl_e, 0])
    return rows


def attrs_of(scheme, seed, run, start, first_step=0):
    return {"config": yaml.safe_dump(config(scheme, seed, run), sort_keys=False), "compression_scheme": scheme,
            "git_revision": "abc123", "start_time": start, "resumed_from_step": str(first_step),
            "layout": "tp=1 pp=2 dp=1"}


def diloco_and_allreduce_runs(root, rows_of_step, train=None):
    """Two 40-step runs (or train["train_steps"]) under root/d with the same rows (rows_of_step(step, rows) appends a step's), one with
    dp_strategy diloco (H 16), one allreduce, read back: {run name: optcc_results.Run}."""
    import optcc_results as R
    os.makedirs(os.path.join(root, "d"))
    for name, strategy in (("diloco-seed1", "diloco"), ("plain-seed1", "allreduce")):
        a = attrs_of("baseline", 1, name, "2026-01-01T00:00:00Z")
        cfg = yaml.safe_load(a["config"])
        cfg["compression"]["dp_strategy"] = strategy
        cfg["diloco"] = {"inner_steps": 16}
        cfg["train"].update(train or {})
        a["config"] = yaml.safe_dump(cfg)
        rows = {k: [] for k in TABLES}
        for step in range(1, int((train or {}).get("train_steps", 40)) + 1):
            rows_of_step(step, rows)
        write_file(os.path.join(root, "d", f"{name}.h5"), a, rows)
    return {r.name: r for r in R.load_runs(root)}


def build_results(root):
    exp = os.path.join(root, "exp")
    os.makedirs(exp)
    for (scheme, seed), final in FINAL.items():
        run = f"{scheme}-seed{seed}"
        if (scheme, seed) == ("cb", 2):  # killed after step 7, resumed from the step-5 checkpoint
            write_file(os.path.join(exp, f"{run}.h5"), attrs_of(scheme, seed, run, "2026-01-01T00:00:00Z"),
                       run_rows(scheme, seed, 1, 7, final, loss_shift=0.5))
            resumed = run_rows(scheme, seed, 6, STEPS, final)
            write_file(os.path.join(exp, f"{run}.resumed-5.h5"),
                       attrs_of(scheme, seed, run, "2026-01-01T01:00:00Z", 5), resumed)
        else:
            write_file(os.path.join(exp, f"{run}.h5"), attrs_of(scheme, seed, run, "2026-01-01T00:00:00Z"),
                       run_rows(scheme, seed, 1, STEPS, final))
    write_file(os.path.join(exp, "cb_fe-seed1.h5"), attrs_of("cb_fe", 1, "cb_fe-seed1", "2026-01-01T00:00:00Z"),
               run_rows("cb_fe", 1, 1, 6, None))
    write_file(os.path.join(exp, "empty.h5"), attrs_of("baseline", 9, "empty", "2026-01-01T00:00:00Z"), {})
    # `optcc eval` output next to its run (harness/checkpoints/eval_checkpoint.h): not a run of its own
    for name in ("baseline-seed1.eval-10.h5", "baseline-seed1.eval-10.attempt-2.h5"):
        with h5py.File(os.path.join(exp, name), "w") as f:
            f.attrs["kind"] = "eval_checkpoint"
    with open(os.path.join(exp, "broken.h5"), "wb") as f:
        f.write(b"not an HDF5 file")
    write_file(os.path.join(root, "loose.h5"), attrs_of("baseline", 1, "loose", "2026-01-01T00:00:00Z"),
               run_rows("baseline", 1, 1, STEPS, (6.0, math.exp(6.0))))
    write_benchmark(os.path.join(root, "bench", "compression.json"))
    abl = os.path.join(root, "ablation")  # one scheme, the CB rank varies; labels come from that key
    os.makedirs(abl)
    for seed, rank in ((1, 16), (2, 4)):  # names alike but for the seed: labels from the config instead
        a = attrs_of("cb", seed, f"run-seed{seed}", "2026-01-01T00:00:00Z")
        cfg = yaml.safe_load(a["config"])
        cfg["compression"]["pipeline_backward"]["rank"] = rank
        a["config"] = yaml.safe_dump(cfg)
        write_file(os.path.join(abl, f"run-seed{seed}.h5"), a, run_rows("cb", seed, 1, STEPS, (5.0 + rank / 100, 150.0)))
    with open(os.path.join(abl, "broken.h5"), "wb") as f:
        f.write(b"")
    # A compressor comparison: every run says scheme baseline; what each compresses is optcc's
    # `compression` attribute, and the uncompressed run is the reference though it sorts last.
    comp = os.path.join(root, "compressors")
    os.makedirs(comp)
    for name, label, final in (("a_topk", "dp=topk(fraction=0.01)", 5.3), ("b_powersgd", "dp=powersgd(rank=4)", 5.2),
                               ("z_none", "baseline", 5.1)):
        a = attrs_of("baseline", 1, f"{name}-seed1", "2026-01-01T00:00:00Z")
        a["compression"] = label
        cfg = yaml.safe_load(a["config"])
        cfg["compression"]["dp"] = {"name": name[2:], "rank": 4}  # differ in config, as such runs do
        a["config"] = yaml.safe_dump(cfg)
        path = os.path.join(comp, f"{name}-seed1.h5")
        write_file(path, a, run_rows("baseline", 1, 1, STEPS, (final, math.exp(final))))
        with h5py.File(path, "a") as f:  # these runs record the stage-to-stage wire: a quarter of each pp class
            g = f["traffic"]
            g.attrs["columns"] = ",".join(TABLES["traffic"][:5] + ["p2p_bytes"] + TABLES["traffic"][5:])
            cls, sent = g["class"][:], g["bytes"][:]
            g.create_dataset("p2p_bytes", data=np.where((cls == 1) | (cls == 2), sent // 4, 0), maxshape=(None,),
                             chunks=(1024,))


def write_benchmark(path):
    """A Google Benchmark JSON (tests/bench/compression_bench.cpp's names): lowrank encode at r 8 and 16
    with 3 repetitions (mean and median aggregates), powersgd at r 16 once, int8 at its defaults."""
    bench = []
    for r, reps in ((8, [2.0e9, 3.0e9, 2.5e9]), (16, [1.0e9, 1.5e9, 1.2e9])):
        name = f"codec/lowrank/encode/fig14/1024x1920/r{r}"
        bench += [{"name": name, "run_name": name, "run_type": "iteration", "bytes_per_second": b} for b in reps]
        bench += [{"name": f"{name}_mean", "run_name": name, "run_type": "aggregate", "aggregate_name": "mean",
                   "bytes_per_second": float(np.mean(reps))},
                  {"name": f"{name}_median", "run_name": name, "run_type": "aggregate", "aggregate_name": "median",
                   "bytes_per_second": float(np.median(reps))}]
    bench.append({"name": "reducer/powersgd/reduce/fig14/1024x1920/r16", "run_type": "iteration",
                  "bytes_per_second": 0.7e9})
    bench.append({"name": "codec/int8/encode/fig14/1024x1920", "run_type": "iteration", "bytes_per_second": 5e9})
    bench.append({"name": "membw/copy_256MiB", "run_type": "iteration", "bytes_per_second": 9e9})
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"context": {"date": "2026-01-01"}, "benchmarks": bench}, f)


def script(name, *args):
    return subprocess.run([PY, os.path.join(SOURCE, "scripts", name), *args], capture_output=True, text=True)


class FiguresTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.results = os.path.join(cls.tmp.name, "results")
        cls.paper = os.path.join(cls.tmp.name, "paper")
        build_results(cls.results)
        cls.index_run = script("results_index.py", "--results", cls.results)
        cls.fig_run = script("make_figures.py", "--results", cls.results, "--out", cls.paper)
        cls.fig_rerun = script("make_figures.py", "--results", cls.results, "--out", cls.paper)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def index(self):
        self.assertEqual(self.index_run.returncode, 0, self.index_run.stderr)
        with open(os.path.join(self.results, "index.csv")) as f:
            return {(r["experiment"], r["run"]): r for r in csv.DictReader(f)}

    def test_index_statuses_and_steps(self):
        rows = self.index()
        rows = {k: v for k, v in rows.items() if k[0] not in ("ablation", "compressors")}
        self.assertEqual(sorted(rows), [("", "loose"), ("exp", "baseline-seed1"), ("exp", "baseline-seed2"),
                                        ("exp", "baseline-seed3"), ("exp", "broken"), ("exp", "cb-seed1"),
                                        ("exp", "cb-seed2"), ("exp", "cb_fe-seed1"), ("exp", "empty")])
        expect = {"baseline-seed1": ("complete", "10"), "cb-seed2": ("complete", "10"), "cb_fe-seed1": ("partial", "6"),
                  "broken": ("failed", "0"), "empty": ("failed", "0")}
        for run, (status, last) in expect.items():
            self.assertEqual((rows[("exp", run)]["status"], rows[("exp", run)]["last_step"]), (status, last), run)
        self.assertEqual(rows[("exp", "cb_fe-seed1")]["note"], "step 6 of 10")
        self.assertEqual(rows[("exp", "empty")]["note"], "no training step flushed")
        self.assertIn("no readable file", rows[("exp", "broken")]["note"])
        self.assertIn("15 runs (11 complete, 1 partial, 3 failed)", self.index_run.stdout)
        self.assertEqual(self.index()[("compressors", "b_powersgd-seed1")]["compression"], "dp=powersgd(rank=4)")
        self.assertEqual(rows[("exp", "cb-seed1")]["compression"], "")  # not recorded in these files

    def test_index_final_values_exact(self):
        rows = self.index()
        for (scheme, seed), (loss, ppl) in FINAL.items():
            r = rows[("exp", f"{scheme}-seed{seed}")]
            self.assertEqual(float(r["final_valid_ppl"]), ppl)
            self.assertEqual(float(r["final_valid_loss"]), loss)
            self.assertEqual((r["eval_step"], r["seed"], r["scheme"]), ("10", str(seed), scheme))
        b1 = rows[("exp", "baseline-seed1")]
        self.assertEqual(float(b1["bytes_per_step"]), sum(BYTES["baseline"][:5]))
        self.assertEqual(float(b1["step_seconds"]), 2.0)
        self.assertEqual(b1["git_revision"], "abc123")
        # seeds of one configuration share `configuration`, not `config_hash`
        self.assertEqual(b1["configuration"], rows[("exp", "baseline-seed2")]["configuration"])
        self.assertNotEqual(b1["config_hash"], rows[("exp", "baseline-seed2")]["config_hash"])
        self.assertNotEqual(b1["configuration"], rows[("exp", "cb-seed1")]["configuration"])

    def test_index_merges_resumed_file(self):
        rows = self.index()
        self.assertEqual(rows[("exp", "cb-seed2")]["files"], "exp/cb-seed2.h5;exp/cb-seed2.resumed-5.h5")
        sys.path.insert(0, os.path.join(SOURCE, "scripts"))
        import optcc_results as R
        run = [r for r in R.load_runs(self.results) if r.name == "cb-seed2"][0]
        train = run.table("train")
        self.assertEqual(train["step"].tolist(), list(range(1, 11)))
        # steps 1..5 from the first file (shifted by 0.5), 6..10 from the resumed one
        expected = [9.0 - 0.3 * s + (0.5 if s <= 5 else 0.0) for s in range(1, 11)]
        self.assertEqual(train["loss"].tolist(), expected)
        self.assertEqual(run.table("eval")["step"].tolist(), [5, 10])

    def test_bytes_per_step_under_diloco_covers_whole_periods(self):
        """DiLoCo's outer bytes (class 6) come once per H = 16 steps: the mean is over whole periods
        (the last 32 of 40 steps, syncs at 16 and 32), B/16, not B/20 as the last 20 steps would give."""
        sys.path.insert(0, os.path.join(SOURCE, "scripts"))
        import optcc_results as R
        outer = 1600000

        def rows_of_step(step, rows):
            rows["train"].append([step, 5.0, 1e-3, 1.0, 1.0, 256.0])
            rows["traffic"].append([step, 0, 0, 0, 1000, 1, 0.0, 0.0])
            if step % 16 == 0:
                rows["traffic"].append([step, 0, 6, 1, outer, 1, 0.0, 0.0])
        with tempfile.TemporaryDirectory() as root:
            runs = diloco_and_allreduce_runs(root, rows_of_step, {"train_steps": 40})
            self.assertEqual(runs["diloco-seed1"].outer_period(), 16)
            self.assertIsNone(runs["plain-seed1"].outer_period())
            self.assertEqual(runs["diloco-seed1"].bytes_per_step(), {**{c: 0.0 for c in R.TRAFFIC_CLASSES},
                                                                      "tp": 1000.0, "outer": outer / 16})
            self.assertEqual(runs["plain-seed1"].bytes_per_step()["outer"], outer / 20)
        # A trial shorter than the window (20 steps, H = 16): the one whole period after step 1 (steps
        # 5..20, the sync at 16), B/16, not B/19 over steps 2..20.
        with tempfile.TemporaryDirectory() as root:
            runs = diloco_and_allreduce_runs(root, rows_of_step, {"train_steps": 20})
            self.assertEqual(runs["diloco-seed1"].bytes_per_step()["outer"], outer / 16)

    def test_step_time_under_diloco_is_the_mean_over_whole_periods(self):
        """Steps take 1 s except the outer exchange's (every H = 16th: 5 s). Under DiLoCo the step time is
        the mean over the whole periods after the warm-up, steps 17..32 (1 period of the 40 steps):
        (15 + 5) / 16 = 1.25 s, tokens/s 256 / 1.25; the same rows under all-reduce give the median, 1 s."""
        sys.path.insert(0, os.path.join(SOURCE, "scripts"))
        import optcc_results as R
        def rows_of_step(step, rows):
            seconds = 5.0 if step % 16 == 0 else 1.0
            rows["train"].append([step, 5.0, 1e-3, 1.0, seconds, 256.0 / seconds])
        with tempfile.TemporaryDirectory() as root:
            runs = diloco_and_allreduce_runs(root, rows_of_step)
            steps, statistic = runs["diloco-seed1"].timed_steps()
            self.assertEqual((steps.tolist(), statistic), (list(range(17, 33)), "mean"))
            self.assertEqual(runs["diloco-seed1"].step_time(), (1.25, 256.0 / 1.25))
            self.assertEqual(runs["plain-seed1"].timed_steps()[1], "median")
            self.assertEqual(runs["plain-seed1"].step_time(), (1.0, 256.0))

    def test_figures_files(self):
        self.assertEqual(self.fig_run.returncode, 0, self.fig_run.stdout + self.fig_run.stderr)
        self.assertNotIn("Traceback", self.fig_run.stdout + self.fig_run.stderr)
        made = sorted(os.listdir(os.path.join(self.paper, "exp")))
        self.assertEqual(made, sorted(["index.md"] + [f"{s}.{e}" for s in ("table",) for e in ("md", "tex")] +
                                      [f"{s}.{e}" for s in ("curves", "pareto") for e in ("png", "pdf")] +
                                      [f"{s}.{e}" for s in ("memory", "lep_orthogonality")
                                       for e in ("png", "pdf", "md", "tex")]))
        out = self.fig_run.stdout
        self.assertIn("1 runs directly in", out)
        self.assertIn("exp: skipped breakdown (no /breakdown rows: set log.timeline_steps)", out)
        self.assertIn("bench/compression.json -> ", out)
        self.assertEqual(sorted(os.listdir(os.path.join(self.paper, "bench"))),
                         [f"compression-fig14.{e}" for e in ("md", "pdf", "png", "tex")])
        self.assertEqual(self.fig_rerun.returncode, 0)
        self.assertIn("0 files written", self.fig_rerun.stdout)  # deterministic: nothing changes

    def table_rows(self, name):
        with open(os.path.join(self.paper, "exp", name)) as f:
            lines = [l for l in f.read().splitlines() if l.startswith("| ") and "---" not in l]
        header = [c.strip() for c in lines[0].strip("|").split("|")]
        return {r[0]: dict(zip(header, r)) for r in ([c.strip() for c in l.strip("|").split("|")] for l in lines[1:])}

    def test_table_numbers(self):
        rows = self.table_rows("table.md")
        self.assertEqual(list(rows), ["baseline", "cb", "cb_fe (partial)"])  # broken: no config, no row
        base_ppl = [FINAL[("baseline", s)][1] for s in (1, 2, 3)]
        cb_ppl = [FINAL[("cb", s)][1] for s in (1, 2)]
        b, c = rows["baseline"], rows["cb"]
        self.assertEqual(b["valid ppl"], f"{statistics.mean(base_ppl):.2f} ± {statistics.stdev(base_ppl):.2f}")
        self.assertEqual(c["valid ppl"], f"{statistics.mean(cb_ppl):.2f} ± {statistics.stdev(cb_ppl):.2f}")
        base_loss = [FINAL[("baseline", s)][0] for s in (1, 2, 3)]
        self.assertEqual(b["valid loss"], f"{statistics.mean(base_loss):.4f} ± {statistics.stdev(base_loss):.4f}")
        d = [FINAL[("cb", s)][0] - FINAL[("baseline", s)][0] for s in (1, 2)]
        self.assertEqual(c["Δ loss vs ref (paired)"], f"{statistics.mean(d):+.4f} ± {statistics.stdev(d):.4f} (n=2)")
        self.assertEqual(c["ppl vs ref"], f"{100 * (statistics.mean(cb_ppl) / statistics.mean(base_ppl) - 1):+.1f}%")
        self.assertEqual(c["speed-up"], f"{2.0 / 1.6:.3f}")
        # empty.h5 has the baseline config (seed 9): a failed run of that configuration
        self.assertEqual((b["runs"], b["seeds"], c["seeds"]), ("3 + 1 failed", "1,2,3", "1,2"))
        self.assertEqual(c["pp_bwd MB/step"], "0.250")
        self.assertEqual(c["total MB/step"], f"{sum(BYTES['cb'][:5]) / 1e6:.3f}")
        p = rows["cb_fe (partial)"]
        self.assertEqual((p["runs"], p["valid ppl"], p["steps"]), ("0 + 1 partial (step 6/10)", f"{math.exp(7.6):.2f}", "6"))

    def test_orthogonality_and_memory_tables(self):
        orth = self.table_rows("lep_orthogonality.md")
        cos = [0.01, -0.02, 0.03]
        self.assertEqual(orth["cb"]["mean abs(cos)"], f"{statistics.mean(abs(x) for x in cos):.4f}")
        self.assertEqual(orth["cb"]["mean cos"], f"{statistics.mean(cos):+.4f}")
        self.assertEqual(orth["cb"]["rows"], str(3 * STEPS * 2))
        mem = self.table_rows("memory.md")
        # the largest value of each component over the ranks
        self.assertEqual((mem["cb"]["lep_buffers MiB"], mem["cb"]["tracked peak MiB"], mem["baseline"]["activations_peak MiB"]),
                         (f"{65536 / 2**20:.3f}", f"{(7000001 + 65536) / 2**20:.3f}", f"{3000001 / 2**20:.3f}"))

    def test_fig14_table(self):
        with open(os.path.join(self.paper, "bench", "compression-fig14.md")) as f:
            md = f.read()
        self.assertIn("| compressor | shape | r=8 | r=16 |", md)
        self.assertIn("| lowrank encode | 1024x1920 | 2.50 | 1.20 |", md)  # medians of the repetitions
        self.assertIn("| powersgd reduce | 1024x1920 |  | 0.70 |", md)
        self.assertIn("at its defaults: int8 encode 1024x1920: 5.00 GB/s", md)

    def test_ablation_labels(self):
        with open(os.path.join(self.paper, "ablation", "table.md")) as f:
            md = f.read()
        rows = [l.split(" | ")[0].lstrip("| ") for l in md.splitlines() if l.startswith("| rank=")]
        self.assertEqual(rows, ["rank=4", "rank=16"])  # numeric order; the unreadable file adds no key
        self.assertIn("- reference: rank=4 (no uncompressed run in this experiment: the first configuration); "
                      "configurations differ in: compression.pipeline_backward.rank", md)

    def test_compressor_comparison_names_runs_by_what_they_compress(self):
        with open(os.path.join(self.paper, "compressors", "table.md")) as f:
            md = f.read()
        rows = [l.split(" | ")[0].lstrip("| ") for l in md.splitlines() if l.startswith("| ") and "---" not in l][1:]
        self.assertEqual(rows, ["baseline", "dp=powersgd(rank=4)", "dp=topk(fraction=0.01)"])  # reference first
        self.assertIn("- reference: baseline (no compression)", md)
        # the stage-to-stage wire beside each pipeline class (these files have /traffic/p2p_bytes; exp's do not)
        header = [c.strip() for c in md.splitlines()[2].strip("|").split("|")]
        self.assertEqual(header[10:15], ["tp MB/step", "pp_fwd MB/step", "pp_fwd wire MB/step", "pp_bwd MB/step",
                                         "pp_bwd wire MB/step"], md)
        cells = [c.strip() for c in md.splitlines()[4].strip("|").split("|")]
        self.assertEqual(cells[11:15], [f"{BYTES['baseline'][1] / 1e6:.3f}", f"{BYTES['baseline'][1] / 4e6:.3f}",
                                        f"{BYTES['baseline'][2] / 1e6:.3f}", f"{BYTES['baseline'][2] / 4e6:.3f}"], md)
        self.assertIn("wire: the stage-to-stage sends alone", md)
        self.assertNotIn("wire", "".join(self.table_rows("table.md")["cb"]))
        files = [os.path.join(self.results, "compressors", f"{n}-seed1.h5") for n in ("a_topk", "z_none")]
        r = script("scheme_table.py", *files)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertIn("z_none-seed1 (uncompressed)", lines[0])
        self.assertIn("| pp_fwd MB/step | pp_fwd wire MB/step | pp_bwd MB/step | pp_bwd wire MB/step |", lines[2])
        self.assertTrue(lines[4].startswith("| baseline | z_none-seed1 | 10/10 | 5.1000 |"), r.stdout)
        self.assertTrue(lines[5].startswith(f"| dp=topk(fraction=0.01) | a_topk-seed1 | 10/10 | 5.3000 | "
                                            f"{math.exp(5.3):.2f} | {100 * (math.exp(5.3) / math.exp(5.1) - 1):+.2f}% |"),
                        r.stdout)
        r = script("scheme_table.py", files[0])
        self.assertIn("the first run (no complete uncompressed run given)", r.stdout)

    def test_scheme_table_merges_a_runs_files_and_flags_what_is_not_comparable(self):
        exp = os.path.join(self.results, "exp")
        # cb-seed2's first part only: its resumed part (steps 6..10) is found beside it and merged.
        r = script("scheme_table.py", os.path.join(exp, "baseline-seed1.h5"), os.path.join(exp, "cb-seed2.h5"),
                   os.path.join(exp, "cb_fe-seed1.h5"), "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        out = json.loads(r.stdout)
        rows = {os.path.basename(x["run"]): x for x in out["rows"]}
        self.assertEqual(list(rows), ["baseline-seed1", "cb-seed2", "cb_fe-seed1"])
        cb = rows["cb-seed2"]
        self.assertEqual((cb["steps"], cb["status"], len(cb["files"])), (STEPS, "complete", 2))
        self.assertEqual((cb["val_loss"], cb["val_ppl"]), FINAL[("cb", 2)])  # the resumed part's final evaluation
        self.assertEqual(cb["notes"], ["2 files merged"])
        # The index's bytes per step (the last 20 recorded steps after the first: steps 2..10 here).
        self.assertAlmostEqual(cb["pp_bwd_MB_per_step"], BYTES["cb"][2] / 1e6)
        self.assertEqual(rows["cb_fe-seed1"]["notes"], ["partial: step 6 of 10",
                                                        "evaluated at step 5, the reference at 10: not comparable"])
        r = script("scheme_table.py", os.path.join(exp, "baseline-seed1.h5"), os.path.join(exp, "cb_fe-seed1.h5"))
        self.assertIn("| cb_fe-seed1 (compression not recorded) | cb_fe-seed1 | 6/10 |", r.stdout)
        self.assertIn("- NOT COMPARABLE with the reference (another step count, or partial): cb_fe-seed1", r.stdout)

    def test_compact_keeps_every_value(self):
        import shutil
        sys.path.insert(0, os.path.join(SOURCE, "scripts"))
        import optcc_results as R
        src = os.path.join(self.results, "exp", "cb-seed1.h5")
        dst = os.path.join(self.tmp.name, "compact", "cb-seed1.h5")
        os.makedirs(os.path.dirname(dst))
        shutil.copy(src, dst)
        r = script("compact_results.py", dst)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertLess(os.path.getsize(dst), os.path.getsize(src))
        a, b = R.Run.from_paths([src]), R.Run.from_paths([dst])
        self.assertEqual(a.attrs, b.attrs)
        for t in TABLES:
            ta, tb = a.table(t), b.table(t)
            self.assertEqual(sorted(ta), sorted(tb))
            for c in ta:
                self.assertEqual(ta[c].dtype, tb[c].dtype)
                self.assertEqual(ta[c].tolist(), tb[c].tolist(), f"{t}/{c}")
        with h5py.File(dst, "r") as f:
            self.assertEqual((f["train"].attrs["columns"], f["train/loss"].compression), (",".join(TABLES["train"]), "gzip"))

    def test_trim_leaves_out_only_what_no_script_reads(self):
        import shutil
        sys.path.insert(0, os.path.join(SOURCE, "scripts"))
        import optcc_results as R
        src = os.path.join(self.results, "exp", "cb-seed1.h5")
        dst = os.path.join(self.tmp.name, "trim", "cb-seed1.h5")
        os.makedirs(os.path.dirname(dst))
        shutil.copy(src, dst)
        with h5py.File(dst, "a") as f:  # /lep_diagnostics: one row per step 1..STEPS
            g = f.create_group("lep_diagnostics")
            g.attrs["columns"] = "step,rank,relative_error"
            g.create_dataset("step", data=np.arange(1, STEPS + 1, dtype=np.int64), maxshape=(None,), chunks=(1024,))
            g.create_dataset("rank", data=np.ones(STEPS, dtype=np.int64), maxshape=(None,), chunks=(1024,))
            g.create_dataset("relative_error", data=np.linspace(0.5, 0.1, STEPS), maxshape=(None,), chunks=(1024,))
        for _ in range(2):  # a second --trim changes nothing
            r = script("compact_results.py", "--trim", dst)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        a, b = R.Run.from_paths([src]), R.Run.from_paths([dst])
        self.assertEqual(b.attrs.pop("trimmed").splitlines(), [
            f"/lep_diagnostics rows of steps < {STEPS // 2 + 1} dropped (the run's first half, which "
            "scripts/lep_study.py does not read)",
            "/traffic/seconds dropped (each collective's wall time, which no figure or table reads: step times "
            "are in /train and /timing)"])
        self.assertEqual(a.attrs, b.attrs)
        for t in TABLES:
            ta, tb = a.table(t), b.table(t)
            self.assertEqual(sorted(tb), sorted(c for c in ta if (t, c) != ("traffic", "seconds")), t)
            for c in tb:
                self.assertEqual(ta[c].tolist(), tb[c].tolist(), f"{t}/{c}")
        lep = b.table("lep_diagnostics")
        self.assertEqual(lep["step"].tolist(), list(range(STEPS // 2 + 1, STEPS + 1)))
        self.assertEqual(lep["relative_error"].tolist(), np.linspace(0.5, 0.1, STEPS)[STEPS // 2:].tolist())
        with h5py.File(dst, "r") as f:  # optcc's C++ reader opens the columns the attribute names
            self.assertEqual(f["traffic"].attrs["columns"], "step,rank,class,link,bytes,calls,emulated_seconds")
            self.assertNotIn("seconds", f["traffic"])

    def test_experiment_filter(self):
        other = os.path.join(self.tmp.name, "only")
        r = script("make_figures.py", "--results", self.results, "--out", other, "--experiment", "nope")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("make_figures: nope: no results under", r.stdout)
        self.assertFalse(os.path.exists(other) and os.listdir(other))


class ConfigChangeTest(unittest.TestCase):
    """A part resumed with --allow-config-change (attribute resume_config_changes) is not merged into
    the run it continues: load_runs and the index show it as a run of its own."""

    def test_changed_config_part_is_its_own_run(self):
        with tempfile.TemporaryDirectory() as tmp:
            exp = os.path.join(tmp, "results", "exp")
            os.makedirs(exp)
            final = FINAL[("cb", 1)]
            write_file(os.path.join(exp, "x.h5"), attrs_of("cb", 1, "x", "2026-01-01T00:00:00Z"),
                       run_rows("cb", 1, 1, 7, final))
            changed = attrs_of("cb", 1, "x", "2026-01-01T01:00:00Z", 5)
            changed["resume_config_changes"] = "  train.lr: 0.003 -> 0.002\n"
            write_file(os.path.join(exp, "x.resumed-5.h5"), changed, run_rows("cb", 1, 6, STEPS, final))
            sys.path.insert(0, os.path.join(SOURCE, "scripts"))
            import optcc_results as R
            runs = {r.name: r for r in R.load_runs(os.path.join(tmp, "results"))}
            self.assertEqual(sorted(runs), ["x", "x (config changed at step 5)"])
            self.assertEqual(runs["x"].table("train")["step"].tolist(), list(range(1, 8)))
            self.assertEqual(runs["x (config changed at step 5)"].table("train")["step"].tolist(), list(range(6, 11)))
            done = script("results_index.py", "--results", os.path.join(tmp, "results"))
            self.assertEqual(done.returncode, 0, done.stderr)
            with open(os.path.join(tmp, "results", "index.csv")) as f:
                rows = {r["run"]: r for r in csv.DictReader(f)}
            self.assertEqual(rows["x"]["files"], "exp/x.h5")
            self.assertEqual(rows["x (config changed at step 5)"]["files"], "exp/x.resumed-5.h5")


class BuildsTest(unittest.TestCase):
    """A key a build did not have yet (scripts/config_keys_added.yaml) reads as the value that build ran
    as: one configuration written by an older and a newer build forms one group with paired seeds."""

    def test_older_file_without_the_newer_keys_groups_with_a_newer_one(self):
        sys.path.insert(0, os.path.join(SOURCE, "scripts"))
        import optcc_results as R
        from figures import configs
        with tempfile.TemporaryDirectory() as tmp:
            exp = os.path.join(tmp, "results", "exp")
            os.makedirs(exp)
            final = FINAL[("baseline", 1)]
            old = attrs_of("baseline", 1, "baseline-seed1", "2026-01-01T00:00:00Z")  # no newer key at all
            write_file(os.path.join(exp, "baseline-seed1.h5"), old, run_rows("baseline", 1, 1, STEPS, final))
            new = attrs_of("baseline", 2, "baseline-seed2", "2026-02-01T00:00:00Z")
            cfg = yaml.safe_load(new["config"])
            for section, keys in R.KEYS_ADDED.items():  # a newer build records every key, at its default
                cfg.setdefault(section, {}).update(keys)
            cfg["train"]["skip_nonfinite"] = False
            new["config"] = yaml.safe_dump(cfg, sort_keys=False)
            write_file(os.path.join(exp, "baseline-seed2.h5"), new, run_rows("baseline", 2, 1, STEPS, final))
            runs = {r.name: r for r in R.load_runs(os.path.join(tmp, "results"))}
            self.assertNotIn("dp_strategy", runs["baseline-seed1"].config["compression"])
            self.assertEqual(runs["baseline-seed1"].configuration(), runs["baseline-seed2"].configuration())
            self.assertEqual(runs["baseline-seed1"].configuration_hash(), runs["baseline-seed2"].configuration_hash())
            groups = configs.group_configurations("exp", list(runs.values()))
            self.assertEqual(len(groups), 1)
            self.assertEqual(sorted(r.name for r in groups[0].runs), ["baseline-seed1", "baseline-seed2"])
            # A value that differs from what the older build ran as is a different configuration.
            cfg["compression"]["dp_strategy"] = "diloco"
            new["config"] = yaml.safe_dump(cfg, sort_keys=False)
            write_file(os.path.join(exp, "diloco-seed2.h5"), new, run_rows("baseline", 2, 1, STEPS, final))
            runs = {r.name: r for r in R.load_runs(os.path.join(tmp, "results"))}
            self.assertNotEqual(runs["baseline-seed1"].configuration_hash(), runs["diloco-seed2"].configuration_hash())


class ReferenceResultsTest(unittest.TestCase):
    """make_figures.py on the committed reference results: every run complete, every figure drawn."""

    def test_reference(self):
        ref = os.path.join(SOURCE, "results", "reference")
        if not os.path.isdir(ref):
            self.skipTest("no results/reference in this checkout")
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "paper")
            r = script("make_figures.py", "--results", ref, "--out", out, "--experiment", "table2")
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            for f in ("table.md", "curves.png", "pareto.pdf", "memory.png"):
                self.assertTrue(os.path.exists(os.path.join(out, "table2", f)), f)
            # Table 4's three schemes send the same bytes to within 0.07%: no Pareto plot, a reason,
            # and an earlier run's pareto files are removed as stale.
            os.makedirs(os.path.join(out, "table4"))
            for ext in ("png", "pdf"):
                with open(os.path.join(out, "table4", f"pareto.{ext}"), "w") as f:
                    f.write("stale")
            r = script("make_figures.py", "--results", ref, "--out", out, "--experiment", "table4")
            self.assertIn("2 stale removed", r.stdout)
            self.assertFalse(os.path.exists(os.path.join(out, "table4", "pareto.pdf")))
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertTrue(os.path.exists(os.path.join(out, "table4", "curves.png")))
            self.assertFalse(os.path.exists(os.path.join(out, "table4", "pareto.png")))
            self.assertIn("pareto (fewer than 2 configurations with a final ppl and /traffic, or their MB per step "
                          "within 1%)", r.stdout)

    def test_reference_index(self):
        """The trainer's own files: Table 2 at cpu scale (5 schemes x 3 seeds, 300 steps), one run
        killed at the end of a session and resumed from its step-100 checkpoint (two files, merged)."""
        ref = os.path.join(SOURCE, "results", "reference")
        if not os.path.isdir(ref):
            self.skipTest("no results/reference in this checkout")
        sys.path.insert(0, os.path.join(SOURCE, "scripts"))
        import optcc_results as R
        import results_index
        rows = {(r["experiment"], r["run"]): r for r in results_index.build_index(ref)}
        t2 = {run: r for (exp, run), r in rows.items() if exp == "table2"}
        self.assertEqual(sorted(t2), sorted([f"{s}-seed{n}" for s in ("baseline", "cb", "cb_fe", "cb_fe_sc", "cb_nonlep")
                                             for n in (1, 2, 3)]))
        self.assertEqual({r["status"] for r in t2.values()}, {"complete"})
        self.assertEqual({r["last_step"] for r in t2.values()}, {300})
        self.assertEqual(t2["cb-seed3"]["files"], "table2/cb-seed3.h5;table2/cb-seed3.resumed-100.h5")
        run = R.Run("table2", "cb-seed3", [os.path.join(ref, "table2", f) for f in
                                          ("cb-seed3.resumed-100.h5", "cb-seed3.h5")])
        self.assertEqual([f.first_step for f in run.files], [0, 100])  # ordered by start, not by argument
        self.assertEqual(run.table("train")["step"].tolist(), list(range(1, 301)))
        self.assertEqual(run.table("eval")["step"].tolist(), list(range(0, 301, 50)))
        self.assertEqual(rows[("fig11", "seed1")]["status"], "complete")
        t4 = {run: r for (exp, run), r in rows.items() if exp == "table4"}  # m = 16, 3 schemes x 3 seeds
        self.assertEqual(sorted(t4), sorted([f"m16-{s}-seed{n}" for s in ("baseline", "cb", "cb_nonlep")
                                             for n in (1, 2, 3)]))
        self.assertEqual({r["status"] for r in t4.values()}, {"complete"})


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
