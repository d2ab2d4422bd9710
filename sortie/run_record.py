"""What a user's job leaves beside its artifacts in ``runs/<id>/``: ``task.yaml`` (the task as it
ran; `sortie run` of it runs the job again) and ``record.json`` (its code, nodes, timings and
exit codes)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bootstrap.checks import NodeFacts
from sortie.outcome import RunRecord, RunResult
from sortie.task import UserJob, task_record

if TYPE_CHECKING:
    from sortie.lifecycle import RunRequest

TASK_RECORD = "task.yaml"
RUN_RECORD = "record.json"


def write_task(request: RunRequest, result: RunResult) -> None:
    """``task.yaml``, written before anything starts: a failed run has it too."""
    user = request.user_job
    if user is not None and user.task is not None:
        result.artifacts.mkdir(parents=True, exist_ok=True)
        (result.artifacts / TASK_RECORD).write_text(
            task_record(user.task, request.nodes, request.procs_per_node))


def write_record(result: RunResult, job: UserJob, node_facts: dict[str, NodeFacts]) -> None:
    """``record.json``: what ran, from which code, on which nodes, how it ended."""
    task = job.task
    record = RunRecord(
        run_id=result.run_id, ok=result.trained, profile=task.stack if task else None,
        overrides=task.overrides if task else (), code=job.code,
        setup_fingerprint=job.setup_fingerprint if job.setup else None,
        nodes={name: facts.model_dump() for name, facts in node_facts.items()},
        phase_s={key: round(seconds, 3) for key, seconds in result.phase_s.items()},
        wall_s=round(result.wall_s, 3), exit_codes=result.exit_codes,
        node_states=result.node_states)
    (result.artifacts / RUN_RECORD).write_text(record.model_dump_json(indent=2) + "\n")
