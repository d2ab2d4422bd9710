"""One sortie, start to finish: up -> bootstrap -> train [-> recover -> train]* -> collect -> down.

The same orchestration drives every backend (`stacks/backend.py`):
- launch is all or nothing, retried per the backend's placements (zones, then on-demand);
- a node lost mid-run (machine gone, SSH dead, or the trainer's preemption exit) is replaced,
  bootstrapped, and training resumes from the newest checkpoint in the cluster's bucket, a
  bounded number of times, each recovery logged with the training time it cost;
- artifacts are collected and verified before teardown; if that fails the bucket is kept;
- teardown runs after success, failure, Ctrl-C and SIGTERM, and a second signal cannot cut it
  short.
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
from stacks.backend import Backend, LaunchError, Teardown
from stacks.errors import SortieError
from stacks.inventory import Inventory, Node
from stacks.local import LocalBackend
from stacks.naming import check_name


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
    ckpt_every: int = 20  # steps between checkpoints: the most a recovery can redo
    max_recoveries: int = 2  # lost-node recoveries before the sortie gives up
    max_artifact_bytes: int = collect.DEFAULT_MAX_BYTES  # all nodes' files and the bucket's


@dataclass
class Recovery:
    """One replacement of lost nodes, and what it cost."""

    lost: list[str]
    reason: str
    failed_at_step: int | None  # the last step rank 0 reported before the loss
    step_s: float  # mean step time before the loss
    failed_at: float  # time.perf_counter() when the loss was found
    downtime_s: float = 0.0  # from the loss to the trainer running again (resumed)
    redone_s: float = 0.0  # time of the steps trained again (failed_at - resumed_from)
    resumed_from_step: int | None = None  # the checkpoint step training resumed from

    def resumed(self, step: int, at: float) -> None:
        self.resumed_from_step = step
        self.downtime_s = at - self.failed_at
        self.redone_s = max(0, (self.failed_at_step or 0) - step) * self.step_s

    @property
    def cost_s(self) -> float:
        return self.downtime_s + self.redone_s

    def line(self) -> str:
        replaced = f"replaced {', '.join(self.lost)}" if self.lost else "relaunched"
        lost = (f"lost at step {self.failed_at_step}" if self.failed_at_step is not None else
                "lost before the first step report")
        if self.resumed_from_step is None:
            return f"{replaced} ({self.reason}); {lost}; training did not resume"
        return (f"{replaced} ({self.reason}); {lost}, resumed from step "
                f"{self.resumed_from_step}; cost {self.cost_s:.1f}s of training "
                f"({self.downtime_s:.1f}s down, {self.redone_s:.1f}s redone)")

    def to_json(self) -> dict:
        return {"lost": self.lost, "reason": self.reason, "failed_at_step": self.failed_at_step,
                "resumed_from_step": self.resumed_from_step,
                "downtime_s": round(self.downtime_s, 3), "redone_s": round(self.redone_s, 3),
                "cost_s": round(self.cost_s, 3)}


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
    launch_failures: list[str] = field(default_factory=list)  # why each failed attempt failed
    recoveries: list[Recovery] = field(default_factory=list)
    recovery_error: str | None = None  # why the sortie stopped recovering, if it did

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
            "launch_failures": self.launch_failures,
            "recoveries": [r.to_json() for r in self.recoveries],
            "recovery_error": self.recovery_error,
            "teardown": self.teardown.to_json() if self.teardown else None,
        }


def new_run_id() -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


@contextlib.contextmanager
def shielded(reporter: Reporter, why: str) -> Iterator[None]:
    """Hold off SIGINT/SIGTERM for a step that must not be cut short; deliver the first one held
    once it is done. Holding the signal, rather than catching the interruption wherever it lands,
    also keeps it out of the thread pool's locks (a KeyboardInterrupt raised there can leave a
    lock held, and the pool's threads waiting on it for ever)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def hold(signum: int, _frame: object) -> None:
        received.append(signum)
        reporter.note(why)

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for signum, handler in previous.items():
        if handler is not signal.SIG_IGN:  # started in the background: Ctrl-C is not for us
            signal.signal(signum, hold)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if received:
        handler = previous[received[0]]
        if callable(handler):  # Ctrl-C: KeyboardInterrupt; SIGTERM: the CLI's own handler
            handler(received[0], None)
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
        finally:  # a phase that repeats (train, recover) adds up
            self.result.phase_s[key] = (self.result.phase_s.get(key, 0.0)
                                        + time.perf_counter() - started)


