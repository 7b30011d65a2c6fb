#!/usr/bin/env python3
"""Why each failed CTest test failed, in a few lines, for the end of a CI log.

  .ci/failed_tests.py BUILD_DIR [BUILD_DIR ...]

Reads BUILD_DIR/Testing/Temporary/LastTestsFailed.log (the names) and LastTest.log (their output),
and prints for each failed test (at most MAX_TESTS of them) the lines of its output that say why
(FAIL, a GoogleTest failure, a crash, a timeout) and its last lines, MAX_LINES in all, each prefixed
"ci: <test>: ". A CI log is often read from its end; ctest prints a failing test's output where the
test ran, hundreds of tests earlier. Prints nothing for a build folder whose last ctest passed.
"""
import re
import sys
from pathlib import Path

MAX_TESTS = 3
MAX_LINES = 14
TAIL_LINES = 5
# Lines that say why: the tests' own FAIL lines, GoogleTest's failure lines, crashes and timeouts
# (not every "error": daemons' logs that a test prints on failure are full of harmless ones).
WHY = re.compile(r"^FAIL|FAIL[: ]|: Failure$|Expected|Which is|terminate called|what\(\)|Segmentation|SIGSEGV|"
                 r"Abort|Killed|timed out|Timeout")


def outputs(log: str):
    """{test name: its output lines} from a LastTest.log."""
    found = {}
    for block in log.split("\n----------------------------------------------------------\n\n"):
        m = re.search(r"^\d+/\d+ Testing: (\S+)", block, re.M)
        out = re.search(r"\nOutput:\n-+\n(.*?)<end of output>", block, re.S)
        if m and out:
            found[m.group(1)] = out.group(1).splitlines()
    return found


def digest(lines):
    why = [i for i, line in enumerate(lines) if WHY.search(line)]
    tail = list(range(max(0, len(lines) - TAIL_LINES), len(lines)))
    keep = sorted(set(why[: MAX_LINES - len(tail)] + tail))
    shown, last = [], -1
    for i in keep:
        if last >= 0 and i != last + 1:
            shown.append("...")
        shown.append(lines[i].rstrip()[:300])
        last = i
    return shown


def main(dirs):
    for d in dirs:
        tmp = Path(d) / "Testing" / "Temporary"
        failed_log, last_log = tmp / "LastTestsFailed.log", tmp / "LastTest.log"
        if not failed_log.is_file() or not last_log.is_file():
            continue
        if failed_log.stat().st_mtime < last_log.stat().st_mtime - 60:
            continue  # from an earlier ctest; the last one passed
        names = [line.split(":", 1)[1].strip() for line in failed_log.read_text().splitlines() if ":" in line]
        if not names:
            continue
        out = outputs(last_log.read_text(errors="replace"))
        print(f"ci: failed tests in {d} ({len(names)}); why, from {last_log}:")
        for name in names[:MAX_TESTS]:
            for line in digest(out.get(name, ["(no output recorded)"])):
                print(f"ci: {name}: {line}")
        if len(names) > MAX_TESTS:
            print(f"ci: ... and {len(names) - MAX_TESTS} more: {' '.join(names[MAX_TESTS:])}")


if __name__ == "__main__":
    main(sys.argv[1:])
