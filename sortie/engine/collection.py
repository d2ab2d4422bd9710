"""The end of a run on its nodes, before teardown: stop a job still running, then copy back
and verify what the run made (`bootstrap/collect.py`): each node's outputs and log, what a
user's job wrote in its workdir (`bootstrap/job_outputs.py`: its own new files, the task's
`artifacts` first, the rest up to ``--collect-max``), the bucket's newest checkpoint. What the
job wrote and was not collected is named in one line, with the flag that keeps it."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from sortie.bootstrap import collect, job_outputs, ssh, train, verified_copy
from sortie.bootstrap.node_layout import job_dir
from sortie.core.errors import SortieError
from sortie.core.inventory import Inventory, Node
from sortie.core.progress import PhaseEnd, Reporter
from sortie.engine.request import Limits
from sortie.engine.task import UserJob
from sortie.infra.cloud_home import bucket_access
from sortie.rundir.metrics import METRICS_FILE
from sortie.rundir.result import RunResult

Phase = Callable[[str, str], AbstractContextManager[PhaseEnd]]


def stop_and_collect(inventory: Inventory, conns: ssh.Connections, result: RunResult,
                     user_job: UserJob | None, limits: Limits, rank0_node: str | None,
                     phase: Phase, reporter: Reporter, torn_down: bool,
                     launched: bool = True, own_machines: bool = False) -> None:
    """Best effort: stop training still running (``launched``: there may be some), then copy
    what the nodes and the bucket have. A failure here is recorded and said, never raised:
    teardown must still run. ``torn_down``: the cluster goes next (what is left on it goes
    too). ``own_machines``: the nodes are machines of the cluster's own, which its teardown
    destroys (a cloud's, booted local nodes): what the job wrote outside its workdir, in their
    $HOME, temporary directory, /mnt and data disks, is named too."""
    reachable = [n for n in inventory.nodes if n.name in conns]
    unfinished = [n for n in reachable if launched and result.exit_codes.get(n.name) is None]
    dest = result.artifacts
    budget = verified_copy.Budget(limits.max_artifact_bytes)
    try:
        if unfinished:
            with phase("stop", "Stopping training"):
                # (A hung job saves nothing: it is given a short grace, not one to save in.)
                grace = train.HUNG_STOP_GRACE_S if result.hung else train.STOP_GRACE_S
                ssh.on_all(unfinished, lambda n: train.stop(conns[n.name], n, result.run_id,
                                                            grace))
        with phase("collect", f"Collecting and verifying artifacts into {dest}"):
            # Rank 0 of the last attempt wrote the trainer's outputs (an earlier rank 0's are
            # kept aside); a user job's nodes each may write theirs: rank 0's are the artifacts.
            first = rank0_node or (collect.sole_holder(conns, inventory, result.run_id,
                                                       METRICS_FILE) if user_job else None)

            def outputs_to(name: str) -> Path:
                return dest / (verified_copy.ARTIFACTS_DIR if first in (None, name) else
                               f"{verified_copy.NODES_DIR}/{name}")

            dest.mkdir(parents=True, exist_ok=True)
            new, refused = _new_files(reachable, conns, result.run_id, user_job, limits, first,
                                      reporter, launched)
            found = ssh.on_all(reachable, lambda n: collect.collect(
                conns[n.name], n, result.run_id, dest, outputs_to(n.name), budget,
                [f.path for f in new.on(n.name)]))
            checkpoints = inventory.train_env.get("SORTIE_CHECKPOINT_URL")
            if checkpoints:
                options, grant_s = bucket_access(checkpoints)
                found.append(collect.collect_checkpoint(checkpoints, dest, budget, options,
                                                        grant_s))
            result.collected = [artifact for part in found for artifact in part.artifacts]
            verified_copy.write_manifest(dest, result.run_id, result.collected)
            _say_left(new.left, limits, inventory, result, reporter, torn_down)
            if own_machines and user_job and launched:
                _say_outside(reachable, conns, inventory, result, reporter, torn_down)
            refused += [entry for part in found for entry in part.refused]
            if refused:
                raise SortieError(f"refused {len(refused)} files: {'; '.join(refused)}")
    except Exception as exc:
        result.collect_error = str(exc)
        reporter.note(f"collecting artifacts failed: {exc}")


def _new_files(reachable: list[Node], conns: ssh.Connections, run_id: str, user_job: UserJob | None,
               limits: Limits, first: str | None, reporter: Reporter, launched: bool
               ) -> tuple[job_outputs.Chosen, list[str]]:
    """What a user's job wrote in its workdir on each node, and which of it is collected;
    rank 0's node is asked first (a file nodes share is that node's)."""
    if user_job is None:  # the bundled trainer writes only in its outputs directory
        return job_outputs.Chosen(), []
    ordered = sorted(reachable, key=lambda n: n.name != first)
    listed = ssh.on_all(ordered, lambda n: job_outputs.list_new(
        conns[n.name], n, run_id, user_job.artifacts))
    for glob in job_outputs.unmatched(user_job.artifacts if launched else (), listed):
        reporter.note(f"artifacts {glob!r} named no file the job wrote (in its workdir, since "
                      "it started): nothing of it comes back")
    return (job_outputs.choose(listed, limits.collect_new_bytes),
            [entry for part in listed for entry in part.refused])


def _say_left(left: list[job_outputs.NewFile], limits: Limits, inventory: Inventory,
              result: RunResult, reporter: Reporter, torn_down: bool) -> None:
    """Name what the job wrote and collection left on the nodes (in `run.json` too)."""
    where = ("they go with the cluster" if torn_down else
             f"they stay on {result.cluster or inventory.cluster_id} under "
             f"{job_dir(inventory.head)}")
    line = job_outputs.left_line(left, limits.collect_new_bytes, where)
    result.left_on_nodes = [f.recorded() for f in left]
    if line:
        reporter.note(line)


def _say_outside(reachable: list[Node], conns: ssh.Connections, inventory: Inventory,
                 result: RunResult, reporter: Reporter, torn_down: bool) -> None:
    """Name what the job wrote outside its workdir on machines the cluster's teardown destroys
    (`run.json`'s ``left_on_nodes`` too): never collected, never lost unsaid."""
    try:
        found = ssh.on_all(reachable, lambda n: job_outputs.list_outside(conns[n.name], n,
                                                                           result.run_id))
    except Exception as exc:  # noqa: BLE001 - a look that failed loses nothing: it is said
        reporter.note(f"looking for files the job wrote outside its workdir failed: {exc}")
        return
    where = ("they go with the cluster" if torn_down else
             f"they stay on {result.cluster or inventory.cluster_id} until `sortie down` "
             "destroys its machines")
    line = job_outputs.outside_line(found, where)
    result.left_on_nodes += [f.recorded() for look in found for f in look.files]
    if line:
        reporter.note(line)