class _StepTracker:
    """Follows rank 0's progress in the streamed logs: which node it runs on, the last step it
    reported, the step it resumed from; completes a pending recovery once training resumes."""

    STEP = re.compile(r"\bstep\s+(\d+)/\d+")
    RESUMED = re.compile(r"resumed from step (\d+)")

    def __init__(self, reporter: Reporter, recoveries: list[Recovery]) -> None:
        self.reporter, self.recoveries = reporter, recoveries
        self.rank0_node: str | None = None
        self.last_step: int | None = None
        self.resumed_from: int | None = None
        self.pending: Recovery | None = None  # waiting for training to resume

    def __call__(self, node: str, line: str) -> None:
        if match := self.STEP.search(line):
            self.rank0_node, self.last_step = node, int(match.group(1))
        elif match := self.RESUMED.search(line):
            self.rank0_node, self.resumed_from = node, int(match.group(1))
            if self.pending:
                self.pending.resumed(self.resumed_from, time.perf_counter())
                self.reporter.note(f"recovery {len(self.recoveries)}: {self.pending.line()}")
                self.pending = None
        self.reporter.node_line(node, line)


def run_sortie(request: RunRequest, reporter: Reporter,
               backend: Backend | None = None) -> RunResult:
    """Run one whole sortie and tear it down whatever happens. Returns what happened;
    raises SortieError for failures before training and KeyboardInterrupt on a signal."""
    backend = backend or LocalBackend()
    run_id = check_name(request.run_id) if request.run_id else new_run_id()
    result = RunResult(run_id=run_id, nodes=request.nodes,
                       ranks=request.nodes * request.procs_per_node,
                       artifacts=request.runs_dir / run_id)
    phase = _Phases(reporter, result)
    job = train.TrainJob(run_id=run_id, procs_per_node=request.procs_per_node,
                         trainer_args=("--steps", str(request.steps),
                                       "--ckpt-every", str(request.ckpt_every),
                                       *request.trainer_args))
    tracker = _StepTracker(reporter, result.recoveries)
    started = time.perf_counter()
    inventory: Inventory | None = None
    conns: dict[str, Connection] = {}
    launched = False
    try:
        with phase("up", f"Starting {request.nodes} {backend.name} nodes"):
            inventory = _launch(backend, run_id, request.nodes, result, reporter)
        with phase("bootstrap", "Bootstrapping nodes: SSH (pinned host keys), checks, trainer"):
            conns = prepare(inventory, request.ssh_timeout_s)
        while True:
            with phase("train", f"Training: {result.ranks} ranks on {request.nodes} nodes"):
                launched, attempt_started = True, time.perf_counter()
                tracker.resumed_from = None
                # A torchrun started after teardown read the node's pid file would be out of its
                # reach: let launches already sent finish (each is bounded) before stopping.
                with shielded(reporter, "interrupted: stopping once torchrun is launched"):
                    train.launch_all(conns, inventory, job)
                result.exit_codes = train.watch_all(conns, inventory, run_id, tracker)
            if result.trained:
                break
            failed_at = time.perf_counter()
            lost, reason = _find_lost(backend, inventory, conns, result)
            if lost is None:
                break  # the training itself failed: recovering would fail the same way
            if len(result.recoveries) >= request.max_recoveries:
                result.recovery_error = (f"{', '.join(lost) or 'training'} lost again ({reason})"
                                         f" after {len(result.recoveries)} recoveries; giving up")
                reporter.note(result.recovery_error)
                break
            steps_done = (tracker.last_step or 0) - (tracker.resumed_from or 0)
            recovery = Recovery(
                lost=lost, reason=reason, failed_at_step=tracker.last_step, failed_at=failed_at,
                step_s=(failed_at - attempt_started) / steps_done if steps_done > 0 else 0.0)
            with phase("recover", f"Recovering from {reason}: replacing "
                                  f"{', '.join(lost) or 'no node'}"):
                for name in lost:
                    if name in conns:
                        conns.pop(name).close()
                if lost:
                    inventory = backend.replace(inventory, lost)
                    conns |= prepare(inventory, request.ssh_timeout_s,
                                     [n for n in inventory.nodes if n.name in lost])
            result.recoveries.append(recovery)
            tracker.pending = recovery
    finally:
        with shielded(reporter, "teardown in progress; it finishes in a few seconds"):
            if launched and inventory:
                _stop_and_collect(inventory, conns, result, phase, reporter, tracker,
                                  request.max_artifact_bytes)
            for conn in conns.values():
                conn.close()
            with phase("down", "Tearing down"):
                keep = bool(result.collect_error) and launched
                result.teardown = backend.down(run_id, keep_bucket=keep)
                for kept in result.teardown.kept:
                    reporter.note(f"artifacts not verified: the cluster's bucket is kept at "
                                  f"{kept}")
            result.wall_s = time.perf_counter() - started
    summary = result.artifacts / "summary.json"
    if summary.is_file():
        result.summary = json.loads(summary.read_text())
    return result


