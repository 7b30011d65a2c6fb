#!/usr/bin/env python3
"""scripts/lep_study.py on results files built here with h5py in the trainer's layout
(harness/train/run_records.cpp): one cell `lep-study-cell` of 3 seeds x {baseline, lazy-r16, off-r16,
lazy_iteration-r16}, final validation losses chosen so that lazy_iteration beats lazy and off at
every seed, and /lep_diagnostics rows with known values.

  lep_study_test.py SOURCE_DIR

Expected values are computed here from the numbers written, not read back.
"""
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
STEPS = 10
BASE = {1: 6.0, 2: 6.1, 3: 6.2}
SHIFT = {"lazy": [0.2, 0.1, 0.15], "off": [0.05, 0.0, -0.05], "lazy_iteration": [-0.01, -0.02, -0.1]}
REL_ERROR = {"lazy": 0.9, "off": 0.6, "lazy_iteration": 0.8}  # /lep_diagnostics relative_error per variant
TABLES = {
    "train": ["step", "loss", "lr", "grad_norm", "step_seconds", "tokens_per_second"],
    "eval": ["step", "loss", "ppl", "ppl_capped"],
    "lep_diagnostics": ["step", "rank", "microbatch", "slice_norm", "carried_norm", "error_norm", "relative_error",
                        "cos_carried_slice", "cos_carried_delta", "carried_age"],
}
INTS = {"step", "rank", "microbatch", "ppl_capped", "carried_age"}


def config(variant, seed, run, rank=16):
    comp = {"scheme": "baseline", "pipeline_backward": "none", "backward_phases": "all", "lep": "lazy"}
    if variant != "baseline":
        comp.update(scheme="cb", pipeline_backward={"name": "lowrank", "rank": rank}, lep=variant)
    return {"model": {"preset": "tiny"}, "parallel": {"tp": 1, "pp": 2, "dp": 1},
            "train": {"train_steps": STEPS, "seed": seed}, "compression": comp,
            "log": {"dir": "results/lep-study-cell", "run_name": run}, "checkpoint": {"dir": f"ckpt/{run}"}}


def write_run(path, variant, seed, final, rank=16):
    run = os.path.basename(path)[:-3]
    with h5py.File(path, "w", libver="latest") as f:
        f.attrs["config"] = yaml.safe_dump(config(variant, seed, run, rank), sort_keys=False)
        f.attrs["start_time"] = "2026-01-01T00:00:00Z"
        f.attrs["resumed_from_step"] = "0"
        rows = {k: [] for k in TABLES}
        for s in range(1, STEPS + 1):
            rows["train"].append([s, 9.0 - 0.2 * s, 1e-3, 1.0, 0.5, 512.0])
            if s % 5 == 0:
                loss = final if s == STEPS else final + 0.5
                rows["eval"].append([s, loss, float(np.exp(loss)), 0])
            if variant != "baseline":
                for mb in range(2):  # mb 0 carries from the previous iteration (age 1), mb 1 from mb 0 (age 0)
                    carried = 0.0 if variant == "off" else 0.5
                    age = -1 if variant == "off" else (1 if mb == 0 else 0)
                    rows["lep_diagnostics"].append([s, 1, mb, 2.0, carried, 2.0 * REL_ERROR[variant],
                                                    REL_ERROR[variant], 0.1 if carried else np.nan,
                                                    -0.02 if carried else np.nan, age])
        for group, cols in TABLES.items():
            g = f.create_group(group)
            g.attrs["columns"] = ",".join(cols)
            for i, c in enumerate(cols):
                g.create_dataset(c, data=np.array([r[i] for r in rows[group]], dtype=np.int64 if c in INTS else np.float64),
                                 maxshape=(None,), chunks=(1024,))


def write_rank16_cell(root):
    """The fixture's cell: baseline and SHIFT's variants at rank 16, seeds 1-3. Returns its folder."""
    cell = os.path.join(root, "results", "lep-study-cell")
    os.makedirs(cell)
    for seed in (1, 2, 3):
        write_run(os.path.join(cell, f"baseline-seed{seed}.h5"), "baseline", seed, BASE[seed])
        for v, shifts in SHIFT.items():
            write_run(os.path.join(cell, f"{v}-r16-seed{seed}.h5"), v, seed, BASE[seed] + shifts[seed - 1])
    return cell


def run_study(root):
    return subprocess.run([sys.executable, os.path.join(SOURCE, "scripts", "lep_study.py"), "--results",
                           os.path.join(root, "results"), "--out", os.path.join(root, "out")],
                          capture_output=True, text=True)


class LepStudyTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        root = cls.tmp.name
        write_rank16_cell(root)
        cls.out = os.path.join(root, "out")
        cls.proc = run_study(root)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def read(self, name):
        with open(os.path.join(self.out, name)) as f:
            return f.read()

    def row(self, table, first):
        for line in self.read(table).splitlines():
            cells = [c.strip() for c in line.strip("|").split("|")]
            if cells and cells[0] == first:
                return cells
        self.fail(f"no row {first!r} in {table}")

    def test_runs(self):
        self.assertEqual(self.proc.returncode, 0, self.proc.stderr + self.proc.stdout)
        for name in ("table.md", "table.tex", "diagnostics.md", "predictors.md", "verdict.md", "curves-cell.png"):
            self.assertTrue(os.path.exists(os.path.join(self.out, name)), name)

    def test_paired_differences(self):
        for v, shifts in SHIFT.items():
            mean, std = statistics.mean(shifts), statistics.stdev(shifts)
            seeds = ", ".join(f"{x:+.3f}" for x in shifts)
            self.assertEqual(self.row("table.md", v)[1], f"{mean:+.3f} ± {std:.3f} ({seeds})", v)
        self.assertEqual(self.row("table.md", "per_microbatch")[1], "–")

    def test_diagnostics(self):
        lazy = self.row("diagnostics.md", "lazy")
        self.assertEqual(lazy[1], "cell r16")
        self.assertEqual([float(x) for x in lazy[2:7]], [0.9, 0.25, 0.1, 0.02, 0.5])  # carried from mb 0: half
        self.assertEqual([float(x) for x in lazy[7:9]], [0.9, 0.25])  # every send is the last stage's (PP2)
        self.assertEqual(lazy[9], str(3 * 5 * 2))  # seeds x steps in the second half x sends
        off = self.row("diagnostics.md", "off")
        self.assertEqual(float(off[2]), 0.6)
        self.assertEqual(off[3], "nan")

    def test_verdict(self):
        text = self.read("verdict.md")
        self.assertTrue(text.startswith("Recommended: lazy_iteration"), text)
        self.assertIn("lazy_iteration: lower final loss than lazy at 3 of 3 paired seeds, than off at 3 of 3", text)
        self.assertIn("every seed in the 1 (cell, CB rank) pairs where the variants ran (cell r16)", text)

    def test_predictor_of_the_relative_error(self):
        # relative error per (variant, seed) against the paired difference, over all 9 points
        xs = [REL_ERROR[v] for v in SHIFT for _ in range(3)]
        ys = [d for v in SHIFT for d in SHIFT[v]]
        r = float(np.corrcoef(xs, ys)[0, 1])
        # within cells: the fixture has one cell, so its mean removed leaves r as it is; within
        # configurations: the fixture's relative error is one value per variant, so no r
        self.assertIn(f"| ‖e‖/‖slice‖ | {r:+.3f} | {r:+.3f} | +nan | 9 | 3 |", self.read("predictors.md"))


class CellWithoutLazyTest(unittest.TestCase):
    """Tier 3's layout: a second cell `lep-study-big` with the baseline, off and lazy_iteration but no
    lazy run. Its seeds count against off only, and the verdict says why the two counts differ."""

    def test_counts_and_note(self):
        with tempfile.TemporaryDirectory() as root:
            write_rank16_cell(root)
            big = os.path.join(root, "results", "lep-study-big")
            os.makedirs(big)
            for seed in (1, 2):
                write_run(os.path.join(big, f"baseline-seed{seed}.h5"), "baseline", seed, BASE[seed])
                write_run(os.path.join(big, f"off-r16-seed{seed}.h5"), "off", seed, BASE[seed] + 0.1)
                write_run(os.path.join(big, f"lazy_iteration-r16-seed{seed}.h5"), "lazy_iteration", seed,
                          BASE[seed] + 0.2)  # worse than off in this cell
            proc = run_study(root)
            self.assertEqual(proc.returncode, 0, proc.stderr + proc.stdout)
            with open(os.path.join(root, "out", "verdict.md")) as f:
                text = f.read()
            self.assertTrue(text.startswith("No variant beats both lazy and off"), text)
            self.assertIn("lazy_iteration: lower final loss than lazy at 3 of 3 paired seeds, than off at 3 of 5", text)
            self.assertIn("- a paired seed is one where both runs exist; no lazy run in big r16", text)
            self.assertNotIn("no off run", text)


class RanksWithoutTheVariantsTest(unittest.TestCase):
    """A tier-2 layout: lazy and off at ranks 16 and 64, lazy_iteration at rank 16 alone. The verdict
    names the (cell, rank) pairs where lazy_iteration ran, not rank 64, and the table leaves its rank-64
    cell empty."""

    def test_verdict_and_table(self):
        with tempfile.TemporaryDirectory() as root:
            cell = write_rank16_cell(root)
            for seed in (1, 2, 3):
                for v in ("lazy", "off"):
                    write_run(os.path.join(cell, f"{v}-r64-seed{seed}.h5"), v, seed, BASE[seed] + 0.01 * seed, rank=64)
            proc = run_study(root)
            self.assertEqual(proc.returncode, 0, proc.stderr + proc.stdout)
            with open(os.path.join(root, "out", "verdict.md")) as f:
                text = f.read()
            self.assertIn("every seed in the 1 (cell, CB rank) pairs where the variants ran (cell r16)", text)
            self.assertIn("lazy_iteration: lower final loss than lazy at 3 of 3 paired seeds, than off at 3 of 3", text)
            with open(os.path.join(root, "out", "table.md")) as f:
                rows = {c[0]: c for c in ([x.strip() for x in line.strip("|").split("|")]
                                          for line in map(str.strip, f) if line.startswith("|"))}
            self.assertEqual(rows["variant"][1:], ["cell r16", "cell r64"])
            self.assertEqual(rows["lazy_iteration"][2], "–")
            self.assertEqual(rows["off"][2], "+0.020 ± 0.010 (+0.010, +0.020, +0.030)")


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
