"""What a sortie did: its recoveries, exit codes, phase times, artifacts and teardown.

Both are pydantic dataclasses: `--json` is their serialisation, with times rounded to the
millisecond and the controller's own clock readings left out."""

from __future__ import annotations

import math
from dataclasses import field
from pathlib import Path
from typing import Annotated, TypeVar

import pydantic
from pydantic import AfterValidator, Field, computed_field, field_serializer

from sortie.bootstrap.health_report import HealthReport
from sortie.bootstrap.verified_copy import ARTIFACTS_DIR, CHECKPOINTS_DIR, NODES_DIR, Artifact
from sortie.core import statefile
from sortie.core.image_ref import ImageUse
from sortie.core.sizes import counted, readable_bytes
from sortie.rundir.causes import failure_cause
from sortie.stacks.backend import Teardown

SUMMARY_FILE = "summary.json"  # the bundled trainer's, in its outputs
PREEMPTED_FILE = "preempted.json"  # left by a trainer that stopped for a preemption
HEALTH_REASON = "failed the health check"
# Where what the job wrote lands in the run's directory (rank 0's node's files, any other
# node's, the bundled trainer's newest checkpoint); the rest is sortie's (logs, setup logs).
JOB_DIRS = tuple(f"{part}/" for part in (ARTIFACTS_DIR, NODES_DIR, CHECKPOINTS_DIR))
def _finite(value: float | None) -> float | None:
    return value if value is None or math.isfinite(value) else None


# What a node hands us is untrusted: numbers only, bounded text, nothing else kept.
Number = Annotated[float | None, AfterValidator(_finite)]


class TrainerSummary(pydantic.BaseModel, extra="ignore"):
    """The trainer's ``summary.json``, as the controller reads it: only what it shows."""

    steps: int | None = Field(default=None, ge=0)
    resumed_from: int | None = Field(default=None, ge=0)
    world_size: int | None = Field(default=None, ge=0)
    final_loss: Number = None  # None: no step ran in the last attempt
    samples_per_s: Number = None
    tokens_per_s: Number = None
    train_time_s: Number = None


class PreemptionMarker(pydantic.BaseModel, extra="ignore"):
    """``preempted.json``: the step every rank stopped and saved at, and why."""

    step: int = Field(ge=0)
    reason: str = Field(max_length=200, pattern=r"^[\x20-\x7e]*$")  # printable, one line


M = TypeVar("M", bound=pydantic.BaseModel)


def _shortened(path: str, limit: int = 80) -> str:
    """A long path as its start and end (the end names the file)."""
    return path if len(path) <= limit else f"{path[:limit // 2 - 1]}…{path[-(limit // 2):]}"


def _ms(seconds: float) -> float:
    return round(seconds, 3)


@pydantic.dataclasses.dataclass
class Recovery:
    """One replacement of lost nodes, and what it cost."""

    lost: list[str]
    reason: str
    failed_at_step: int | None  # the last step rank 0 reported before the loss
    step_s: float = Field(exclude=True)  # mean step time before the loss
    failed_at: float = Field(exclude=True)  # time.perf_counter() when the loss was found
    downtime_s: float = 0.0  # from the loss to the trainer running again (resumed)
    redone_s: float = 0.0  # time of the steps trained again (failed_at - resumed_from)
    resumed_from_step: int | None = None  # the checkpoint step training resumed from
    detail: str = ""  # why, as found: a failed health check's figures for each node

    def resumed(self, step: int, at: float) -> None:
        self.resumed_from_step = step
        self.downtime_s = at - self.failed_at
        self.redone_s = max(0, (self.failed_at_step or 0) - step) * self.step_s

    @computed_field  # type: ignore[prop-decorator]
    @property
    def cost_s(self) -> float:
        return self.downtime_s + self.redone_s

    @field_serializer("downtime_s", "redone_s", "cost_s")
    def _rounded(self, seconds: float) -> float:
        return _ms(seconds)

    def line(self) -> str:
        replaced = f"replaced {', '.join(self.lost)}" if self.lost else "relaunched"
        if self.reason == HEALTH_REASON:
            return f"{replaced} ({self.reason}) before training"
        lost = (f"lost at step {self.failed_at_step}" if self.failed_at_step is not None else
                "lost before the first step report")
        if self.resumed_from_step is None:
            return (f"{replaced} ({self.reason}); {lost}; relaunched, but no "
                    "'resumed from step N' line followed")
        return (f"{replaced} ({self.reason}); {lost}, resumed from step "
                f"{self.resumed_from_step}; cost {self.cost_s:.1f}s of training "
                f"({self.downtime_s:.1f}s down, {self.redone_s:.1f}s redone)")


@pydantic.dataclasses.dataclass
class PhaseSpan:
    """One phase of a sortie on its timeline, in seconds since the sortie started. A failed
    launch attempt is a span of its own ("launch retry"), within "up"."""

    phase: str
    start_s: float
    end_s: float
    ok: bool = True

    @field_serializer("start_s", "end_s")
    def _rounded(self, seconds: float) -> float:
        return _ms(seconds)


