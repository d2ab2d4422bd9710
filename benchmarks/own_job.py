"""A new user's own DDP script (`own_ddp.py`: not sortie's trainer) run through sortie again and
again under load, beside the same script under plain torchrun on the same machine (the control):
how many runs abort, how many files the job wrote were neither collected nor named, how many
files a run listed that it did not write (issue 60).

Every fifth exec is cut short before it saves (`--stop-before-save`: every rank exits 3):
its manifest must not list the earlier run's model. Two CPU burners load the machine, as the
outside check did.

    python benchmarks/own_job.py [--runs 30] [--burners 2] [--control-runs 30]

Prints, over the 24 runs of 30 that save, `RESULT own_job_aborts_of_24=…` (a rank's process
aborted: `terminate called …`, SIGABRT) and `RESULT own_job_exit_barrier_errors_of_24=…`
(torchrun's "Error waiting on exit barrier" traceback that no abort explains); the same two for
the control's 30 runs; `RESULT outputs_lost=…` and `RESULT stale_artifacts=…`."""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The two ways a run of this script ends badly after it trained: a rank's process aborts
# (std::terminate as gloo's threads meet the interpreter's exit), or torchrun's exit barrier
# loses its store (a traceback, exit 0).
ABORT = ("terminate called", "SIGABRT", "Signal 6")
BARRIER = ("Error waiting on exit barrier",)


def sortie(home: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SORTIE_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "sortie", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)


def aborted(text: str) -> bool:
    return any(mark in text for mark in ABORT)


def barrier_error(text: str) -> bool:
    return any(mark in text for mark in BARRIER)


def first_line(text: str, marks: tuple[str, ...]) -> str:
    return next((line for line in text.splitlines() if any(m in line for m in marks)), "")


def under_sortie(tmp: Path, runs: int) -> dict:
    home, project = tmp / "home", tmp / "project"
    project.mkdir()
    shutil.copy(HERE / "own_ddp.py", project / "train.py")
    assert sortie(home, tmp, "up", "--nodes", "2", "--name", "own").returncode == 0
    aborts, barriers, failed, lost, stale, examples = 0, 0, 0, 0, 0, []
    try:
        for index in range(runs):
            cut = index % 5 == 4  # exits before saving: nothing of its own to list
            done = sortie(home, tmp, "exec", "own", "--workdir", str(project), "--script",
                          "train.py", "-p", "2", "--json", "--", "--epochs", "2",
                          *(["--stop-before-save"] if cut else []))
            report = json.loads(done.stdout) if done.stdout.strip() else {}
            run = tmp / report.get("artifacts", "missing")
            logs = "".join(p.read_text(errors="replace") for p in run.glob("logs/*.log"))
            listed = {f["path"] for f in json.loads((run / "manifest.json").read_text())["files"]} \
                if (run / "manifest.json").is_file() else set()
            has_model = any(p.endswith("outputs/model.pt") for p in listed)
            saved = "saved outputs/model.pt" in logs
            named = any(line.startswith("! not collected") and "outputs/model.pt" in line
                        for line in done.stderr.splitlines())
            lost += saved and not has_model and not named
            stale += cut and has_model
            # Counted over the runs that save (a cut run exits 3 without destroying its
            # process group, and may abort as torch's own example of that does): an abort,
            # and an exit-barrier traceback that no abort explains.
            if aborted(logs) and not cut:
                aborts += 1
                examples.append(first_line(logs, ABORT))
            barriers += barrier_error(logs) and not aborted(logs)
            failed += done.returncode != 0 and not cut
            print(f"exec {index + 1}/{runs}: exit {done.returncode}, saved={saved}, "
                  f"listed model={has_model}, aborted={aborted(logs)}, "
                  f"barrier error={barrier_error(logs)}", flush=True)
    finally:
        sortie(home, tmp, "down", "own")
    return {"aborts": aborts, "barrier_errors": barriers, "failed": failed, "lost": lost,
            "stale": stale, "examples": examples[:3]}


def control(tmp: Path, runs: int) -> dict:
    """The same script under plain torchrun: two agents (2 "nodes" x 2), the static rendezvous,
    on this machine, with no sortie in the way."""
    project = tmp / "control"
    project.mkdir()
    shutil.copy(HERE / "own_ddp.py", project / "train.py")
    aborts, barriers, failed, examples = 0, 0, 0, []
    for index in range(runs):
        port = random.randint(30000, 50000)
        common = ["--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=static",
                  f"--rdzv-endpoint=127.0.0.1:{port}", "--max-restarts=0"]
        agents = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *common,
                                    f"--node-rank={rank}", "train.py", "--epochs", "2"],
                                   cwd=project, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                                   env={**os.environ, "OMP_NUM_THREADS": "1"})
                  for rank in (0, 1)]
        outputs = [agent.communicate(timeout=600)[0] for agent in agents]
        text = "".join(outputs)
        aborts += aborted(text)
        barriers += barrier_error(text) and not aborted(text)
        failed += any(a.returncode for a in agents)
        if aborted(text):
            examples.append(first_line(text, ABORT))
        print(f"control {index + 1}/{runs}: exits {[a.returncode for a in agents]}, "
              f"aborted={aborted(text)}, barrier error={barrier_error(text)}", flush=True)
    return {"aborts": aborts, "barrier_errors": barriers, "failed": failed,
            "examples": examples[:3]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--control-runs", type=int, default=30)
    parser.add_argument("--burners", type=int, default=2)
    args = parser.parse_args()
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(args.burners)]
    try:
        with tempfile.TemporaryDirectory(prefix="sortie-own-job-") as tmp:
            ours = under_sortie(Path(tmp), args.runs)
            theirs = control(Path(tmp), args.control_runs)
    finally:
        for burner in burners:
            burner.kill()
    print(f"sortie: {ours}")
    print(f"plain torchrun: {theirs}")
    saving = args.runs - args.runs // 5  # every fifth is cut short
    print(f"RESULT own_job_aborts_of_{saving}={ours['aborts']}")
    print(f"RESULT own_job_exit_barrier_errors_of_{saving}={ours['barrier_errors']}")
    print(f"RESULT control_aborts_of_{args.control_runs}={theirs['aborts']}")
    print(f"RESULT control_exit_barrier_errors_of_{args.control_runs}="
          f"{theirs['barrier_errors']}")
    print(f"RESULT outputs_lost={ours['lost']}")
    print(f"RESULT stale_artifacts={ours['stale']}")


if __name__ == "__main__":
    main()
