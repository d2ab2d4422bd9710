"""The task's `setup`: once per node, in the synced workdir, before the job; skipped on a node
whose last successful setup had the same fingerprint (the setup text, its environment, and the
content of the files named in `setup_inputs`, e.g. requirements.txt or uv.lock).

The marker is written only after the setup succeeded, so a setup cut short runs again. Setup
runs with sortie's own Python environment taken out of the way (no VIRTUAL_ENV, PYTHONPATH or
PYTHONHOME) and, where the node's Python is sortie's, in the job's own (`bootstrap/job_env.py`),
with the job's variables and secrets (secrets over stdin, as for the job). Its output is the
run's: ``setup.log`` in the run's directory on the node, collected into ``runs/<id>/setup/``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import shlex
import threading

from sortie.bootstrap.cluster_lock import SETUP_RUNNING
from sortie.bootstrap.container import (
    DRIVEN,
    IMAGES_FILE,
    container_name,
    run_line,
    setup_image,
    setup_key,
    stop_line,
)
from sortie.bootstrap.follow import LineSink, following
from sortie.bootstrap.job_env import activation, ensure
from sortie.bootstrap.job_secrets import SecretsOverStdin
from sortie.bootstrap.node_layout import job_dir, node_dir, run_dir
from sortie.bootstrap.ssh import NodeError, on_all, shell_env
from sortie.bootstrap.train import ended_line, job_environment
from sortie.bootstrap.transport import NodeTransport
from sortie.bootstrap.workdir import SyncPlan, content_digest, files_under
from sortie.core.errors import UsageError
from sortie.core.inventory import Inventory, Node
from sortie.core.job import Job

MARKER = "setup.done"  # in the node's own directory: the fingerprint of its last good setup
LOG = "setup.log"  # in the run's directory on the node
SETUP_LOGS = "setup"  # in runs/<id>/: each node's setup output, as collected
RUN_COPY = f"the run's {SETUP_LOGS}"  # where a failure says the logs are kept, unless told
TAIL_LINES = 20
# A setup (pip, conda, a build) may take long; the controller still ends its wait at some point.
SETUP_DEADLINE_S = 6 * 3600.0
SKIPPED = "sortie: setup cached"
# What the error line leaves out of a failed setup's last lines: pip's upgrade notices, its
# warnings about index locations, blank lines (the terminal had them all as they came).
NOISE = re.compile(r"^\s*$|^\[notice\] |^WARNING: (Location|The directory|Retrying) ")
# Lines that say what failed (pip's and apt's `ERROR:`/`E:`, a Python exception's last line).
FAILURE = re.compile(r"^(ERROR|E|error|fatal)\b:|^\w+(Error|Exception)\b|\bnot found\b")
SETUP_STOP_GRACE_S = 5.0  # from a stopped setup's SIGTERM to its SIGKILL (pip ends at once)
SETUP_PID = "setup.pid"  # in the run's directory on the node, while its setup runs
SETUP_CONTAINER = "setup.container"  # in it too: a setup in an image's runtime and container
SETUP_LABEL = "sortie.setup"  # on the image a setup made: its key


def setup_fingerprint(setup: str, env: dict[str, str], plan: SyncPlan | None,
                      inputs: tuple[str, ...]) -> str:
    """What decides whether a node's setup is still valid: its text, its environment, and what
    the synced files of ``inputs`` hold (a directory: every synced file below it). An input
    that is not synced is a UsageError: hashed as "missing", the setup would never run again.
    Secrets are left out: a rotated token does not make a new environment."""
    digest = hashlib.sha256()
    digest.update(json.dumps({"setup": setup, "env": sorted(env.items())}).encode())
    for name in sorted(inputs):
        files = files_under(plan, name) if plan else []
        if plan is None or not files:
            where = f"synced from {plan.root} ({plan.rules})" if plan else "synced (no workdir)"
            raise UsageError(f"setup_inputs: {name}: no file of that name is {where}")
        digest.update(f"\0{name}\0{content_digest(plan, files)}".encode())
    return digest.hexdigest()


class SetupFailed(NodeError):
    """A node's setup ended badly, with ``exited``: its exit code."""

    def __init__(self, message: str, exited: int) -> None:
        super().__init__(message)
        self.exited = exited

    @property
    def stopped(self) -> bool:
        """Whether it ended by `stop_setup`'s signals (another node's failure stopped it)."""
        return self.exited in (128 + 15, 128 + 9)


