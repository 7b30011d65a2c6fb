#!/usr/bin/env python3
"""Tests of .ci/failed_tests.py (the failed tests' reasons repeated at the end of a CI log).

  ci_failed_tests_test.py REPO_ROOT

Builds ctest's two logs by hand in a temporary build folder and checks what the script prints: the
failed test's FAIL line and its last lines, not the daemons' noise in between nor a passed test's
output; nothing for a folder whose last ctest passed (no failed list, or one older than the log).
"""
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SEP = "----------------------------------------------------------"


def block(n, name, lines, passed):
    out = "\n".join(lines)
    return (f"{n}/2 Testing: {name}\n{n}/2 Test: {name}\nCommand: \"/bin/true\"\nDirectory: /x\n"
            f"\"{name}\" start time: Dec 07 18:22 UTC\nOutput:\n{SEP}\n{out}\n<end of output>\n"
            f"Test time =   1.00 sec\n{SEP}\nTest {'Passed' if passed else 'Failed'}.\n"
            f"\"{name}\" end time: Dec 07 18:32 UTC\n\"{name}\" time elapsed: 00:10:41\n{SEP}\n\n")


def run(script, build):
    return subprocess.run([sys.executable, str(script), str(build)], capture_output=True, text=True, check=True).stdout


def main(root):
    script = Path(root) / ".ci" / "failed_tests.py"
    with tempfile.TemporaryDirectory() as tmp:
        build = Path(tmp) / "build"
        logs = build / "Testing" / "Temporary"
        logs.mkdir(parents=True)
        failing = ["== 1. two hosts (0 s)", "[2026-12-07T18:22:06] error: Couldn't load plugin mpi/pmix_v4",
                   "FAIL (step 4, 637 s): job 5 still queued or running after 600s [queue: 5 RUNNING None]"] + \
                  [f"slurmd log line {i}" for i in range(30)] + ["last line"]
        (logs / "LastTest.log").write_text(
            "Start testing: Dec 07 18:22 UTC\n" + SEP + "\n" +
            block(1, "Codec.Passes", ["[  PASSED  ] 1 test.", "FAIL this is a passed test's text"], True) +
            block(2, "slurm_two_node", failing, False))
        failed = logs / "LastTestsFailed.log"
        failed.write_text("6:slurm_two_node\n")
        out = run(script, build)
        lines = out.splitlines()
        assert lines[0].startswith("ci: failed tests in") and "(1)" in lines[0], out
        assert any("slurm_two_node: FAIL (step 4, 637 s): job 5 still queued" in l for l in lines), out
        assert lines[-1] == "ci: slurm_two_node: last line", out
        assert not any("pmix" in l for l in lines), out  # a daemon's "error:" is not a reason
        assert not any("passed test" in l for l in lines), out
        assert len(lines) <= 1 + 14 + 2, out  # the header, at most MAX_LINES lines and "..." markers
        # An older failed list (a run before the last ctest, which passed) prints nothing.
        old = time.time() - 3600
        os.utime(failed, (old, old))
        assert run(script, build) == "", "stale failed list"
        failed.unlink()
        assert run(script, build) == "", "no failed list"
        assert run(script, Path(tmp) / "absent") == "", "no build folder"
    print("ok: .ci/failed_tests.py prints the failed test's FAIL and last lines, and nothing after a passed run")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])
