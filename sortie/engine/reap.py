"""`sortie reap`: end the sorties whose controller is gone, without losing their run.

A sortie whose controller died (SIGKILL, a laptop asleep: its heartbeat went stale) is adopted,
not simply torn down:
- while its job still makes progress (its log or metrics grew within the hang timeout) it is left
  running: the TTL bounds a cloud sortie's cost, and `sortie watch` can take it over;
- once the job has ended (every node recorded an exit code), or has hung, or its nodes are gone
  (past a cloud TTL, or its backend says so: no answer over SSH alone is no proof), reap stops
  what still runs, collects and verifies the artifacts into the
  run's directory (or keeps the bucket and says where), and tears down with proof.
Kept buckets, held clusters and attached ones are never touched, but for a cloud cluster held
past its TTL (`sortie up --stack`), or held with `--idle-stop` past its idle limit with no node
answering SSH: its nodes have shut down, and reap destroys the rest. One sortie's failure never
stops the others.
"""

from __future__ import annotations

from pathlib import Path

import pydantic
from pydantic import Field, computed_field

from sortie.bootstrap import ssh, train
from sortie.bootstrap.ssh import connect_reachable
from sortie.core.errors import SortieError, first_line
from sortie.core.inventory import Inventory
from sortie.core.progress import QuietReporter
from sortie.cost.ledger import record_cost
from sortie.engine.driver import Driver
from sortie.engine.job_files import recorded_user_job
from sortie.engine.launch import run_cost
from sortie.engine.request import Limits
from sortie.fleet.registry import backend_for, survey, teardown
from sortie.rundir import history
from sortie.rundir.result import RunResult
from sortie.stacks.backend import Backend, Teardown
from sortie.stacks.cloud.access import DEFAULT_ACCESS, CloudAccess
from sortie.stacks.kinds import kind_named
from sortie.stacks.listing import REAPED_STATES, Seen
from sortie.stacks.records import heartbeat

DEFAULT_HANG_TIMEOUT_S = 30 * 60.0
PROBE_TIMEOUT_S = 10.0  # a node that does not answer this fast counts as gone


@pydantic.dataclasses.dataclass
class Reaped:
    """What reap did with one sortie (`--json`: its serialisation, with the run's artifacts
    directory, how many files were collected and why collection failed, not the whole run)."""

    name: str
    # "left running", "torn down", "watchdog restarted", "failed", "would reap" (dry run)
    action: str
    line: str  # one line for the terminal
    teardown: Teardown | None = None
    result: RunResult | None = Field(default=None, exclude=True)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def artifacts(self) -> Path | None:
        return self.result.artifacts if self.result else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def collected(self) -> int:
        return len(self.result.collected) if self.result else 0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def collect_error(self) -> str | None:
        return self.result.collect_error if self.result else None

    @property
    def ok(self) -> bool:
        return self.action != "failed" and (self.teardown is None or self.teardown.clean)


def reap(home: Path, access: CloudAccess = DEFAULT_ACCESS, dry_run: bool = False,
         hang_timeout_s: float = DEFAULT_HANG_TIMEOUT_S) -> list[Reaped]:
    """Adopt every orphaned or expired sortie this controller can see (and, in the state
    backend, those of other controllers); report damaged ones. A local cluster whose start was
    cut short while its controller lives (or that is held) is left alone."""
    done = []
    for seen in survey(home, access, elsewhere=True):
        row = seen.row
        if not kind_named(seen.kind).own:
            continue  # not created by sortie: only `sortie down` detaches it
        if row.state == "broken" and (seen.kind != "local" or "damaged" in (row.detail or "")):
            done.append(Reaped(row.name, "failed", f"{row.name}: not reaped: {row.detail}"))
        elif row.state in REAPED_STATES:
            done.append(Reaped(row.name, "would reap", f"{row.name}: {row.state}, would be "
                               "adopted: collected if its job ended or hung, then torn down")
                        if dry_run else _adopt(home, seen, hang_timeout_s, access))
        elif row.unwatched:
            done.append(_watch_again(home, seen, access, dry_run))
        elif idle_limit_passed(seen) and (stopped := _idle_stopped(home, seen, access,
                                                                    dry_run)):
            done.append(stopped)
    return done


def _watch_again(home: Path, seen: Seen, access: CloudAccess, dry_run: bool) -> Reaped:
    """A held local cluster whose watchdog is gone: a new one holds its limits (a budget
    already spent, or an idle limit passed, ends the cluster at its first look)."""
    name = seen.row.name
    if dry_run:
        return Reaped(name, "would reap", f"{name}: its watchdog is gone, would be restarted")
    try:
        local = backend_for(home, seen, access).watchdog()
        if local is None:
            raise SortieError("its backend keeps no watchdog")
        local.start_watchdog(name)
    except (SortieError, OSError) as exc:
        return Reaped(name, "failed", f"{name}: its watchdog is gone and could not be "
                      f"restarted ({exc})")
    return Reaped(name, "watchdog restarted", f"{name}: its watchdog was gone: restarted "
                  "(its idle stop and budget are enforced again)")


def idle_limit_passed(seen: Seen) -> bool:
    """A cloud cluster held with `--idle-stop`, up for longer than its idle limit: its nodes
    may have powered themselves off."""
    record = seen.record
    minutes = record.idle_stop_minutes if record and record.held else None
    return seen.row.state == "up" and minutes is not None and seen.row.age_s >= minutes * 60