def setup_container(node: Node, run_id: str) -> str:
    """Where a setup in an image records its container (`container.run_line`)."""
    return f"{run_dir(node, run_id)}/{SETUP_CONTAINER}"


def stop_setup(conn: NodeTransport, node: Node, run_id: str, grace_s: float) -> None:
    """End the run's setup where it still runs on ``node`` (a run interrupted while its setup
    ran): its container stopped, SIGTERM to its session, SIGKILL ``grace_s`` later. Only while
    a setup holds the node's setup lock: the id written down is then that setup's own, not a
    process that took the number since."""
    pid = shlex.quote(f"{run_dir(node, run_id)}/{SETUP_PID}")
    running = shlex.quote(f"{node_dir(node)}/{SETUP_RUNNING}")
    conn.run(f'sid=$(cat {pid} 2>/dev/null) && [ "$sid" -gt 1 ] 2>/dev/null || exit 0\n'
             f"flock -n {running} true && exit 0\n"
             f"{stop_line(setup_container(node, run_id), grace_s)}{ended_line('-$sid', grace_s)}",
             timeout=2 * grace_s + 60)


def setup_log(node: Node, run_id: str) -> str:
    """Where a run's setup writes its output on ``node``."""
    return f"{run_dir(node, run_id)}/{LOG}"


def in_image(node: Node, cluster_id: str, job: Job, env: dict[str, str], script: str,
             key: str) -> tuple[str, str]:
    """(the command that runs the setup ``script`` in the job's image and commits what it made
    as `container.setup_image`, named by ``key``; the test that this image is still there)."""
    assert job.image is not None
    made, name = setup_image(key), container_name(job.run_id, node, "setup")
    listing = shlex.quote(f"{node_dir(node)}/{IMAGES_FILE}")
    inner = (run_line(node, cluster_id, name, job.image, env, (), job_dir(node),
                      ["bash", "-c", script], keep=True) +
             # Nodes that share a store (one machine's) each commit the same name, one at a
             # time (a commit's image is untagged until it is named: another node's cleanup
             # would take it); what the name named before is no one's then.
             f"\ncode=$?\nif [ $code = 0 ]; then (flock 9 || exit 1\n"
             f'"$rt" commit -q --change "LABEL {SETUP_LABEL}={key}" {name} {made} > /dev/null '
             f"|| exit 1\n"
             f'echo "$(basename "$rt") {made}" >> {listing}\n'
             f'old=$("$rt" images -q --filter dangling=true --filter label={SETUP_LABEL}={key})\n'
             f'[ -z "$old" ] || "$rt" rmi $old > /dev/null 2>&1; exit 0\n'
             f") 9> /tmp/sortie-setup-{key}.lock || code=1; fi\n"
             f'"$rt" rm -f {name} > /dev/null 2>&1\nexit $code')
    exists = " || ".join(f"{rt} image inspect {made}" for rt in DRIVEN)
    return f"bash -c {shlex.quote(inner)}", f"&& {{ {exists}; }} > /dev/null 2>&1 "


