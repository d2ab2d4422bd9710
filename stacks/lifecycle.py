"""One sortie, start to finish: up -> bootstrap -> train -> collect -> down.

Teardown runs after success, failure, Ctrl-C and SIGTERM, and a second signal cannot cut it
short. Artifacts and logs are collected before teardown whenever training was launched.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from fabric import Connection

from bootstrap import collect, ssh, train
from bootstrap.prepare import prepare
from stacks.errors import UsageError
from stacks.inventory import Inventory
from stacks.local import LocalBackend, Teardown

RUN_ID_PATTERN = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


class Reporter(Protocol):
    """How the lifecycle shows progress; the CLI renders it with rich."""

    def phase(self, title: str) -> AbstractContextManager[None]: ...
    def node_line(self, node: str, line: str) -> None: ...
    def note(self, text: str) -> None: ...


@dataclass(frozen=True)
class RunRequest:
    nodes: int = 2
    procs_per_node: int = 2
    steps: int = 60
    trainer_args: tuple[str, ...] = ()
    run_id: str | None = None
    runs_dir: Path = Path("runs")
    ssh_timeout_s: float = 120.0


@dataclass
class RunResult:
    run_id: str
    nodes: int
    ranks: int
    artifacts: Path
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    phase_s: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    summary: dict | None = None  # the trainer's summary.json
    teardown: Teardown | None = None
    # Files copied from the nodes, each checked against the node's SHA-256 (manifest.json).
    collected: list[collect.Artifact] = field(default_factory=list)
    collect_error: str | None = None  # why collecting or verifying failed, if it did

    @property
    def trained(self) -> bool:
        return bool(self.exit_codes) and all(code == 0 for code in self.exit_codes.values())

    def to_json(self) -> dict:
        return {
            "run_id": self.run_id, "ok": self.trained, "nodes": self.nodes, "ranks": self.ranks,
            "artifacts": str(self.artifacts), "exit_codes": self.exit_codes,
            "wall_s": round(self.wall_s, 3),
            "phase_s": {k: round(v, 3) for k, v in self.phase_s.items()},
            "summary": self.summary,
            "teardown_clean": self.teardown.clean if self.teardown else None,
            "artifacts_verified": self.collect_error is None and bool(self.collected),
            "collect_error": self.collect_error,
        }


def new_run_id() -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def check_run_id(run_id: str) -> str:
    if not RUN_ID_PATTERN.match(run_id):
        raise UsageError(f"--name {run_id!r}: use 1-63 lowercase letters, digits and dashes")
    return run_id


@contextlib.contextmanager
def shielded(reporter: Reporter) -> Iterator[None]:
    """Hold off SIGINT/SIGTERM while cleaning up; re-raise the interruption afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def hold(signum: int, _frame: object) -> None:
        received.append(signum)
        reporter.note("teardown in progress; it finishes in a few seconds")

    previous = {s: signal.signal(s, hold) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if received:
        raise KeyboardInterrupt


class _Phases:
    """Times each phase into ``result.phase_s`` while the reporter shows it."""

    def __init__(self, reporter: Reporter, result: RunResult) -> None:
        self.reporter, self.result = reporter, result

    @contextlib.contextmanager
    def __call__(self, key: str, title: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            with self.reporter.phase(title):
                yield
        finally:
            self.result.phase_s[key] = time.perf_counter() - started


def run_sortie(request: RunRequest, reporter: Reporter,
               backend: LocalBackend | None = None) -> RunResult:
    """Run one whole sortie and tear it down whatever happens. Returns what happened;
    raises SortieError for failures before training and KeyboardInterrupt on a signal."""
    backend = backend or LocalBackend()
    run_id = check_run_id(request.run_id) if request.run_id else new_run_id()
    result = RunResult(run_id=run_id, nodes=request.nodes,
                       ranks=request.nodes * request.procs_per_node,
                       artifacts=request.runs_dir / run_id)
    phase = _Phases(reporter, result)
    job = train.TrainJob(run_id=run_id, procs_per_node=request.procs_per_node,
                         trainer_args=("--steps", str(request.steps), *request.trainer_args))
    started = time.perf_counter()
    inventory: Inventory | None = None
    conns: dict[str, Connection] = {}
    launched = False
    try:
        with phase("up", f"Starting {request.nodes} local nodes"):
            inventory = backend.up(run_id, request.nodes)
        with phase("bootstrap", "Bootstrapping nodes: SSH (pinned host keys), checks, trainer"):
            conns = prepare(inventory, request.ssh_timeout_s)
        with phase("train", f"Training: {result.ranks} ranks on {request.nodes} nodes"):
            launched = True
            ssh.on_all(inventory.nodes, lambda n: train.launch(conns[n.name], n, inventory, job))
            result.exit_codes = train.watch_all(conns, inventory, run_id, reporter.node_line)
    finally:
        with shielded(reporter):
            if launched and inventory:
                _stop_and_collect(inventory, conns, result, phase, reporter)
            for conn in conns.values():
                conn.close()
            with phase("down", "Tearing down"):
                result.teardown = backend.down(run_id)
            result.wall_s = time.perf_counter() - started
    summary = result.artifacts / "summary.json"
    if summary.is_file():
        result.summary = json.loads(summary.read_text())
    return result


def _stop_and_collect(inventory: Inventory, conns: dict[str, Connection], result: RunResult,
                      phase: _Phases, reporter: Reporter) -> None:
    """Best effort: stop training still running, then copy what the nodes have. A failure here
    is reported, never raised: teardown must still run."""
    reachable = [n for n in inventory.nodes if n.name in conns]
    unfinished = [n for n in reachable if n.name not in result.exit_codes]
    try:
        if unfinished:
            with phase("stop", "Stopping training"):
                ssh.on_all(unfinished, lambda n: train.stop(conns[n.name], n, result.run_id))
        with phase("collect", f"Collecting and verifying artifacts into {result.artifacts}"):
            per_node = ssh.on_all(reachable, lambda n: collect.collect(
                conns[n.name], n, result.run_id, result.artifacts))
            result.collected = [artifact for found in per_node for artifact in found]
            manifest = {"run_id": result.run_id, "algorithm": "sha256",
                        "files": [a.to_json() for a in result.collected]}
            result.artifacts.mkdir(parents=True, exist_ok=True)
            (result.artifacts / "manifest.json").write_text(json.dumps(manifest, indent=2))
    except Exception as exc:
        result.collect_error = str(exc)
        reporter.note(f"collecting artifacts failed: {exc}")
