"""Run report: how big a 1,000-step run's `report.html` is, how long sortie takes to write it,
and how long a headless browser takes to load it (issue 19: under 1 MB, under a second).

Runs of 100 and 1,000 logged steps (loss, lr, samples/s, tokens/s; a save every 20 steps) are
rendered in interleaved rounds so that machine noise hits both alike, after one untimed warm-up.
The browser (Debian's chromium through Playwright) loads each report the same way where it is
installed. Prints the medians and
RESULT report_bytes_1000_steps=<bytes> (target < 1000000),
RESULT report_write_s_1000_steps=<median seconds to write it>,
RESULT report_load_s_1000_steps=<median seconds for the browser to load it> (target < 1; -1
where no browser is installed) and
RESULT report_write_growth=<t(1000)/t(100)> (how writing grows with the steps).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sortie.rundir.report import write_report  # noqa: E402
from tests.browser import browser_missing, open_report  # noqa: E402
from tests.test_report import a_run  # noqa: E402

STEPS = (100, 1000)
ROUNDS = 5


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="sortie-report-bench-"))
    runs = {steps: a_run(root / str(steps), steps=steps, every=1, checkpoint_every=20)
            for steps in STEPS}
    write_report(runs[STEPS[0]])  # warm-up
    browser = browser_missing() is None
    write_s: dict[int, list[float]] = {s: [] for s in STEPS}
    load_s: dict[int, list[float]] = {s: [] for s in STEPS}
    for _ in range(ROUNDS):
        for steps, run_dir in runs.items():
            started = time.perf_counter()
            path = write_report(run_dir)
            write_s[steps].append(time.perf_counter() - started)
            if browser:
                load_s[steps].append(open_report(path, run_dir / "shot.png").load_s)
    size = (runs[1000] / "report.html").stat().st_size
    for steps in STEPS:
        load = f"{statistics.median(load_s[steps]):.3f}s" if browser else "no browser"
        print(f"{steps:>5} steps: {(runs[steps] / 'report.html').stat().st_size:>9,} bytes, "
              f"written in {statistics.median(write_s[steps]):.3f}s, loaded in {load}")
    print(f"RESULT report_bytes_1000_steps={size}")
    print(f"RESULT report_write_s_1000_steps={statistics.median(write_s[1000]):.3f}")
    print("RESULT report_load_s_1000_steps="
          f"{statistics.median(load_s[1000]) if browser else -1:.3f}")
    print("RESULT report_write_growth="
          f"{statistics.median(write_s[1000]) / statistics.median(write_s[100]):.2f}")


if __name__ == "__main__":
    main()
