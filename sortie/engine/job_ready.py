"""A job made ready on its nodes before it launches, on the whole cluster and again on nodes
that replaced lost ones: its image pulled on every node (a tag resolved to a digest once, which
the job and its record name from then on), the job's own Python environment where the node's
is sortie's, the user's workdir synced, and its setup run where it is not cached (in the image:
what it makes is an image of its own, which the job then runs in)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from sortie.bootstrap import job_env, node_layout
from sortie.bootstrap.checks import NodeFacts, require_rsync
from sortie.bootstrap.container import describe_pulls, pull_all, setup_image, setup_key
from sortie.bootstrap.job_packages import PACKAGES_FILE, changes, parse_packages, read_packages
from sortie.bootstrap.setup_cache import SETUP_LOGS, setup_all
from sortie.bootstrap.ssh import Connections, on_all
from sortie.bootstrap.sync import describe_sync, sync
from sortie.bootstrap.workdir import (
    imports_out_of_reach,
    sets_rendezvous,
    started_without_torchrun,
)
from sortie.core import statefile
from sortie.core.image_ref import ImageRef, ImageUse
from sortie.core.inventory import Inventory, Node
from sortie.core.job import Job
from sortie.core.progress import PhaseEnd, Reporter, some_of
from sortie.core.statefile import RUN_FILE_MODE
from sortie.engine.task import UserJob
from sortie.rundir.result import RunResult

Phase = Callable[[str, str], AbstractContextManager[PhaseEnd]]  # `Driver.phase`
REQUIREMENTS = "requirements.txt"  # a workdir's, which no setup installs by itself


def pull_image(conns: Connections, nodes: list[Node], job: Job, result: RunResult,
               phase: Phase, reporter: Reporter, registry_password: str = "") -> Job:
    """The job's image on ``nodes``, pulled in parallel (logged in as its `registry_auth`
    says, with ``registry_password``); the job naming it by digest. Each node's pull goes into
    ``result.image``."""
    assert job.image is not None
    asked = ImageRef.parse(job.image)
    with phase("image", f"Pulling {asked} on {len(nodes)} node{'s' if len(nodes) > 1 else ''} "
                        "(where it is not there)"):
        pinned, pulls = pull_all(conns, nodes, asked, job.registry_auth, registry_password,
                                 on_line=lambda node, line: reporter.node_line(f"{node} pull",
                                                                               line))
    head = next(iter(pulls.values()))
    used = result.image or ImageUse(asked=str(asked), image=str(pinned), runtime=head.runtime,
                                    size_bytes=head.size_bytes)
    used.pulled_s |= {name: round(pull.seconds, 2) for name, pull in pulls.items()}
    result.image = used
    reporter.info(describe_pulls(pinned, pulls))
    return job.model_copy(update={"image": str(pinned)})


def ready_user_job(conns: Connections, inventory: Inventory, nodes: list[Node], job: Job,
                   user_job: UserJob, result: RunResult, facts: dict[str, NodeFacts],
                   synced_list: Path, phase: Phase, reporter: Reporter,
                   whole: bool = True) -> Job:
    """The user's job ready on ``nodes`` (its image already there): the job, naming the image
    its setup made where it made one. ``whole``: the cluster's every node, not the ones that
    replaced lost nodes (what the workdir shows is said once a run, `advice`)."""
    made = [] if job.image else job_env.make_all(conns, inventory, nodes)
    if made:
        reporter.info(f"your job's own Python environment made on {', '.join(made)}: "
                      f"{node_layout.job_env_dir(inventory.head)} (setup installs there, never "
                      "into sortie's)")
    if user_job.files:
        require_rsync(facts, nodes)
        with phase("sync", f"Syncing {user_job.files.describe()} from "
                   f"{user_job.files.root} to the nodes"):
            synced_list.parent.mkdir(parents=True, exist_ok=True)
            sent = sync(inventory, user_job.files, synced_list, nodes, conns,
                        user_job.file_digests)
            result.workdir_files = user_job.files.files  # a failure's cause may be there
            for line in describe_sync(sent, (n.name for n in nodes)):
                reporter.info(line)
        if whole:
            for note in advice(user_job, len(inventory.nodes), job.image):
                reporter.note(note)
    if not user_job.setup:
        return job
    kept = result.artifacts / SETUP_LOGS
    with phase("setup", "Setup on every node (skipped where cached)"):
        ran = setup_all(conns, inventory, job, user_job.setup, user_job.setup_fingerprint,
                        user_job.secrets, user_job.rerun_setup, nodes,
                        on_line=lambda node, line: reporter.node_line(f"{node} setup", line),
                        kept=str(kept))
    for did, said in ((True, "setup ran on"), (False, "setup cached on")):
        names = [name for name, done in ran.items() if done is did]
        if names:
            reporter.info(f"{said} {', '.join(names)}" +
                          (f"; its output: {kept}/<node>.log" if did else ""))
    if not job.image:
        return job
    made_image = setup_image(setup_key(job.image, user_job.setup_fingerprint))
    if result.image is not None:
        result.image.setup_image = made_image
    return job.model_copy(update={"setup_image": made_image})


def advice(user_job: UserJob, nodes: int, image: str | None) -> list[str]:
    """What the workdir shows that would fail the job on ``nodes`` nodes: a `requirements.txt`
    nothing installs, a script that sets the rendezvous torchrun set (said by a run once, and
    by `--dry-run`)."""
    if user_job.files is None:
        return []
    said = []
    if not user_job.setup and not image and REQUIREMENTS in user_job.files.files:
        said.append(f"{REQUIREMENTS} is in the workdir, but the task has no setup: nothing "
                    f"installs it on the nodes (`--setup 'pip install -r {REQUIREMENTS}'`, "
                    "or `setup:` in a task file)")
    found = sets_rendezvous(user_job.files) if nodes > 1 else []
    if found:
        said.append(f"{', '.join(found)} itself: with {nodes} nodes, every rank must use the "
                    "head's, which torchrun sets (each would look for the store on its own "
                    "node and wait); remove the line (`init_method=\"env://\"`, the "
                    "default, reads torchrun's)")
    run = user_job.command.run
    if run and (plain := started_without_torchrun(user_job.files, run)):
        said.append(f"the run line starts {plain} with plain Python, and it joins a process "
                    "group, which needs the RANK, LOCAL_RANK and WORLD_SIZE torchrun sets in "
                    f"each process: `--script {plain}` runs it under torchrun on every node")
    script, env = user_job.command.script, user_job.command.env
    installs = any(way in (user_job.setup or "") for way in ("pip install -e", "pip install ."))
    if script and "PYTHONPATH" not in env and not installs and not image:
        for module, where in imports_out_of_reach(user_job.files, script):
            said.append(f"{script} imports {module}, which the workdir has at its top "
                        f"({where}): Python looks in the script's own directory, not there; "
                        "`--env PYTHONPATH=.` adds it (`env:` in a task file)")
    return said


def record_packages(conns: Connections, inventory: Inventory, nodes: list[Node], result: RunResult,
                    reporter: Reporter, repeats: Path | None) -> None:
    """Which packages the job runs with on ``nodes`` (`job_packages`): the head's list kept
    with the run (a replaced node's compared with it), a node that differs said, and so is what
    differs from the run this one repeats (``repeats``: its directory). Best effort."""
    lists = on_all(nodes, lambda n: read_packages(conns[n.name], n, inventory))
    found = {node.name: got for node, got in zip(nodes, lists, strict=True) if got is not None}
    if not found:
        return
    kept = result.artifacts / PACKAGES_FILE
    first = not kept.is_file()  # a recovery's replaced nodes: compared with the first list
    try:
        reference = next(iter(found.values())) if first else parse_packages(kept.read_text())
        if first:
            statefile.write_text(kept, "".join(f"{line}\n" for line in reference),
                                 RUN_FILE_MODE)
    except (OSError, UnicodeError) as exc:  # the run goes on: said, as a report's failure is
        reporter.note(f"the job's packages could not be kept in {kept}: {exc}")
        return
    head = inventory.head.name
    for name, got in found.items():
        if differ := changes(reference, got):
            reporter.note(f"{name}'s Python packages differ from {head}'s: {some_of(differ)} "
                          "(the job may not run alike there)")
    before = repeats / PACKAGES_FILE if repeats else None
    if first and before is not None and before.is_file():
        with contextlib.suppress(OSError, UnicodeError):
            if differ := changes(parse_packages(before.read_text()[:1 << 20]), reference):
                reporter.note(f"the job's Python packages differ from those run "
                              f"{before.parent.name} ran with: {some_of(differ)} (its list: "
                              f"{before})")
