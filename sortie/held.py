"""Clusters held with `sortie up` (started and left running) or attached with `sortie attach`
(made elsewhere), for jobs run with `sortie exec` and `sortie run --on`."""

from __future__ import annotations

from dataclasses import replace

from bootstrap.inventory import Inventory
from bootstrap.prepare import prepare
from sortie.lifecycle import SYNCED_LIST, Driver, RunRequest, job_record, new_run_id
from sortie.outcome import RunResult
from sortie.progress import Reporter, phase
from sortie.registry import HeldBackend
from sortie.run_record import write_task
from stacks.local import LocalBackend
from stacks.naming import check_name


def exec_job(backend: HeldBackend, name: str, request: RunRequest,
             reporter: Reporter) -> RunResult:
    """`sortie exec`, `sortie run --on`: run a job (the user's, or the bundled trainer) on
    cluster NAME, held with `sortie up` or attached, and leave it running.
    The workdir sync and the setup cache carry over from one `exec` to the next; nothing is
    replaced (a held cluster has no recovery) and nothing is torn down."""
    inventory = backend.inventory(name)
    run_id = check_name(request.run_id) if request.run_id else new_run_id()
    result = RunResult(run_id=run_id, nodes=len(inventory.nodes),
                       ranks=len(inventory.nodes) * request.procs_per_node,
                       artifacts=request.runs_dir / run_id)
    driver = Driver(backend, reporter, replace(request, max_recoveries=0), result,
                    job_record(request, run_id))
    driver.inventory, driver.synced_list = inventory, backend.state_dir(name) / SYNCED_LIST
    write_task(request, result)
    try:
        with driver.phase("bootstrap", f"Connecting to {name}: SSH (pinned host keys), checks"):
            driver.conns = prepare(inventory, request.ssh_timeout_s, facts=driver.node_facts)
        driver.ready_user_job()
        driver.train()
    finally:
        driver.finish(tear_down=False)
    return result


def hold_cluster(nodes: int, name: str | None, reporter: Reporter) -> Inventory:
    """`sortie up`: start a local cluster and leave it running, held (never reaped)."""
    cluster_id = check_name(name) if name else new_run_id()
    with phase(reporter, f"Starting {nodes} local nodes"):
        return LocalBackend().up(cluster_id, nodes, held=True)
