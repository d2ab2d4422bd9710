"""``run.json``: the one file that says what a run was and how it ended, written when it ends
(success or failure) and read by the report and by tools (its schema: `RunFile`)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pydantic

from sortie.bootstrap.health_report import HealthReport
from sortie.core import statefile
from sortie.core.image_ref import ImageUse
from sortie.core.statefile import RUN_FILE_MODE, open_regular
from sortie.rundir.result import RunResult

RUN_FILE = "run.json"
MAX_FILE_BYTES = 8 << 20  # run.json, manifest.json


class RecordedSpan(pydantic.BaseModel):
    phase: str = pydantic.Field(max_length=40)
    start_s: float
    end_s: float
    ok: bool = True


class RecordedRecovery(pydantic.BaseModel):
    lost: list[str]
    reason: str
    failed_at_step: int | None = None
    resumed_from_step: int | None = None
    downtime_s: float = 0.0
    redone_s: float = 0.0
    cost_s: float = 0.0
    detail: str = ""  # why, as found (a failed health check's figures)


class RecordedResult(pydantic.BaseModel, extra="allow"):
    """What the report reads of the RunResult in ``run.json`` (the rest is kept as it is)."""

    ok: bool = False
    ranks: int = 0
    cluster: str | None = pydantic.Field(default=None, max_length=64)  # an `exec`'s cluster
    wall_s: float | None = None
    exit_codes: dict[str, int | None] = pydantic.Field(default_factory=dict)
    node_states: dict[str, str] = pydantic.Field(default_factory=dict)
    timeline: list[RecordedSpan] = pydantic.Field(default_factory=list)
    recoveries: list[RecordedRecovery] = pydantic.Field(default_factory=list)
    launch_failures: list[str] = pydantic.Field(default_factory=list)
    summary: dict[str, Any] | None = None  # the trainer's summary.json, from a node
    health: HealthReport | None = None  # the health gate's last check
    image: ImageUse | None = None  # the container image the job ran in
    interrupted: str | None = pydantic.Field(default=None, max_length=20)  # "Ctrl-C", "SIGTERM"


class RunSetup(pydantic.BaseModel):
    """What a run was, apart from how it went: where, what, at what price, which code."""

    backend: str  # "local", "aws", "gcp", "azure", "attached"
    profile: str | None = None  # the stack profile, for a cloud sortie
    procs_per_node: int
    gpus_per_node: int = 0
    job: str  # "bundled trainer", or what the user's job runs
    started_at: str  # ISO 8601, UTC
    usd_per_hour: float | None = None  # at the launch terms; None: no cloud cost (local)
    pricing: str = ""  # "on-demand", "spot workers, on-demand head", ...
    node_facts: dict[str, dict[str, Any]] = pydantic.Field(default_factory=dict)
    # A user's job: which code ran (the workdir's content hash, files, git commit), its setup's
    # fingerprint, the profile's --set overrides.
    code: dict[str, Any] | None = None
    setup_fingerprint: str | None = None
    overrides: tuple[str, ...] = ()


class RunFile(RunSetup):
    """``run.json``: what the report needs besides the metrics and the manifest: the run's
    setup, and its result."""

    run_id: str
    nodes: int
    failure: str | None = None  # what went wrong, in one line
    teardown: str | None = None  # the teardown's proof line
    result: RecordedResult  # the RunResult, as `--json` prints it

    @classmethod
    def of(cls, setup: RunSetup, result: RunResult) -> RunFile:
        return cls(
            **dict(setup), run_id=result.run_id, nodes=result.nodes, failure=result.failure(),
            teardown=result.teardown.summary() if result.teardown else None,
            result=pydantic.TypeAdapter(RunResult).dump_python(result, mode="json",
                                                               by_alias=True))


def started_at(epoch_s: float) -> str:
    """When a run started, as ``run.json`` says it."""
    return datetime.datetime.fromtimestamp(epoch_s, datetime.timezone.utc) \
        .isoformat(timespec="seconds")


def write_run_file(setup: RunSetup, result: RunResult) -> RunFile:
    """Write ``run.json`` whole; return what was written, from which the report is drawn."""
    document = RunFile.of(setup, result)
    statefile.write_text(result.artifacts / RUN_FILE, document.model_dump_json(indent=2) + "\n",
                         RUN_FILE_MODE)
    return document


def _read_json(path: Path) -> Any:
    handle = open_regular(path)
    if handle is None:
        return None
    with handle:
        data = handle.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        return None
    try:
        return json.loads(data.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):
        return None