def run_setup(conn: NodeTransport, node: Node, inventory: Inventory, job: Job, setup: str,
              fingerprint: str, secrets: dict[str, str], rerun: bool = False,
              kept: str = RUN_COPY) -> bool:
    """Run the setup on ``node`` unless cached; True when it ran. A failure is a NodeError with
    the node, the exit code, what its output says failed and where all of it is: ``kept``
    (the directory the run collects the logs into, which outlasts the node) first."""
    # Per node (a node's setup is its own, even on a file system nodes share).
    # The log is the run's (collected with it, `setup/<node>.log`): a cached setup writes none.
    marker, log = shlex.quote(f"{node_dir(node)}/{MARKER}"), setup_log(node, job.run_id)
    running = shlex.quote(f"{node_dir(node)}/{SETUP_RUNNING}")
    sent = SecretsOverStdin(secrets, f"{run_dir(node, job.run_id)}/setup-secrets.env")
    env = job_environment(node, inventory, job, job_dir(node))
    workdir = shlex.quote(job_dir(node))
    script = (f"{sent.source}\n" if sent else "") + f"set -eo pipefail\n{setup}"
    command = f"bash -c {shlex.quote(script)}"
    cached, recorded = "", ""
    pid = shlex.quote(f"{run_dir(node, job.run_id)}/{SETUP_PID}")
    if job.image:  # in the image: its result is an image of its own, which the job runs in
        fingerprint = setup_key(job.image, fingerprint)  # what its marker holds, there
        command, cached = in_image(node, inventory.cluster_id, job, env, script, fingerprint)
        # Where `run_line` writes the container's runtime and name, for `stop_setup`.
        recorded = f"sortie_container={shlex.quote(setup_container(node, job.run_id))} "
    # Every way out removes the secrets file.
    check = "" if rerun else (f'test "$(cat {marker} 2>/dev/null)" = {fingerprint} {cached}'
                              f"&& {sent.discard} && echo {shlex.quote(SKIPPED)} && exit 0\n")
    result = sent.run(
        conn,
        f"{sent.receive}{check}{'' if job.image else ensure(node, inventory, sent.discard)}"
        f"rm -f {marker}\n"
        f"mkdir -p {workdir} {shlex.quote(run_dir(node, job.run_id))} && cd {workdir} || "
        f"{{ {sent.discard}; exit 1; }}\n"
        # Locked while it runs (by flock, not the setup's children, `-o`): a setup left running
        # by a controller that died is seen by the next exec's lock (`cluster_lock`). In a
        # session of its own, whose id it writes down: an interrupted run ends all of it
        # (`stop_setup`), where before a Ctrl-C left a `pip install` running.
        f"{recorded}setsid -w sh -c 'echo $$ > \"$0\"; exec \"$@\"' {pid} "
        f"flock -n -o -E 75 {running} "
        f"env -u VIRTUAL_ENV -u PYTHONPATH -u PYTHONHOME {activation(node, inventory)} "
        f"{shell_env(env)} {command} > {shlex.quote(log)} 2>&1 < /dev/null\n"
        f"code=$?; rm -f {pid}; {sent.discard}\n"
        f"if [ $code = 0 ]; then echo {fingerprint} > {marker}; "
        f"else tail -n {TAIL_LINES} {shlex.quote(log)}; fi\n"
        "exit $code", timeout=SETUP_DEADLINE_S)
    if result.ok:
        return SKIPPED not in result.stdout
    raise SetupFailed(f"{node.name}: setup failed (exit {result.exited}): "
                      f"{telling_lines(result.stdout)} (all of it: {kept}/{node.name}.log; "
                      f"on the node while it lasts: {log})", result.exited)


def telling_lines(tail: str, most: int = 3) -> str:
    """What a failed setup's last lines say failed: its error lines where it printed some (pip:
    "ERROR: No matching distribution found for ..."), else its last lines, noise left out; each
    line at most 300 characters (what a node prints is not ours to trust)."""
    lines = [line.strip()[:300] for line in tail.splitlines() if not NOISE.search(line)]
    failures = [line for line in lines if FAILURE.search(line)]
    return " / ".join((failures or lines)[-most:]) or "(no output)"


def setup_all(conns: dict[str, NodeTransport], inventory: Inventory, job: Job, setup: str,
              fingerprint: str, secrets: dict[str, str], rerun: bool = False,
              nodes: list[Node] | None = None, on_line: LineSink | None = None,
              kept: str = RUN_COPY) -> dict[str, bool]:
    """Setup on every node (or ``nodes``) in parallel: whether it ran, by node name; each
    node's output, as it comes, to ``on_line``. The first node whose setup fails ends the
    others' (the run cannot start without it): a failure of its own is raised, not theirs;
    an interruption ends every node's."""
    targets = nodes or inventory.nodes
    failed: dict[str, SetupFailed] = {}  # the first stops the others
    claim = threading.Lock()

    def stop(nodes: list[Node]) -> None:
        with contextlib.suppress(Exception):
            on_all(nodes, lambda n: stop_setup(conns[n.name], n, job.run_id,
                                               SETUP_STOP_GRACE_S))

    def one(node: Node) -> bool:
        try:
            with following(conns[node.name], node, setup_log(node, job.run_id), on_line):
                return run_setup(conns[node.name], node, inventory, job, setup, fingerprint,
                                 secrets, rerun, kept)
        except SetupFailed as exc:
            with claim:
                failed[node.name] = exc
                first = len(failed) == 1
            if first:
                stop([other for other in targets if other is not node])
            raise

    try:
        ran = on_all(targets, one)
    except NodeError as raised:  # the first in node order that was not stopped for another
        causes = [failed[n.name] for n in targets if n.name in failed
                  and not failed[n.name].stopped]
        raise (causes[0] if causes else raised) from None
    except BaseException:  # Ctrl-C, SIGTERM: none goes on running unseen, holding the nodes
        stop(targets)
        raise
    return {node.name: flag for node, flag in zip(targets, ran, strict=True)}
