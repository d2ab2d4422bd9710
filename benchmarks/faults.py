"""What a controller killed with SIGKILL leaves behind, at each phase of a sortie, once another
controller has cleaned up after it (issue 28).

On the local backend, for the bundled trainer and for a user's job (workdir sync and setup), the
real CLI runs a sortie in a child process and is killed (SIGKILL: no teardown, no collection) at
the start of each phase: up, bootstrap, sync, setup, train, collect, down. Then `sortie reap`
ends the orphan; where the job still runs, `sortie watch` takes it over instead (and, a second
case, `sortie reap` once the job has ended on its own). Then it counts:

- leaked: processes of the cluster, listeners they hold, its state directory;
- lost artifacts: files the job wrote on a node (its outputs) that are in neither the run's
  directory (with the node's SHA-256) nor a bucket kept on purpose.

Prints `RESULT fault_cases=<n>`, `RESULT leaked=<n>`, `RESULT lost_artifacts=<n>`; both
counts must be 0. The stack double cannot be killed this way: its cloud lives in the memory of
the process that drives it (see the README's benchmarks section).
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bootstrap.inventory import INVENTORY_FILE, Inventory  # noqa: E402
from bootstrap.train import run_dir  # noqa: E402
from stacks.local import LocalBackend  # noqa: E402

JOB = """\
import json, os, time
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
for step in range(1, 31):
    time.sleep(0.1)
    if rank == 0:
        print(f"job step {step}", flush=True)
out = os.environ["SORTIE_ARTIFACT_DIR"]
with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
    json.dump({"rank": rank, "steps": 30}, f)
dist.destroy_process_group()
"""
# (phase, the controller line after which it is killed: the previous phase just ended). "up" is
# killed while its state directory exists without an inventory (the nodes are starting).
PHASES = {
    "up": None,
    "bootstrap": "✓ Starting",
    "sync": "✓ Bootstrapping",
    "setup": "✓ Syncing",
    "train": "step",
    "collect": "✓ Training",
    "down": "✓ Collecting",
}
TRAINER_PHASES = ("up", "bootstrap", "train", "collect", "down")


@dataclass
class Case:
    job: str  # "trainer" or "user job"
    phase: str
    after: str  # "reap", "watch", "reap once done"
    leaked: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    killed: bool = False


def sortie(home: Path, cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sortie", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "SORTIE_HOME": str(home)})


def node_outputs(home: Path, name: str) -> dict[str, str]:
    """Every file the job has written to a node's outputs so far: "node/path" -> SHA-256."""
    path = home / "clusters" / name / INVENTORY_FILE
    if not path.is_file():
        return {}
    found = {}
    for node in Inventory.load(path).nodes:
        out = Path(run_dir(node, name)) / "out"
        for file in out.rglob("*") if out.is_dir() else []:
            if file.is_file() and not file.name.endswith(".tmp"):
                found[f"{node.name}/{file.relative_to(out)}"] = \
                    hashlib.sha256(file.read_bytes()).hexdigest()
    return found


def collected(run: Path, kept: Path) -> set[str]:
    """SHA-256 of every file in the run's directory and in a kept bucket."""
    return {hashlib.sha256(f.read_bytes()).hexdigest()
            for base in (run, kept) if base.is_dir() for f in base.rglob("*") if f.is_file()}


def leftovers(home: Path, name: str) -> list[str]:
    left = [f"process {proc.pid}: {' '.join(proc.cmdline())[:80]}"
            for proc in LocalBackend(home).processes(name)]
    if (home / "clusters" / name).exists():
        left.append(f"state directory {home / 'clusters' / name}")
    return left


def kill_at(proc: subprocess.Popen, home: Path, name: str, phase: str,
            outputs: dict[str, str]) -> bool:
    """Read the controller's output; SIGKILL it when ``phase`` begins. Whether it was killed
    (a phase the run never reached leaves it running to its end)."""
    trigger = PHASES[phase]
    state = home / "clusters" / name
    if trigger is None:  # up: as soon as the nodes are being made
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if state.is_dir() and not (state / INVENTORY_FILE).exists():
                proc.send_signal(signal.SIGKILL)
                return True
            time.sleep(0.005)
        return False
    assert proc.stdout is not None
    for line in proc.stdout:
        if trigger in line:
            outputs.update(node_outputs(home, name))
            proc.send_signal(signal.SIGKILL)
            return True
    return False


def run_case(case: Case, work: Path) -> Case:
    home, cwd, name = work / "home", work, "fault"
    args = ["run", "--nodes", "2", "-p", "1", "--name", name]
    if case.job == "user job":
        project = work / "project"
        project.mkdir()
        (project / "job.py").write_text(JOB)
        (project / "task.yaml").write_text("setup: sleep 1 && touch setup-done\n")
        args += ["--workdir", str(project), "--script", "job.py"]
    else:
        args += ["--steps", "30", "--", "--log-every", "5"]
    env = {**os.environ, "SORTIE_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "sortie", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    outputs: dict[str, str] = {}
    case.killed = kill_at(proc, home, name, case.phase, outputs)
    drain = threading.Thread(target=lambda: proc.stdout and proc.stdout.read(), daemon=True)
    drain.start()
    proc.wait(timeout=300)
    if case.after == "watch":
        sortie(home, cwd, "watch", name)
    else:
        if case.after == "reap once done":
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not all(
                    (Path(run_dir(n, name)) / "exit_code").exists()
                    for n in Inventory.load(home / "clusters" / name / INVENTORY_FILE).nodes):
                time.sleep(0.5)
        outputs.update(node_outputs(home, name))  # the last look before the nodes go
        sortie(home, cwd, "reap")
    kept = collected(cwd / "runs" / name, home / "kept" / name)
    case.lost = [path for path, digest in outputs.items() if digest not in kept]
    case.leaked = leftovers(home, name)
    return case


def cases() -> list[Case]:
    found = []
    for job, phases in (("trainer", TRAINER_PHASES), ("user job", tuple(PHASES))):
        for phase in phases:
            if phase == "train":
                found += [Case(job, phase, "watch"), Case(job, phase, "reap once done")]
            else:
                found.append(Case(job, phase, "reap"))
    return found


def main() -> None:
    done = []
    for case in cases():
        with tempfile.TemporaryDirectory(prefix="sortie-faults-") as tmp:
            started = time.perf_counter()
            run_case(case, Path(tmp))
            done.append(case)
            print(f"{case.job:8} killed at {case.phase:9} ({'yes' if case.killed else 'no':3}) "
                  f"then {case.after:14}: leaked {len(case.leaked)}, lost {len(case.lost)} "
                  f"({time.perf_counter() - started:.0f}s)"
                  + "".join(f"\n    {item}" for item in case.leaked + case.lost), flush=True)
    print(f"RESULT fault_cases={sum(c.killed for c in done)}")
    print(f"RESULT leaked={sum(len(c.leaked) for c in done)}")
    print(f"RESULT lost_artifacts={sum(len(c.lost) for c in done)}")


if __name__ == "__main__":
    main()
