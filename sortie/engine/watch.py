"""Taking a running sortie over from a controller that is gone: `sortie watch`, and `reap`."""

from __future__ import annotations

from sortie.core.errors import UsageError
from sortie.core.progress import Reporter
from sortie.engine.driver import Driver
from sortie.engine.job_files import recorded_user_job
from sortie.engine.request import Limits
from sortie.engine.task import registry_password
from sortie.rundir.result import RunResult
from sortie.stacks.backend import Backend
from sortie.stacks.records import heartbeat


def takeover(backend: Backend, name: str, reporter: Reporter, limits: Limits,
             ssh_timeout_s: float = 30.0) -> Driver:
    """A driver for a running sortie another controller launched: this process becomes its
    controller, and connects to every node it can reach (pinned host keys)."""
    job = backend.load_job(name)
    if job is None:
        raise UsageError(f"NAME: sortie {name!r} has no training job to take over (a cluster "
                         "held with `sortie up`?)")
    user_job = recorded_user_job(job)  # before anything changes: it may refuse
    password = registry_password(job.registry_auth)  # a replaced node pulls its image
    driver = Driver.resume(backend, reporter, job, backend.inventory(name), limits,
                           user_job=user_job, registry_password=password)
    backend.claim(name)
    driver.connect(ssh_timeout_s)
    return driver


def watch_sortie(backend: Backend, name: str, reporter: Reporter,
                 limits: Limits) -> RunResult:
    """Take over a running sortie: stream its logs, wait for it, recover lost nodes, collect,
    tear down, exactly as `run_sortie` would have."""
    driver: Driver | None = None
    with heartbeat(lambda: backend.claim(name)):
        try:
            driver = takeover(backend, name, reporter, limits)
            driver.train(launch=False)
        finally:
            if driver is not None:
                driver.finish()
    assert driver is not None
    return driver.result