def _idle_stopped(home: Path, seen: Seen, access: CloudAccess, dry_run: bool) -> Reaped | None:
    """A held cloud cluster whose nodes all stopped answering SSH after its idle limit: they
    powered themselves off (the idle stop), and reap destroys the rest. None while any
    answers."""
    name = seen.row.name
    try:
        backend = backend_for(home, seen, access)
        conns = connect_reachable(backend.inventory(name), PROBE_TIMEOUT_S)
    except SortieError as exc:
        return Reaped(name, "failed", f"{name}: idle stop not checked ({exc})")
    if conns:
        conns.close()
        return None
    # No answer from here is no proof (a changed address, a blip, this machine's own network):
    # the cloud itself must say every machine is stopped before anything is destroyed.
    try:
        timers = backend.node_timers()
        if timers is None:
            raise SortieError("its nodes keep no idle timer")
        running = timers.machines_running(name)
    except SortieError as exc:
        return Reaped(name, "failed", f"{name}: no node answers SSH, but its idle stop is not "
                      f"confirmed ({exc}): left as it is")
    if running:
        return Reaped(name, "left running", f"{name}: no node answers SSH from here, but the "
                      f"cloud says {len(running)} of its machines still run: left as it is")
    if dry_run:
        return Reaped(name, "would reap", f"{name}: idle-stopped (every machine stopped, says "
                      "the cloud), would be torn down")
    report = backend.down(name)
    return Reaped(name, "torn down", f"{name}: idle-stopped: held with --idle-stop, its nodes "
                  f"powered themselves off (none answers SSH, every machine stopped, says the "
                  f"cloud); {report.summary()}", report)


def _adopt(home: Path, seen: Seen, hang_timeout_s: float, access: CloudAccess) -> Reaped:
    name = seen.row.name
    try:
        backend = backend_for(home, seen, access)
        # Another controller's record is not ours to trust with a path: its run is collected
        # under this controller's own $SORTIE_HOME/runs/, never where the record says.
        runs_dir = home / "runs" if seen.kind == "elsewhere" else None
        return adopt(backend, name, hang_timeout_s, expired=seen.row.state == "expired",
                     runs_dir=runs_dir)
    except SortieError as exc:
        report = teardown(home, seen, access)
        return Reaped(name, "failed" if not report.clean else "torn down",
                      f"{name}: could not adopt it ({exc}); {report.summary()}", report)


def adopt(backend: Backend, name: str, hang_timeout_s: float, expired: bool = False,
          runs_dir: Path | None = None) -> Reaped:
    """Take one orphaned sortie over: leave it running while its job progresses (never past its
    TTL), else collect (into ``runs_dir``, default the one its job chose) and tear down."""
    job = backend.load_job(name)
    try:
        inventory = backend.inventory(name) if job else None
    except SortieError:
        inventory = None
    if job is None or inventory is None:  # its `up` never finished: nothing ran to collect
        report = backend.down(name)
        return Reaped(name, "torn down", f"{name}: nothing was trained on it; "
                      f"{report.summary()}", report)
    conns = connect_reachable(inventory, PROBE_TIMEOUT_S)
    nodes = [n for n in inventory.nodes if n.name in conns]
    if not nodes and not expired:
        # No answer from here is no proof (a blip, a busy sshd, this machine's network): the
        # backend must say the machines are gone before a job that may still train is ended.
        unproven = _machines_not_gone(backend, inventory)
        if unproven:
            return Reaped(name, "left running", f"{name}: its controller is gone and no node "
                          f"answers SSH from here within {PROBE_TIMEOUT_S:.0f}s, but {unproven}:"
                          f" left as it is (`sortie watch {name}` takes it over; `sortie down "
                          f"{name}` ends it)")
    states = dict(zip([n.name for n in nodes], ssh.on_all(
        nodes, lambda n: train.progress(conns[n.name], n, name)), strict=True))
    codes = {node: code for node, (code, _idle) in states.items() if code is not None}
    idle = [idle for _code, idle in states.values() if idle is not None]
    if not expired and nodes and len(codes) < len(inventory.nodes) and idle and \
            min(idle) <= hang_timeout_s:
        conns.close()
        return Reaped(name, "left running", f"{name}: its controller is gone but it still "
                      f"trains (last output {min(idle):.0f}s ago): left running; `sortie watch "
                      f"{name}` takes it over, reap ends it once it is done or hung")
    why = ("its job ended" if nodes and len(codes) == len(inventory.nodes) else
           "past its TTL" if expired and nodes else
           f"no output for {min(idle):.0f}s" if idle else "its nodes are gone")
    driver = Driver.resume(backend, QuietReporter(), job, inventory, Limits(), runs_dir,
                           recorded_user_job(job, relaunch=False), conns, codes)
    with heartbeat(lambda: backend.claim(name)):
        driver.finish()
    # Its controller died before its cost line: kept now, from when the run began (issue 67:
    # reaped runs were missing from the ledger).
    began = history.find_run(backend.home, name, made=False)
    cost = run_cost(driver)
    record_cost(backend.home, cost.model_copy(update={"started": min(
        cost.started, began.started if began else cost.started)}), backend.backend_url)
    result = driver.result
    collected = (f"collected {len(result.collected)} files into {result.artifacts} (SHA-256 "
                 "verified)" if not result.collect_error else
                 f"artifacts NOT verified ({result.collect_error})")
    assert result.teardown is not None
    return Reaped(name, "torn down", f"{name}: adopted ({why}); {collected}; "
                  f"{result.teardown.summary()}", result.teardown, result)


def _machines_not_gone(backend: Backend, inventory: Inventory) -> str:
    """Why the nodes of a sortie none of which answers may still run ("" once the backend says
    every one is gone)."""
    try:
        lost = backend.lost_nodes(inventory).nodes
    except Exception as exc:  # noqa: BLE001 - a cloud, Slurm or CLI error: nothing proven
        return f"whether its machines are gone could not be asked ({first_line(exc)})"
    alive = [n.name for n in inventory.nodes if n.name not in lost]
    return f"{', '.join(alive)} still there, says its backend" if alive else ""
