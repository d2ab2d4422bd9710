"""What a controller killed with SIGKILL leaves behind, at each phase of a sortie, once another
controller has cleaned up after it (issue 28).

A controller runs a sortie in a child process and is killed (SIGKILL: no teardown, no
collection) at the start of each phase: up, bootstrap, sync, setup, train, collect, down.
- local backend: the real CLI, for the bundled trainer and for a user's job (workdir sync and
  setup);
- cloud: the real `PulumiBackend` and lifecycle on the in-repo stack double
  (`tests/stack_double.py`), its cloud and Pulumi state kept in a file so that it outlives the
  controller; a controller killed during `up` leaves the stack's lock, as Pulumi's CLI would.
Then `sortie reap` ends the orphan; where the job still runs, `sortie watch` takes it over instead
(and, a second case, `sortie reap` once the job has ended on its own). Then it counts:

- leaked: processes of the cluster, its state directories, and on the double its cloud
  resources, stack and record;
- lost artifacts: files the job wrote on a node (its outputs) that are in neither the run's
  directory (with the node's SHA-256) nor a bucket kept on purpose.

Prints `RESULT fault_cases=<n>`, `RESULT leaked=<n>`, `RESULT lost_artifacts=<n>`; both
counts must be 0.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sortie.bootstrap.node_layout import run_dir  # noqa: E402
from sortie.core.inventory import INVENTORY_FILE, Inventory  # noqa: E402
from sortie.stacks.local.local_backend import LocalBackend  # noqa: E402
from tests.stack_double import DoubleCloud, DoubleStack  # noqa: E402

NAME = "fault"
T = TypeVar("T")

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


class FileBackedStack(DoubleStack):
    """The double's stack, saved after every operation; `up` holds the stack's lock while it
    runs (killed there, the lock stays, as Pulumi's CLI leaves it)."""

    def _saved(self, operation: Callable[[], T]) -> T:
        try:
            return operation()
        finally:
            self.cloud.save()

    def up(self, config, replace=None):  # noqa: ANN001, ANN201 - the double's signature
        self.locked_by = (socket.gethostname(), os.getpid())
        self.cloud.save()

        def unlocked_after() -> dict:
            try:
                return DoubleStack.up(self, config, replace)
            finally:
                self.locked_by = None
        return self._saved(unlocked_after)

    def refresh(self, clear_pending_creates: bool = False) -> None:
        self._saved(lambda: DoubleStack.refresh(self, clear_pending_creates))

    def cancel(self) -> None:
        self._saved(lambda: DoubleStack.cancel(self))

    def destroy(self, targets=None) -> None:  # noqa: ANN001
        self._saved(lambda: DoubleStack.destroy(self, targets))

    def remove(self) -> None:
        self._saved(lambda: DoubleStack.remove(self))


class FileBackedCloud(DoubleCloud):
    """The stack double, its cloud and every stack's state in ``root/double-cloud.json``."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.path = root / "double-cloud.json"
        if self.path.is_file():
            saved = json.loads(self.path.read_text())
            self.resources = saved["resources"]
            for name, fields in saved["stacks"].items():
                stack = self.stacks[name] = FileBackedStack(name, self)
                stack.state, stack.parents = fields["state"], fields["parents"]
                stack.dependencies = {k: tuple(v) for k, v in fields["dependencies"].items()}
                stack.settings, stack.pending_creates = fields["settings"], fields["pending"]
                stack.locked_by = tuple(fields["locked_by"]) if fields["locked_by"] else None
                stack.inventory = Inventory.model_validate(fields["inventory"]) \
                    if fields["inventory"] else None

    def open(self, name: str) -> DoubleStack:
        if name not in self.stacks:
            self.stacks[name] = FileBackedStack(name, self)
            self.save()
        return self.stacks[name]

    def reclaim(self, cluster: str, node: str) -> None:
        super().reclaim(cluster, node)
        self.save()

    def save(self) -> None:
        stacks = {name: {"state": st.state, "parents": st.parents,
                         "dependencies": st.dependencies, "settings": st.settings,
                         "pending": st.pending_creates, "locked_by": st.locked_by,
                         "inventory": st.inventory.model_dump(mode="json")
                         if st.inventory else None}
                  for name, st in self.stacks.items()}
        temp = self.path.with_suffix(".tmp")
        temp.write_text(json.dumps({"resources": self.resources, "stacks": stacks}))
        os.replace(temp, self.path)


def cloud_controller(root: Path) -> None:
    """The child: one sortie of the bundled trainer on the double, as `sortie run --stack`."""
    from rich.console import Console

    from sortie.cli.render import RichReporter
    from sortie.engine.launch import run_sortie
    from sortie.engine.request import RunRequest

    cloud = FileBackedCloud(root)
    backend = cloud.backend(root / "home")
    run_sortie(RunRequest(nodes=2, procs_per_node=1, steps=30, run_id=NAME,
                          runs_dir=root / "runs", trainer_args=("--log-every", "5")),
               RichReporter(Console(highlight=False)), backend)


@dataclass
class Case:
    job: str  # "trainer" or "user job" (local), "cloud trainer" (the stack double)
    phase: str
    after: str  # "reap", "watch", "reap once done"
    leaked: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    killed: bool = False


def sortie(home: Path, cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sortie", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "SORTIE_HOME": str(home)})


def node_outputs(machines: Path, name: str) -> dict[str, str]:
    """Every file the job has written to a node's outputs so far: "node/path" -> SHA-256
    (``machines``: the home of the local backend that runs the nodes)."""
    path = machines / "clusters" / name / INVENTORY_FILE
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


def collected(*places: Path) -> set[str]:
    """SHA-256 of every file in the run's directories and in a kept bucket."""
    return {hashlib.sha256(f.read_bytes()).hexdigest()
            for base in places if base.is_dir() for f in base.rglob("*") if f.is_file()}


def leftovers(home: Path, machines: Path, name: str,
              cloud: FileBackedCloud | None = None) -> list[str]:
    left = [f"process {proc.pid}: {' '.join(proc.cmdline())[:80]}"
            for proc in LocalBackend(machines).processes(name)]
    for state in (machines / "clusters" / name, home / "stacks" / name):
        if state.exists():
            left.append(f"state directory {state}")
    if cloud is not None:
        left += [f"cloud resource {urn}" for urn in cloud.resources]
        left += [f"stack {stack}" for stack in cloud.stacks]
        if cloud.records.load(name) is not None:
            left.append(f"record {name}")
    return left


def kill_at(proc: subprocess.Popen, machines: Path, name: str, phase: str,
            outputs: dict[str, str]) -> bool:
    """Read the controller's output; SIGKILL it when ``phase`` begins. Whether it was killed
    (a phase the run never reached leaves it running to its end)."""
    trigger = PHASES[phase]
    state = machines / "clusters" / name
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
            outputs.update(node_outputs(machines, name))
            proc.send_signal(signal.SIGKILL)
            return True
    return False


def run_case(case: Case, work: Path) -> Case:
    home, cwd, name = work / "home", work, NAME
    cloud = case.job == "cloud trainer"
    machines = work / "double-machines" if cloud else home  # where the nodes' sshd run
    env = {**os.environ, "SORTIE_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    if cloud:
        command = [sys.executable, __file__, "controller", str(work)]
    else:
        args = ["run", "--nodes", "2", "-p", "1", "--name", name]
        if case.job == "user job":
            project = work / "project"
            project.mkdir()
            (project / "job.py").write_text(JOB)
            (project / "task.yaml").write_text("setup: sleep 1 && touch setup-done\n")
            args += ["--workdir", str(project), "--script", "job.py"]
        else:
            args += ["--steps", "30", "--", "--log-every", "5"]
        command = [sys.executable, "-m", "sortie", *args]
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    outputs: dict[str, str] = {}
    case.killed = kill_at(proc, machines, name, case.phase, outputs)
    drain = threading.Thread(target=lambda: proc.stdout and proc.stdout.read(), daemon=True)
    drain.start()
    proc.wait(timeout=300)
    if case.after == "reap once done":
        inventory = machines / "clusters" / name / INVENTORY_FILE
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and inventory.is_file() and not all(
                (Path(run_dir(n, name)) / "exit_code").exists()
                for n in Inventory.load(inventory).nodes):
            time.sleep(0.5)
    outputs.update(node_outputs(machines, name))  # the last look before the nodes go
    double = FileBackedCloud(work) if cloud else None
    if double is not None:
        take_over_in_process(double, home, case.after == "watch")
    elif case.after == "watch":
        sortie(home, cwd, "watch", name)
    else:
        sortie(home, cwd, "reap")
    # The run's directory (a reaper collects another controller's run into its own home's).
    kept = collected(cwd / "runs" / name, home / "runs" / name, machines / "kept" / name)
    case.lost = [path for path, digest in outputs.items() if digest not in kept]
    case.leaked = leftovers(home, machines, name, FileBackedCloud(work) if cloud else None)
    return case


def take_over_in_process(cloud: FileBackedCloud, home: Path, watch: bool) -> None:
    """`sortie watch` or `sortie reap` of the killed controller's sortie, on the double."""
    from sortie.core.progress import QuietReporter
    from sortie.engine.reap import reap
    from sortie.engine.request import Limits
    from sortie.engine.watch import watch_sortie
    from sortie.fleet import registry
    from sortie.stacks.cloud.cloud_records import CloudAccess

    access = CloudAccess(stacks=cloud, sweep=cloud.sweep)
    if watch:
        backend = registry.backend_for(home, registry.find(home, NAME), access)
        watch_sortie(backend, NAME, QuietReporter(), Limits())
    else:
        reap(home, access)


def cases() -> list[Case]:
    found = []
    for job, phases in (("trainer", TRAINER_PHASES), ("user job", tuple(PHASES)),
                        ("cloud trainer", TRAINER_PHASES)):
        for phase in phases:
            if phase == "train":
                found += [Case(job, phase, "watch"), Case(job, phase, "reap once done")]
            else:
                found.append(Case(job, phase, "reap"))
    return found


def main(only: str | None = None) -> None:
    """Every case, or only those of one job ("trainer", "user job", "cloud trainer")."""
    done = []
    for case in [c for c in cases() if only in (None, c.job)]:
        with tempfile.TemporaryDirectory(prefix="sortie-faults-") as tmp:
            started = time.perf_counter()
            run_case(case, Path(tmp))
            done.append(case)
            print(f"{case.job:13} killed at {case.phase:9} ({'yes' if case.killed else 'no':3}) "
                  f"then {case.after:14}: leaked {len(case.leaked)}, lost {len(case.lost)} "
                  f"({time.perf_counter() - started:.0f}s)"
                  + "".join(f"\n    {item}" for item in case.leaked + case.lost), flush=True)
    print(f"RESULT fault_cases={sum(c.killed for c in done)}")
    print(f"RESULT leaked={sum(len(c.leaked) for c in done)}")
    print(f"RESULT lost_artifacts={sum(len(c.lost) for c in done)}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["controller"]:
        cloud_controller(Path(sys.argv[2]))
    else:
        main(" ".join(sys.argv[1:]) or None)
