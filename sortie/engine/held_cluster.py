"""Clusters held with `sortie up` (started and left running: local nodes, or a cloud stack with
`--stack`) or attached with `sortie attach` (made elsewhere), for jobs run with `sortie exec` and
`sortie run --on`."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from sortie.bootstrap.cluster_lock import lock_cluster, said_word
from sortie.bootstrap.prepare import prepare
from sortie.core.errors import Interrupted, UsageError
from sortie.core.inventory import Inventory
from sortie.core.progress import Reporter, phase, shielded
from sortie.cost.price import Pricing
from sortie.engine.driver import Driver
from sortie.engine.job_files import write_task
from sortie.engine.launch import refuse_used_run_dir
from sortie.engine.request import Limits, RunRequest, new_run_id
from sortie.engine.task import Task
from sortie.fleet.held_state import record_last_run, went_during
from sortie.rundir.result import RunResult
from sortie.stacks.backend import Backend, HeldLimits, Teardown, launch, starting
from sortie.stacks.records import heartbeat

# What a task says about the cluster it makes: a held or attached cluster is made already.
NEW_CLUSTER_FIELDS = ("name", "stack", "overrides")


def for_held_cluster(task: Task, nodes: int, cluster: str) -> tuple[Task, list[str]]:
    """``task`` as `exec` runs it on a cluster of ``nodes`` nodes: without the fields that only
    make a new cluster (the names of those it had come second, to be told), and refused when it
    asks for another number of nodes."""
    if task.nodes is not None and task.nodes != nodes:
        raise UsageError(f"nodes: {task.nodes}: cluster {cluster} has {nodes} "
                         f"node{'s' if nodes != 1 else ''}; leave `nodes` out or match it")
    given = [field for field in NEW_CLUSTER_FIELDS if getattr(task, field)]
    ignored = [Task.model_fields[field].alias or field for field in given]
    return task.model_copy(update={field: Task.model_fields[field].default
                                   for field in given}), ignored


CLOUD_IDLE_MIN_MINUTES = 5  # a node counts from boot: booting and the checks must fit


def exec_job(backend: Backend, name: str, inventory: Inventory, request: RunRequest,
             reporter: Reporter, queue: bool = True) -> RunResult:
    """`sortie exec`, `sortie run --on`: run a job (the user's, or the bundled trainer) on
    cluster NAME (its ``inventory`` as read once by the caller), held with `sortie up` or
    attached, and leave it running. The workdir sync and the setup cache carry over from one
    `exec` to the next; nothing is replaced (a held cluster has no recovery) and nothing is
    torn down. A cluster busy with another job: with ``queue``, this one waits its turn
    (first come, first served, with every other exec waiting on the cluster's head), else it
    is refused."""
    started, state = time.time(), backend.state_dir(name)
    run_id = request.run_id or new_run_id()
    driver = Driver.on_held_cluster(backend, name, inventory, reporter, request, run_id,
                                    state)
    result = driver.result
    refuse_used_run_dir(result.artifacts)
    write_task(driver.request, result)
    driver.remember()
    try:
        with driver.stoppable():
            driver.bootstrap(f"Connecting to {name}: {backend.ssh_wait.via}, checks")
            # One job at a time: locked before the health check; held until this function
            # returns (the lock lives as long as its channel).
            assert driver.inventory is not None  # (bootstrapped: its nodes are known)
            lock = lock_cluster(driver.conns, driver.inventory.nodes, run_id,  # noqa: F841
                                name, _waiting(driver, name) if queue else None)
            driver.remember()  # running (it may have been queued)
            record_last_run(state, run_id)  # `sortie logs NAME` follows it
            driver.check_health()
            driver.ready_user_job()
            driver.train()
    finally:
        # Say so when `sortie down` took the cluster away meanwhile; its job's directories on
        # the nodes are going with it: collecting them would race their removal.
        if not result.trained and went_during(state, started):
            result.cluster_went = "detached" if backend.detaches else "torn down"
        driver.finish(tear_down=False, collect=result.cluster_went is None)
        if result.interrupted:  # replaces the interruption in flight, saying what became of it
            raise Interrupted(result.interrupted, [
                "the job was stopped" if driver.launched else "the job was not launched "
                "(a setup running was stopped)",
                f"cluster {name} is still up (`sortie down {name}` ends it)",
                *result.where_recorded()]) from None  # noqa: B012
    return result


def _waiting(driver: Driver, name: str) -> Callable[[str], None]:
    """What a queued exec says as its place changes (the head's line: ``queued PLACE RUN``,
    ``waiting job RUN``, ``waiting setup NODE``), and its history entry: queued."""
    run_id = driver.result.run_id

    def said(line: str) -> None:
        words = [said_word(word) for word in line.split()]
        if words[0] == "queued" and len(words) > 1:
            holder = f"run {words[2]}" if len(words) > 2 else "another exec"
            driver.reporter.note(
                f"{name} is busy with {holder}: queued, number {words[1]} in line (`sortie jobs "
                f"{name}` lists the queue; `sortie cancel {name} {run_id}` leaves it)")
        else:  # a job or setup left running by a controller that is gone
            driver.reporter.note(f"{name}: waiting for {' '.join(words[1:3])} to end (left "
                                 "running by a controller that is gone)")
        driver.remember(waiting="queued")
    return said


CHECKING = "Checking every node: {via}, python, torch"


def _check_nodes(backend: Backend, inventory: Inventory, reporter: Reporter,
                 ssh_timeout_s: float | None) -> None:
    """Every node reached (pinned host keys) and checked, waiting for SSH as long as the
    backend's nodes take (`Limits.ssh_wait`), said in the phase's line."""
    wait = Limits(ssh_timeout_s=ssh_timeout_s).ssh_wait(backend)
    over_ssh = not inventory.nodes[0].srun  # (a Slurm node's steps wait for nothing)
    with phase(reporter, CHECKING.format(via=wait.via) + (f" (SSH {wait.line()})"
                                                          if over_ssh else "")):
        prepare(inventory, wait.seconds).close()


def hold_cluster(backend: Backend, nodes: int, name: str | None,
                 reporter: Reporter, ssh_timeout_s: float | None = None,
                 watch: HeldLimits | None = None) -> Inventory:
    """`sortie up`: start a cluster and leave it running, held by no controller.

    Local nodes are never reaped. A cloud cluster (`--stack`) is launched like `sortie run`'s
    (all or nothing, per the profile's placements; the TTL armed on every node), then every
    node is checked over SSH (pinned host keys); a failure or an interruption before it is held
    destroys it, with proof. `sortie down` destroys it; past its TTL `sortie reap` does.
    ``name`` was checked where it came in (`up --name`, by `launch_target`). With
    ``watch``, a local cluster tears itself down once idle that long or out of budget; a cloud
    cluster's nodes power themselves off once idle (`sortie reap` destroys the rest)."""
    cluster_id = name or new_run_id()
    if (local := backend.watchdog()) is not None:  # local nodes, their watchdog beside them
        # Driven by this process until held, as a cloud's: killed half-way (booting), the
        # cluster is an orphan `sortie reap` ends, not one "up" for ever.
        backend.reserve(cluster_id)
        with heartbeat(lambda: backend.claim(cluster_id)):
            with phase(reporter, starting(nodes, backend)):
                inventory = local.up(cluster_id, nodes, watch=watch)
            if inventory.booted:  # booted local nodes: held once booted and checked
                try:
                    _check_nodes(backend, inventory, reporter, ssh_timeout_s)
                except BaseException:
                    backend.down(cluster_id)
                    raise
        backend.hold(cluster_id)
        return inventory
    if watch is not None and watch.idle_s is not None:
        minutes = math.ceil(watch.idle_s / 60)
        if minutes < CLOUD_IDLE_MIN_MINUTES:
            raise UsageError(f"--idle-stop: a cloud cluster's is at least "
                             f"{CLOUD_IDLE_MIN_MINUTES}m (its nodes count it from boot)")
        timers = backend.node_timers()
        if timers is None:
            raise UsageError("--idle-stop: this cluster's nodes keep no idle timer of their own")
        timers.idle_stop(minutes)
    backend.reserve(cluster_id)  # lost to another sortie: nothing of it is touched
    try:
        # Driven by this process until it is held: killed half-way, `sortie reap` ends it.
        with heartbeat(lambda: backend.claim(cluster_id)):
            with phase(reporter, starting(nodes, backend)):
                inventory = launch(backend, cluster_id, nodes, [], reporter)
            _check_nodes(backend, inventory, reporter, ssh_timeout_s)
        backend.hold(cluster_id)
        return inventory
    except BaseException:
        _destroy_unheld(backend, cluster_id, reporter)
        raise


MAX_HELD_S = 1e9  # ~31 years: a budget that lasts longer holds nothing back


def held_limits(backend: Backend, idle_stop_s: float | None,
                max_usd: float | None, pricing: Pricing) -> HeldLimits | None:
    """What ends a held local cluster by itself: idle that long, or its budget spent at its
    (notional) price. A cloud cluster's budget is its TTL, cut at launch."""
    rate = pricing.usd_per_hour
    budget_s = min(MAX_HELD_S, max(1.0, max_usd / rate * 3600 - backend.wind_down_s)) \
        if max_usd and rate and backend.watchdog() is not None else None
    return HeldLimits(idle_s=idle_stop_s, budget_s=budget_s) if idle_stop_s or budget_s \
        else None


def _destroy_unheld(backend: Backend, cluster_id: str, reporter: Reporter) -> Teardown:
    """A cloud cluster that failed before it was held goes, whatever stopped the `up`: a
    launch that failed in every placement leaves an empty stack and its record."""
    with shielded(reporter, "interrupted: destroying the cluster first"), \
            phase(reporter, f"Tearing down {cluster_id}: it never became usable"):
        report = backend.down(cluster_id)
    reporter.note(report.summary())
    return report


def held_pricing(backend: Backend, name: str, nodes: int, max_cost: float | None) -> Pricing:
    """A job on held cluster ``name``: counted at the price the cluster has (a cloud's
    estimate; local nodes' notional price, as fixed when it started)."""
    return Pricing.at_launch(backend.launch_cost(nodes),
                             lambda: backend.notional_price(nodes, held=name), max_cost)