def _stop_and_collect(inventory: Inventory, conns: dict[str, Connection], result: RunResult,
                      phase: _Phases, reporter: Reporter, tracker: _StepTracker,
                      max_bytes: int) -> None:
    """Best effort: stop training still running, then copy what the nodes and the bucket have.
    A failure here is reported, never raised: teardown must still run."""
    reachable = [n for n in inventory.nodes if n.name in conns]
    unfinished = [n for n in reachable if n.name not in result.exit_codes]
    dest = result.artifacts

    def outputs_to(name: str) -> Path:
        # Rank 0 of the last attempt wrote the run's outputs; an earlier rank 0's are kept aside.
        return dest if tracker.rank0_node in (None, name) else dest / "nodes" / name

    budget = collect.Budget(max_bytes)
    try:
        if unfinished:
            with phase("stop", "Stopping training"):
                ssh.on_all(unfinished, lambda n: train.stop(conns[n.name], n, result.run_id))
        with phase("collect", f"Collecting and verifying artifacts into {dest}"):
            dest.mkdir(parents=True, exist_ok=True)
            found = ssh.on_all(reachable, lambda n: collect.collect(
                conns[n.name], n, result.run_id, dest, outputs_to(n.name), budget))
            checkpoints = inventory.train_env.get("SORTIE_CHECKPOINT_URL")
            if checkpoints:
                found.append(collect.collect_checkpoint(checkpoints, dest, budget))
            result.collected = [artifact for part in found for artifact in part.artifacts]
            manifest = {"run_id": result.run_id, "algorithm": "sha256",
                        "files": [a.to_json() for a in result.collected]}
            (dest / "manifest.json").write_text(json.dumps(manifest, indent=2))
            refused = [entry for part in found for entry in part.refused]
            if refused:
                raise SortieError(f"refused {len(refused)} files: {'; '.join(refused)}")
    except Exception as exc:
        result.collect_error = str(exc)
        reporter.note(f"collecting artifacts failed: {exc}")


def _launch(backend: Backend, run_id: str, nodes: int, result: RunResult,
            reporter: Reporter) -> Inventory:
    """All or nothing, per placement in the backend's order; says why each attempt failed."""
    for attempt, placement in enumerate(backend.placements(), 1):
        try:
            return backend.up(run_id, nodes, placement)
        except LaunchError as exc:
            reason = f"attempt {attempt} ({placement.describe()}): {exc}"
            result.launch_failures.append(reason)
            reporter.note(f"launch failed ({reason}); the partial cluster was removed")
    raise LaunchError(f"no launch attempt brought up all {nodes} nodes: "
                      + "; ".join(result.launch_failures))


def _find_lost(backend: Backend, inventory: Inventory, conns: dict[str, Connection],
               result: RunResult) -> tuple[list[str] | None, str]:
    """After a failed attempt: (nodes to replace, why), or (None, "") when no node was lost and
    training was not preempted, i.e. the training itself failed."""
    lost = backend.lost_nodes(inventory)  # refresh: machines gone
    if lost:
        return lost, "machine gone"
    preempted = [n.name for n in inventory.nodes
                 if train.preempted(conns[n.name], n, result.run_id)]
    if preempted:
        deadline = time.monotonic() + backend.preemption_notice_s
        while not lost and time.monotonic() < deadline:  # the cloud takes the machine soon
            time.sleep(min(5.0, backend.preemption_notice_s))
            lost = backend.lost_nodes(inventory)
        return lost, "preemption notice"
    unreachable = [name for name, code in result.exit_codes.items()
                   if code is None and not _reachable(inventory.node(name))]
    return (unreachable, "SSH dead") if unreachable else (None, "")


def _reachable(node: Node) -> bool:
    try:
        ssh.connect(node, timeout=10.0).close()
    except (SortieError, *ssh.TRANSIENT_SSH_ERRORS):
        return False
    return True
