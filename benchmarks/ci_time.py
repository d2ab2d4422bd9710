"""What CI costs (issue 63): `.ci/run` from a fresh clone of this checkout's HEAD, as CI runs it
(install, ruff, mypy, the docs, every test), and the quick loop beside it.

- ci_wall_s: the seconds `.ci/run` took, clone excluded (goal <= 900 on a quiet 2-core machine).
- ci_tests_s: pytest's own figure of them ("N passed in S s").
- unit_s: `make test-unit` in the same clone after it (the half that starts no process).

Run it on a quiet machine (it is one: other work slows the suite, never fails it). The clone
keeps the machine's caches (pip, the booted nodes' image, the image lab's store), as a CI
machine that ran before does. Prints `RESULT ci_wall_s=…`, `RESULT ci_tests_s=…`,
`RESULT unit_s=…`, and the suite's `--durations=15` as it said them.

    .venv/bin/python benchmarks/ci_time.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from xml.etree import ElementTree

REPO = Path(__file__).resolve().parents[1]


def timed(argv: list[str], cwd: Path, log: Path,
          env: dict[str, str] | None = None) -> tuple[float, int, str]:
    """``argv`` in ``cwd``, its output into ``log``: (seconds, exit code, its output's tail)."""
    started = time.monotonic()
    with log.open("w") as out:
        code = subprocess.run(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                              env=None if env is None else {**os.environ, **env}).returncode
    seconds = time.monotonic() - started
    return seconds, code, log.read_text(errors="replace")[-6000:]


def by_module(junit: Path, shown: int = 15) -> str:
    """The test modules that took longest in all (a test's seconds include its setup), from
    pytest's JUnit XML: where a CI's time goes, more than the 15 slowest tests say."""
    seconds: dict[str, float] = defaultdict(float)
    for case in ElementTree.parse(junit).iter("testcase"):
        module = case.get("classname", "?").removeprefix("tests.").split(".")[0]
        seconds[module] += float(case.get("time", 0))
    ranked = sorted(seconds.items(), key=lambda item: -item[1])[:shown]
    return "\n".join([f"{sum(seconds.values()):.0f} s of tests in all; by module:",
                      *(f"{s:8.1f}  {name}" for name, s in ranked)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, help="clone here and keep it (default: a temporary "
                        "directory, removed after)")
    args = parser.parse_args()
    where = args.keep or Path(tempfile.mkdtemp(prefix="sortie-ci-"))
    clone = where / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    try:
        junit = where / "junit.xml"  # every test's seconds, to see where the time goes
        seconds, code, tail = timed([".ci/run"], clone, where / "ci.log",
                                    {"PYTEST_ADDOPTS": f"--junitxml={junit}"})
        print(tail[tail.find("slowest 15"):] if "slowest 15" in tail else tail[-3000:])
        if junit.is_file():
            print(by_module(junit))
        if code != 0:
            print(f".ci/run failed (exit {code}): {where / 'ci.log'}", file=sys.stderr)
            return 1
        print(f"RESULT ci_wall_s={seconds:.0f}")
        if found := re.search(r" in ([\d.]+)s \(", tail):
            print(f"RESULT ci_tests_s={float(found.group(1)):.0f}")
        unit, code, tail = timed(["make", "-s", "test-unit"], clone, where / "unit.log")
        if code != 0:
            print(f"make test-unit failed (exit {code}): {where / 'unit.log'}", file=sys.stderr)
            return 1
        print(f"RESULT unit_s={unit:.0f}")
        return 0
    finally:
        if args.keep is None:
            shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
