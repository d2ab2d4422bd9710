"""Launch a job on every node detached from SSH, stream its log, stop it; install the trainer.

A job is one of three (`Job`): the bundled trainer under torchrun; the user's script under
torchrun (sortie writes the torchrun line); or the user's own shell `run` on every node (the
user writes it, from the variables of `bootstrap/contract.py`). All three get the same
rendezvous, detached launch, log streaming, stop and recovery. On every node, one run lives in
its run directory (`bootstrap/node_layout.py` names its files), collected after the run.
Secrets never appear in a command line: they go over the SSH channel's stdin into a 0600 file
in the run's directory, which the job's shell reads and deletes before anything else runs."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from sortie.bootstrap.container import CONTAINER_RECORD, IMAGE_PYTHON, job_line, stop_line
from sortie.bootstrap.contract import cluster_environment, node_environment, torchrun_path
from sortie.bootstrap.follow import LineSink, LineWriter
from sortie.bootstrap.job_env import activation, ensure, job_python
from sortie.bootstrap.job_secrets import SecretsOverStdin
from sortie.bootstrap.node_layout import (
    artifact_dir,
    job_dir,
    run_dir,
    started_marker,
    trainer_home,
)
from sortie.bootstrap.ssh import NodeError, on_all, shell_env
from sortie.bootstrap.transport import NodeTransport
from sortie.core.inventory import Inventory, Node
from sortie.core.job import Job
from sortie.trainer.config import PREEMPTED_EXIT_CODE

LAUNCH_TIMEOUT_S = 30  # starting a detached torchrun takes well under a second
# When one node's job fails, the others usually fail with it within a second or two (their
# collectives break) and say so in their logs; any still running this long after are stopped.
FAILURE_GRACE_S = 3.0
# A node that stopped for a preemption (exit 75): the others are saving the same step.
PREEMPTION_GRACE_S = 30.0
# From SIGTERM (torchrun passes it to its workers) to SIGKILL: the job saves its checkpoint in
# it, at its next step, through a collective; 5 s was too little on a loaded machine (CI: a
# Ctrl-C'd run's trainer killed before its marker was written). The wait ends once all exit.
STOP_GRACE_S, HUNG_STOP_GRACE_S = 15.0, 5.0


def _said_if_failed(stopping: Future, node: Node, sink: LineSink) -> None:
    if stopping.exception():
        sink(node.name, f"[sortie] stopping the job failed: {stopping.exception()}")


def job_environment(node: Node, inventory: Inventory, job: Job,
                    workdir: str) -> dict[str, str]:
    """What the job's processes (and a user job's setup) see on ``node``: the cluster's own
    variables, the node's place in it (`bootstrap/contract.py`), then the task's `env` (the
    bundled trainer's: its `--env`)."""
    return {**cluster_environment(inventory, node),
            **node_environment(inventory, node, run_id=job.run_id,
                               procs_per_node=job.procs_per_node, workdir=workdir,
                               artifact_dir=artifact_dir(node, job.run_id),
                               python=IMAGE_PYTHON if job.image else
                               job_python(node, inventory) if job.is_user_job else node.python),
            **(job.command.env if job.command else job.trainer_env)}


def job_command(node: Node, inventory: Inventory, job: Job) -> tuple[str, str]:
    """(directory, command) to start the job on ``node``. The same torchrun line on every node
    but its rank: the inventory's order (the head is node 0, and hosts the store)."""
    rd = run_dir(node, job.run_id)
    workdir = job_dir(node) if job.is_user_job else node.workdir
    env = {
        "PYTHONUNBUFFERED": "1",
        # torch 2.13: restarted workers read stale addresses from a shared store (pytorch#135712).
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        **job_environment(node, inventory, job, workdir),
    }
    command = job.command
    if command and command.run:  # the user's shell; pipefail: a failing stage of a pipe fails
        argv = ["bash", "-c", f"set -eo pipefail\n{command.run}"]
    else:
        # torchrun's own default with several processes per node, set here to skip its banner
        # (a `run` line's command is the user's own: its threads are its own to set).
        env = {"OMP_NUM_THREADS": "1", **env}
        argv = [
            env["SORTIE_PYTHON"], torchrun_path(node),  # torchrun, passing a rank's exit 75
            f"--nnodes={len(inventory.nodes)}",
            f"--nproc-per-node={job.procs_per_node}",
            # Static: sortie knows every node and relaunches them all after a failure, so it
            # names the ranks. c10d's join would cost a random 0-0.3 s delay and polls once a
            # second while it waits for the others (about 1.5 s a job on 2 nodes,
            # benchmarks/e2e_local.py).
            "--rdzv-backend=static",
            f"--rdzv-endpoint={inventory.head.private_address}:{inventory.rdzv_port}",
            f"--node-rank={inventory.node_rank(node.name)}",
            f"--rdzv-id={job.run_id}",
            # A node whose private address is not its host name's (a network namespace, a
            # second NIC) says it: the workers' store address comes from it.
            f"--local-addr={node.private_address}",
            "--max-restarts=0",  # a failed attempt is sortie's to recover: it may replace a node
        ]
        if command and command.script:
            argv += [command.script, *command.script_args]
        else:  # the uploaded trainer, not whatever the node has installed
            env["PYTHONPATH"] = trainer_home(node)
            argv += ["-m", "trainer", "--out", f"{rd}/out", *job.trainer_args]
    if job.image:  # one container per node (`bootstrap/container.py`), in what setup made
        return workdir, job_line(node, inventory.cluster_id, job.run_id,
                                 job.setup_image or job.image, env,
                                 command.secret_names if command else (), workdir, argv,
                                 f"{rd}/{CONTAINER_RECORD}")
    # A user's job runs in its own environment where the node's Python is sortie's.
    own = f"{activation(node, inventory)} " if job.is_user_job and activation(node, inventory) \
        else ""
    return workdir, f"{own}{shell_env(env)} {shlex.join(argv)}"


def launch(conn: NodeTransport, node: Node, inventory: Inventory, job: Job,
           secrets: dict[str, str] | None = None) -> None:
    """Start the job detached, so that losing the connection never stops it (the node's
    transport says how: `NodeTransport.start_job`)."""
    rd = shlex.quote(run_dir(node, job.run_id))
    started = shlex.quote(started_marker(node, job.run_id))
    workdir, command = job_command(node, inventory, job)
    sent = SecretsOverStdin(secrets or {}, f"{run_dir(node, job.run_id)}/secrets.env")
    wrapped = f"{sent.source} && {command}" if sent else command
    # Separate statements: a trailing `&` would background a whole `a && b && c` list. A relaunch
    # after a recovery appends to the log and must not see the previous attempt's exit code.
    # The job's shell holds a lock on `running` from before it starts until after it wrote
    # its exit code (its children do not inherit it): `watch` waits on the lock, not polling.
    own_env = ensure(node, inventory, sent.discard) if job.is_user_job and not job.image else ""
    prelude = (f"mkdir -p {rd}/out {shlex.quote(workdir)} || exit 1\n{sent.receive}{own_env}"
               f"cd {shlex.quote(workdir)} || exit 1\n"
               f"rm -f {rd}/exit_code {rd}/out/preempted.json\n"
               # When the run first started here: what the job writes after it is the run's
               # (`bootstrap/job_outputs.py`); a relaunch keeps the first attempt's.
               f"[ -e {started} ] || : > {started} || exit 1\n"
               # Where this attempt's output starts in the log (`watch` streams from there).
               f"stat -c %s {rd}/torchrun.log 2>/dev/null > {rd}/log_offset || "
               f"echo 0 > {rd}/log_offset\n"
               f"exec 9> {rd}/running && flock -n 9 || "
               "{ echo 'a job of this run still runs here' >&2; exit 1; }\n")
    result = conn.start_job(prelude, run_dir(node, job.run_id), workdir, wrapped,
                            lambda script: sent.run(conn, script, timeout=LAUNCH_TIMEOUT_S),
                            LAUNCH_TIMEOUT_S)
    if not result.ok:
        why = (result.stderr or result.stdout).strip()
        raise NodeError(f"{node.name}: launching the job failed: {why}")


def launch_all(conns: dict[str, NodeTransport], inventory: Inventory, job: Job,
               secrets: dict[str, str] | None = None) -> None:
    """Launch on every node (each launch returns within LAUNCH_TIMEOUT_S)."""
    on_all(inventory.nodes, lambda n: launch(conns[n.name], n, inventory, job, secrets))


def watch(conn: NodeTransport, node: Node, run_id: str, sink: LineSink
          ) -> tuple[int | None, float | None]:
    """Stream the node's job log, from where the latest launch started it, until the job exits;
    return (its exit code, when it ended by the node's clock).

    None means the job ended without recording one (it was killed)."""
    rd = shlex.quote(run_dir(node, run_id))
    writer = LineWriter(node.name, sink)
    # tail follows until a waiter ends: the lock on `running` is free once the job's shell
    # wrote the exit code and exited (its pid can outlive it as a zombie for seconds where init
    # reaps lazily: not a sign). A job launched without the lock (an older sortie) is polled.
    # Then, in the same round trip, the exit code and when it was written, after a mark.
    conn.run(f"if [ -e {rd}/running ]; then flock {rd}/running true & else job=$(cat {rd}/pid)\n"
             f"( while [ ! -e {rd}/exit_code ] && kill -0 $job 2>/dev/null; do sleep 0.05; "
             "done ) & fi\n"
             f"tail -c +$(( $(cat {rd}/log_offset 2>/dev/null || echo 0) + 1 )) -s 0.01 -F "
             f"--pid=$! {rd}/torchrun.log 2>/dev/null\n"
             f"printf '\\036sortie-exit %s %s\\n' \"$(cat {rd}/exit_code 2>/dev/null)\" "
             f"\"$(date -r {rd}/exit_code +%s.%N 2>/dev/null)\"",
             hide=False, out_stream=writer, err_stream=writer)
    writer.close()
    found = (writer.exit_line or "").split()
    code, ended = (found + ["", ""])[:2]
    return (int(code) if code.lstrip("-").isdigit() else None,
            float(ended) if ended.replace(".", "", 1).isdigit() else None)


MAX_LOG_READ = 4 << 20  # what `sortie logs` reads of a node's log: its end


def read_log(conn: NodeTransport, node: Node, run_id: str) -> str:
    """The node's torchrun log of the run so far, its last MAX_LOG_READ bytes ("" when there
    is none)."""
    log = shlex.quote(f"{run_dir(node, run_id)}/torchrun.log")
    return conn.run(f"tail -c {MAX_LOG_READ} {log} 2>/dev/null").stdout


def progress(conn: NodeTransport, node: Node, run_id: str) -> tuple[int | None, float | None]:
    """(exit code, seconds since the run last wrote its log or metrics) on this node, both by
    the node's own clock; None where there is none: torchrun still runs / nothing was written."""
    rd = shlex.quote(run_dir(node, run_id))
    result = conn.run(f"cat {rd}/exit_code 2>/dev/null || echo -\n"
                      f"newest=$(stat -c %Y {rd}/torchrun.log {rd}/out/metrics.jsonl 2>/dev/null"
                      " | sort -n | tail -1)\n"
                      'test -n "$newest" && echo $(( $(date +%s) - newest )) || echo -')
    code, idle = (result.stdout.split() + ["-", "-"])[:2]
    return (int(code) if code.lstrip("-").isdigit() else None,
            float(idle) if idle.lstrip("-").isdigit() else None)


def stop(conn: NodeTransport, node: Node, run_id: str, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the run's process group (torchrun forwards it to workers), SIGKILL after grace."""
    rd = shlex.quote(run_dir(node, run_id))
    # torchrun starts each worker in a session of its own, out of the group's reach: one stuck
    # in a collective would outlive torchrun's SIGKILL and meet the next attempt (on the same
    # store port). The tree under the launch, taken while torchrun lives, reaches them all.
    tree = ("ps -e -o pid= -o ppid= | awk -v root=$pid '{ up[$1] = $2 } END { for (p in up) "
            "{ q = p; while (q != root && q in up && q > 1) q = up[q]; if (q == root) print p "
            "} }'")
    # Bounded: a node that stopped answering must not hold up collection and teardown.
    # A job in an image: its container first (its runtime passes the SIGTERM to torchrun and
    # kills what is left after the grace); its client then ends by itself.
    container = stop_line(f"{run_dir(node, run_id)}/{CONTAINER_RECORD}", grace_s)
    conn.run(f"{container}pid=$(cat {rd}/pid 2>/dev/null) || exit 0; tree=$({tree})\n"
             f"{ended_line('-$pid $tree', grace_s)}", timeout=2 * grace_s + 60)


def ended_line(targets: str, grace_s: float) -> str:
    """Shell that ends ``targets`` (kill's operands, ``-$pid`` for a process group): SIGTERM,
    SIGKILL ``grace_s`` later to what is left, then a wait until they are gone (the next attempt
    needs the ports and locks they held); it exits 0 as soon as none is left."""
    return ("gone_within() { for i in $(seq $1); do kill -0 -- " + targets + " 2>/dev/null || "
            "exit 0; sleep 0.1; done; }\n"
            f"kill -TERM -- {targets} 2>/dev/null || exit 0; "
            f"gone_within {max(1, int(grace_s * 10))}\n"
            f"kill -KILL -- {targets} 2>/dev/null; gone_within 50")


@dataclass
class Watched:
    """How a job ended on every node."""

    codes: dict[str, int | None]  # exit code by node; None: unknown (no connection, killed)
    ended_by: dict[str, str] = field(default_factory=dict)  # no code: why, as Slurm said it
    first_failed: str | None = None  # the node whose job ended badly first: look there
    stopped: list[str] = field(default_factory=list)  # nodes sortie stopped after that
    halted: str | None = None  # why sortie stopped a job still running (a hang, the budget)


def watch_all(conns: dict[str, NodeTransport], inventory: Inventory, run_id: str, sink: LineSink,
              failure_grace_s: float = FAILURE_GRACE_S,
              preemption_grace_s: float = PREEMPTION_GRACE_S,
              halt: Callable[[], tuple[str, float] | None] = lambda: None) -> Watched:
    """Watch every node until its job exits. Once one node's job ended badly, the job cannot
    succeed (torchrun never restarts: recovering is sortie's): nodes still running
    ``failure_grace_s`` later (``preemption_grace_s`` after a preemption's exit 75) are
    stopped, all at once, rather than left to hang in a collective. So is a job that ``halt``
    gives a reason to stop (it hangs; its budget is spent), with the grace it gives (a hung
    job saves nothing: a short one)."""
    pool = ThreadPoolExecutor(max_workers=2 * len(inventory.nodes),
                              thread_name_prefix="sortie-watch")
    futures = {pool.submit(watch, conns[n.name], n, run_id, sink): n for n in inventory.nodes
               if n.name in conns}
    codes: dict[str, int | None] = {}
    ended: dict[str, float] = {}  # when each node's job ended, by its clock
    ended_by: dict[str, str] = {}  # (`Watched`)
    stopped: list[str] = []
    for node in inventory.nodes:
        if node.name not in conns:
            sink(node.name, "[sortie] not reachable over SSH")
    pending = set(futures)
    # (when, which node, why) of the first bad end; the grace runs from then.
    failure: tuple[float, str, str] | None = None
    if len(futures) < len(inventory.nodes):
        unreachable = next(n.name for n in inventory.nodes if n.name not in conns)
        failure = (time.monotonic(), unreachable, "not reachable")
    grace, halted, stop_grace = failure_grace_s, None, STOP_GRACE_S
    stops: dict = {}  # future -> node: the stops sortie started
    try:
        while pending:
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            if pending and not failure and not halted and (stopping := halt()):
                halted, stop_grace = stopping
                failure, grace = (time.monotonic(), "every node", halted), 0.0
            for future in done:
                node = futures[future]
                try:
                    codes[node.name], at = future.result()
                    if at is not None:
                        ended[node.name] = at
                except Exception as exc:  # the connection broke: the node's fate is unknown
                    sink(node.name, f"[sortie] lost the node while watching: {exc}")
                    codes[node.name] = None
                code = codes[node.name]
                if code is None and (why := conns[node.name].ended_by(run_dir(node, run_id))):
                    ended_by[node.name] = why
                    sink(node.name, f"[sortie] {why}")
                if code != 0 and failure is None and node.name not in stopped:
                    failure = (time.monotonic(), node.name, f"exit {code}" if code is not None
                               else ended_by.get(node.name, "exit unknown"))
                    grace = preemption_grace_s if code == PREEMPTED_EXIT_CODE else grace
            if pending and failure and not stopped and \
                    time.monotonic() - failure[0] > grace:
                _, first_failed, why = failure
                running = [futures[f] for f in pending]
                for node in running:
                    sink(node.name, f"[sortie] stopping this node's job: {why}" if halted else
                         f"[sortie] stopping this node's job: {first_failed} ended ({why}) "
                         f"{grace:g}s ago")
                stopped += [node.name for node in running]
                # In parallel, beside the watchers (each stop is bounded): a node's watcher
                # returns once its job is gone.
                stops = {pool.submit(stop, conns[n.name], n, run_id, stop_grace): n
                         for n in running}
                for future, node in stops.items():
                    future.add_done_callback(lambda f, n=node: _said_if_failed(f, n, sink))
        # A watcher returns once the job's shell is gone; its torchrun and workers may still be
        # dying: what comes next (a relaunch, collection) waits for the stops (each bounded).
        wait(stops)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    every = {n.name: codes.get(n.name) for n in inventory.nodes}
    failed = [name for name, code in every.items() if code != 0 and name not in stopped]
    if halted:  # every node was stopped: none failed first
        return Watched(every, ended_by, None, stopped, halted=halted)
    # The first to fail by the nodes' own clocks (NTP-synced on clouds, one clock locally);
    # a node with no exit time (unreachable, killed) comes after those that have one.
    first = min(failed, key=lambda name: ended.get(name, float("inf")), default=None)
    return Watched(every, ended_by, first, stopped, halted=halted)
