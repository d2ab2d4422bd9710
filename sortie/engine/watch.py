"""Taking a running sortie over from a controller that is gone: `sortie watch`, and `reap`."""

from __future__ import annotations

from fabric import Connection

from bootstrap import ssh
from sortie.core.errors import SortieError, UsageError
from sortie.core.inventory import Inventory, Node
from sortie.core.progress import Reporter
from sortie.engine.driver import Driver
from sortie.engine.job_files import recorded_user_job
from sortie.engine.request import RunRequest
from sortie.rundir.result import RunResult
from stacks.backend import Backend
from stacks.records import heartbeat


def takeover(backend: Backend, name: str, reporter: Reporter, request: RunRequest,
             ssh_timeout_s: float = 30.0) -> Driver:
    """A driver for a running sortie another controller launched: this process becomes its
    controller, and connects to every node it can reach (pinned host keys)."""
    job = backend.load_job(name)
    if job is None:
        raise UsageError(f"NAME: sortie {name!r} has no training job to take over (a cluster "
                         "held with `sortie up`?)")
    user_job = recorded_user_job(job)  # before anything changes: it may refuse
    inventory = backend.inventory(name)
    driver = Driver.resume(backend, reporter, job, inventory, request, user_job=user_job)
    backend.claim(name)
    with driver.phase("connect", "Taking over: SSH to every node (pinned host keys)"):
        driver.conns = connect_reachable(inventory, ssh_timeout_s)
    return driver


def watch_sortie(backend: Backend, name: str, reporter: Reporter,
                 request: RunRequest) -> RunResult:
    """Take over a running sortie: stream its logs, wait for it, recover lost nodes, collect,
    tear down, exactly as `run_sortie` would have."""
    driver: Driver | None = None
    with heartbeat(lambda: backend.claim(name)):
        try:
            driver = takeover(backend, name, reporter, request)
            driver.train(launch=False)
        finally:
            if driver is not None:
                driver.finish()
    assert driver is not None
    return driver.result


def connect_reachable(inventory: Inventory, timeout_s: float) -> dict[str, Connection]:
    """Open connections to the nodes that answer within ``timeout_s`` (pinned host keys)."""
    def attempt(node: Node) -> Connection | None:
        try:
            return ssh.wait_for_ssh(node, timeout_s)
        except SortieError:
            return None

    conns = ssh.on_all(inventory.nodes, attempt)
    return {node.name: conn for node, conn in zip(inventory.nodes, conns, strict=True)
            if conn is not None}
