#!/usr/bin/env python3
"""slurm/experiment_runs.py's shared runner rules without Slurm or optcc: --only selection, the .done
marker's record of extra arguments and the warning when they differ.

  experiment_runs_test.py REPO_ROOT
"""
import contextlib
import io
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "."), "slurm"))
import experiment_runs as er  # noqa: E402

NAMES = ["baseline-seed1", "lazy-r16-seed1", "lazy-r64-seed1", "off-r16-seed1"]


def plan(names):
    return {"results_dir": "results/exp", "runs": [
        {"index": i, "run": n, "world_size": 2, "args": ["train", "--config", "x.yaml"],
         "results": f"results/exp/{n}.h5", "checkpoint_dir": f"results/exp/ckpt/{n}"} for i, n in enumerate(names)]}


class RunnerRulesTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.settings = er.Settings({"OPTCC_RESULTS": self.tmp.name})
        p = plan(NAMES)
        self.runs = [er.Run(self.settings, p, r) for r in p["runs"]]

    def tearDown(self):
        self.tmp.cleanup()

    def test_only_selects_by_name(self):
        self.assertEqual([r.name for r in er.select_runs(self.runs, "r16|baseline", "exp.yaml")],
                         ["baseline-seed1", "lazy-r16-seed1", "off-r16-seed1"])
        self.assertEqual(len(er.select_runs(self.runs, None, "exp.yaml")), 4)
        for bad in ("(", "nothing-matches"):
            with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()) as err:
                er.select_runs(self.runs, bad, "exp.yaml")
            self.assertIn("--only", err.getvalue())

    def test_extra_arguments_are_set_or_resume(self):
        er.check_extra(["--set", "train.train_steps=20", "--set=log.interval=5", "--resume", "--resume", "auto"])
        for bad in (["--onyl", "x"], ["--set"], ["--set", "novalue"], ["--nproc", "4"]):
            with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()) as err:
                er.check_extra(bad)
            self.assertIn("extra argument", err.getvalue())

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


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