@pydantic.dataclasses.dataclass
class RunResult:
    run_id: str
    nodes: int
    ranks: int
    artifacts: Path
    cluster: str | None = None  # the held or attached cluster an `exec` ran on (run: its own)
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    # Why a node's job ended with no exit code, where what ran it said ("Slurm killed ...")
    ended_by: dict[str, str] = field(default_factory=dict)
    phase_s: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    summary: dict | None = None  # the trainer's summary.json, validated (TrainerSummary)
    last_step: int | None = None  # the last `step N/M` rank 0 printed (a job of your own too)
    warnings: list[str] = field(default_factory=list)  # e.g. a node's summary that was bad
    teardown: Teardown | None = None
    # Files copied from the nodes, each checked against the node's SHA-256 (manifest.json,
    # which lists them: the JSON says only whether they were verified).
    collected: list[Artifact] = Field(default_factory=list, exclude=True)
    collect_error: str | None = None  # why collecting or verifying failed, if it did
    # What the job wrote that was not collected: "node-0: outputs/big.bin (123 bytes)"
    left_on_nodes: list[str] = field(default_factory=list)
    launch_failures: list[str] = field(default_factory=list)  # why each failed attempt failed
    recoveries: list[Recovery] = field(default_factory=list)
    recovery_error: str | None = None  # why the sortie stopped recovering, if it did
    health: HealthReport | None = None  # the last health check before training
    image: ImageUse | None = None  # the container image the job ran in, by digest
    first_failed: str | None = None  # the node whose job ended badly first
    stopped: list[str] = field(default_factory=list)  # nodes sortie stopped after a failure
    hung: str | None = None  # why sortie stopped a job that no longer advanced, if it did
    budget_reached: str | None = None  # "budget of $X reached": sortie stopped the job
    spent_usd: float | None = None  # at the launch terms, up to teardown (with a budget)
    # "detached" or "torn down": `sortie down` took the held cluster away while its job ran.
    cluster_went: str | None = None
    interrupted: str | None = None  # "Ctrl-C" or "SIGTERM": the user stopped the run
    phase_failed: str | None = None  # the error that ended a phase (before: a pull, a setup)
    failure_tail: list[str] = Field(default_factory=list, exclude=True)  # its log's last lines
    # rank 0's last `step N/M` as printed, when it printed its last step ("step 8/8")
    last_step_line: str | None = Field(default=None, exclude=True)
    workdir_files: tuple[str, ...] = Field(default=(), exclude=True)  # what its sync sent
    timeline: list[PhaseSpan] = field(default_factory=list)  # every phase, in order
    report: Path | None = None  # runs/<id>/report.html, once written
    report_error: str | None = None  # why it could not be written, if it could not
    loss_sparkline: str | None = Field(default=None, exclude=True)  # for the terminal

    @computed_field(alias="ok")  # type: ignore[prop-decorator]
    @property
    def trained(self) -> bool:
        return bool(self.exit_codes) and all(code == 0 for code in self.exit_codes.values())

    @computed_field  # type: ignore[prop-decorator]
    @property
    def teardown_clean(self) -> bool | None:
        return self.teardown.clean if self.teardown else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def artifacts_verified(self) -> bool:
        return self.collect_error is None and bool(self.collected)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def node_states(self) -> dict[str, str]:
        """How each node's job ended: ok, failed (a kill Slurm named too), stopped by sortie,
        lost (no exit code, nothing said why), detached / torn down with its cluster, or
        interrupted (Ctrl-C, SIGTERM)."""
        def state(node: str, code: int | None) -> str:
            if code == 0:
                return "ok"
            if self.cluster_went:
                return self.cluster_went
            if self.interrupted:
                return "interrupted"
            if node in self.stopped:
                return "stopped by sortie"
            return "lost" if code is None and node not in self.ended_by else "failed"
        return {node: state(node, code) for node, code in self.exit_codes.items()}

    @field_serializer("wall_s")
    def _rounded(self, seconds: float) -> float:
        return _ms(seconds)

    @field_serializer("phase_s")
    def _rounded_phases(self, phases: dict[str, float]) -> dict[str, float]:
        return {key: _ms(seconds) for key, seconds in phases.items()}

    def node_file(self, name: str, model: type[M]) -> M | None:
        """A JSON file the job left in its outputs (``artifacts/``), validated; None when it
        is absent, and a warning when it is bad (a node wrote it: never a crash)."""
        path = self.artifacts / ARTIFACTS_DIR / name
        try:
            return statefile.read_untrusted_model(model, path, max_bytes=64 << 10)
        except FileNotFoundError:
            return None
        except statefile.CorruptStateError as exc:
            warning = f"ignored {ARTIFACTS_DIR}/{name} from the node: {str(exc)[-200:]}"
            if warning not in self.warnings:
                self.warnings.append(warning)
            return None

    def preemption(self) -> PreemptionMarker | None:
        return self.node_file(PREEMPTED_FILE, PreemptionMarker)

    def read_summary(self) -> None:
        """The trainer's summary, validated, into ``summary`` (None when absent or bad)."""
        summary = self.node_file(SUMMARY_FILE, TrainerSummary)
        self.summary = summary.model_dump(exclude_none=True) if summary else None

    def failure(self) -> str | None:
        """What went wrong, in one line, the most fundamental first; None for a clean run."""
        if self.teardown and not self.teardown.clean:
            return self.teardown.summary()
        if self.cluster_went and not self.trained:
            return (f"the cluster was {self.cluster_went} (`sortie down`) while the job ran, "
                    f"which stopped it; what could be collected is in {self.artifacts}")
        if self.interrupted and not self.trained:
            return (f"interrupted ({self.interrupted}): the job was stopped; what it wrote is "
                    f"in {self.artifacts}")
        if self.phase_failed and not self.exit_codes:  # nothing launched: what stopped it
            return self.phase_failed
        if self.budget_reached and not self.exit_codes:
            return f"{self.budget_reached} before the job started: nothing more was started"
        if self.budget_reached:
            marker = self.preemption()  # the bundled trainer's checkpoint as it stopped
            step = marker.step if marker else self.last_step
            at = f" at step {step}" if step is not None else ""
            return (f"{self.budget_reached}{at}: the job was stopped; what it saved is in "
                    f"{self.artifacts}")
        if self.recovery_error:
            return f"{self.recovery_error}; logs in {self.artifacts / 'logs'}"
        marker = self.preemption() if not self.trained else None
        if marker:
            return (f"training was preempted ({marker.reason}) at step {marker.step}; "
                    f"its checkpoint is in {self.artifacts}")
        if not self.trained:
            return f"{self.job_failure()}; logs in " \
                f"{self.artifacts / 'logs'}"
        if self.collect_error:
            kept = "; ".join(self.teardown.kept) if self.teardown else ""
            return (f"training finished but its artifacts are not verified: "
                    f"{self.collect_error}" + (f"; kept: {kept}" if kept else ""))
        return None


    def kept_files(self, shown: int = 4) -> str | None:
        """The files the job wrote that came back, for people: "artifacts/model.pt,
        nodes/node-1/outputs/log.txt (2 files, 1.2 MiB)" (the ``shown`` largest, as the lines
        of what is left name them; paths relative to the run's directory); None when none came
        back. Not sortie's own: the nodes' and setup's logs. A checkpoint is a directory
        (`checkpoints/step-00000060/`, its shards and each rank's RNG): named once, with its
        count, where its files would have crowded out the model the job saved."""
        files = [a for a in self.collected if a.path.startswith(JOB_DIRS)]
        if not files:
            return None
        entries: dict[str, list[int]] = {}  # name -> [bytes, files]
        for artifact in files:
            parts = artifact.path.split("/")
            name = f"{parts[0]}/{parts[1]}/" if parts[0] == "checkpoints" and len(parts) > 2 \
                else artifact.path
            entry = entries.setdefault(name, [0, 0])
            entry[0], entry[1] = entry[0] + artifact.bytes, entry[1] + 1
        largest = sorted(entries.items(), key=lambda item: (-item[1][0], item[0]))
        names = ", ".join(_shortened(name) + (f" with {count} files" if name.endswith("/") else "")
                          for name, (_, count) in largest[:shown])
        more = f" and {len(largest) - shown:,} more" if len(largest) > shown else ""
        size = readable_bytes(sum(artifact.bytes for artifact in files))
        return f"{names}{more} ({counted(len(files), 'file')}, {size})"

    def where_recorded(self) -> list[str]:
        """["report: runs/<id>/report.html"], or where the run's files are when it has none
        ([] when nothing was written: a launch that never got going)."""
        if self.report:
            return [f"report: {self.report}"]
        return [f"its files: {self.artifacts}"] if self.artifacts.is_dir() else []

    def job_failure(self) -> str:
        """"training failed on node-1 first (exit 1), node-2 (exit 1); stopped by sortie:
        node-0": the failed nodes, the first of them first (and a process's abort its log
        shows, said of it, not of those sortie stopped), then those sortie stopped."""
        def said(node: str, code: int | None) -> str:
            first = " first" if node == self.first_failed and len(failed) > 1 else ""
            why = f"exit {code}" if code is not None else self.ended_by.get(node, "exit unknown")
            return f"{node}{first} ({why})"

        failed = {node: code for node, code in self.exit_codes.items()
                  if code != 0 and node not in self.stopped}
        order = sorted(failed, key=lambda node: node != self.first_failed)
        where = f" on {self.first_failed}" if len(failed) > 1 else ""
        line = (f"training failed on {', '.join(said(n, failed[n]) for n in order) or 'every node'}"
                + failure_cause(self.failure_tail, where, self.last_step_line,
                                self.workdir_files))
        stopped = [node for node in self.exit_codes if node in self.stopped]
        return line + (f"; stopped by sortie: {', '.join(stopped)}" if stopped else "")
