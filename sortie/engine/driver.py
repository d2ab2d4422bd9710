"""One sortie, start to finish: up -> bootstrap -> train [-> recover -> train]* -> collect -> down.

The same orchestration drives every backend (`stacks/backend.py`):
- launch is all or nothing, retried per the backend's placements (zones, sites, on-demand);
- a node lost mid-run (machine gone, SSH dead, a job's preemption exit 75, a Slurm time limit)
  is replaced, bootstrapped, and training resumes from the newest checkpoint in the cluster's
  bucket, a bounded number of times, each recovery logged with the training time it cost;
- artifacts are collected and verified before teardown; if that fails the bucket is kept;
- teardown runs after success, failure, Ctrl-C and SIGTERM (a second signal cannot cut it);
- another controller may take over a sortie whose controller's heartbeat stopped (`watch.py`);
- a user's job (`sortie/engine/task.py`) is synced and set up on every node before launch."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path

from sortie.bootstrap import ssh, train, verified_copy
from sortie.bootstrap.checks import NodeFacts, facts_to_say, with_interfaces
from sortie.bootstrap.contract import interfaces_kept
from sortie.bootstrap.prepare import prepare
from sortie.bootstrap.ssh import connect_reachable
from sortie.core.errors import interruption
from sortie.core.inventory import Inventory, Node
from sortie.core.job import Job
from sortie.core.progress import PhaseEnd, Reporter, phase, shielded
from sortie.core.sizes import counted
from sortie.cost.money import usd_per_hour
from sortie.cost.price import Pricing
from sortie.cost.run_budget import Budget, BudgetSpent
from sortie.engine import health_gate
from sortie.engine.collection import stop_and_collect
from sortie.engine.health_gate import HealthGate
from sortie.engine.job_files import record_image
from sortie.engine.job_ready import pull_image, ready_user_job, record_packages
from sortie.engine.recovery import StepTracker, find_lost
from sortie.engine.request import Limits, RunRequest
from sortie.engine.run_record import record_run, remember_run, run_setup
from sortie.engine.task import UserJob
from sortie.rundir.history import State
from sortie.rundir.report import log_tail
from sortie.rundir.result import HEALTH_REASON, PhaseSpan, Recovery, RunResult
from sortie.stacks.backend import Backend, expected_of, launch, starting

SYNCED_LIST = ".synced-files"  # in the run's directory: what the workdir syncs sent
FAILURE_TAIL = 20  # lines of the first failing node's log shown when a job fails
WIND_DOWN_PHASES = ("stop", "collect", "down")  # run whatever the budget says


class Driver:
    """Drives one sortie from its launch (or a takeover) to its teardown: trains, recovers."""

    def __init__(self, backend: Backend, reporter: Reporter, request: RunRequest,
                 result: RunResult, job: Job, *, inventory: Inventory | None = None,
                 launched: bool = False, synced_list: Path | None = None,
                 conns: ssh.Connections | None = None) -> None:
        """Use an entry point: `to_launch`, `on_held_cluster` or `resume`."""
        self.backend, self.reporter, self.request, self.result = backend, reporter, request, result
        self.job, self.user_job = job, request.user_job
        self.secrets = request.user_job.secrets if request.user_job else {}
        # What the workdir syncs sent: with the run, or with a held cluster across `exec`s.
        self.synced_list = synced_list or result.artifacts / SYNCED_LIST
        self.node_facts: dict[str, NodeFacts] = {}  # what each node's check found
        self.tracker = StepTracker(reporter, result.recoveries, result.run_id)
        self.hung_on: list[str] = []  # the nodes a silent job waits for, once it is stopped
        self.inventory, self.conns = inventory, conns if conns is not None else ssh.Connections()
        self.launched = launched  # whether anything may have run on the nodes (collect, then)
        self.job_saved = launched  # whether the backend keeps the job (a takeover reads it)
        self.started, self.started_at = time.perf_counter(), time.time()
        self.ended_at: float | None = None  # once torn down: the cost is counted to here
        rate, most = request.pricing.usd_per_hour, request.limits.max_cost_usd  # from now on:
        self.budget = Budget(most, rate, lambda: backend.wind_down_s, self.started_at) \
            if most and rate else None

    # -- entry points ---------------------------------------------------------------------------

    @classmethod
    def to_launch(cls, backend: Backend, reporter: Reporter, request: RunRequest,
                  run_id: str) -> Driver:
        """`sortie run`: a new cluster of ``request.nodes``, which `up` launches."""
        result = RunResult(run_id=run_id, nodes=request.nodes,
                           ranks=request.nodes * request.procs_per_node,
                           artifacts=request.runs_dir / run_id)
        return cls(backend, reporter, request, result, request.job(run_id))

    @classmethod
    def on_held_cluster(cls, backend: Backend, name: str, inventory: Inventory,
                        reporter: Reporter, request: RunRequest, run_id: str,
                        state: Path) -> Driver:
        """`sortie exec`, `run --on`: a job on cluster NAME (``inventory``, as its caller read
        it), held or attached (its state in ``state``: the workdir sync carries over), on which
        nothing is replaced. Its node count is the inventory's, set here only."""
        nodes = len(inventory.nodes)
        request = replace(request, nodes=nodes, limits=replace(request.limits, max_recoveries=0))
        result = RunResult(run_id=run_id, nodes=nodes, cluster=name,
                           ranks=nodes * request.procs_per_node,
                           artifacts=request.runs_dir / run_id)
        return cls(backend, reporter, request, result, request.job(run_id), inventory=inventory,
                   synced_list=state / SYNCED_LIST)

    @classmethod
    def resume(cls, backend: Backend, reporter: Reporter, job: Job, inventory: Inventory,
               limits: Limits, runs_dir: Path | None = None, user_job: UserJob | None = None,
               conns: ssh.Connections | None = None,
               exit_codes: Mapping[str, int | None] | None = None,
               registry_password: str = "") -> Driver:
        """A sortie whose job another controller launched (`watch`, `reap`): its run goes to
        ``runs_dir``, by default the directory the job chose; ``user_job``, a user's job as
        recorded (`job_files.recorded_user_job`); ``conns`` and ``exit_codes``: what reap
        found on the nodes already; ``registry_password``, the password its image's
        `registry_auth` names, read by this controller."""
        runs_dir = runs_dir or Path(job.runs_dir)
        nodes = len(inventory.nodes)
        request = RunRequest(nodes=nodes, procs_per_node=job.procs_per_node, run_id=job.run_id,
                             runs_dir=runs_dir, user_job=user_job, limits=limits,
                             registry_auth=job.registry_auth,
                             registry_password=registry_password)
        result = RunResult(run_id=job.run_id, nodes=nodes, ranks=nodes * job.procs_per_node,
                           artifacts=runs_dir / job.run_id, exit_codes=dict(exit_codes or {}))
        return cls(backend, reporter, request, result, job, inventory=inventory, launched=True,
                   conns=conns)

    # -- phases ---------------------------------------------------------------------------------

    def up(self) -> None:
        """Launch the cluster (all or nothing); record the job for a controller taking over."""
        request, run_id = self.request, self.result.run_id
        with self.phase("up", starting(request.nodes, self.backend)):
            self.inventory = launch(self.backend, run_id, request.nodes,
                                    self.result.launch_failures, self.reporter,
                                    self.timeline_retry)
        launched = self.backend.launched_price(run_id)  # a fallback's price: what it costs
        if launched and launched[0] != request.pricing.usd_per_hour:
            self.request = replace(request, pricing=Pricing(*launched))
            self.reporter.info(f"launched at {usd_per_hour(launched[0])} ({launched[1]})")
            if self.budget is not None:
                self.budget.usd_per_hour = launched[0]
        self.backend.save_job(run_id, self.job)
        self.job_saved = True

    def connect(self, timeout_s: float) -> None:
        """Taking over: connect to every node that answers (pinned host keys)."""
        assert self.inventory is not None
        with self.phase("connect", "Taking over: SSH to every node (pinned host keys)"):
            self.conns = connect_reachable(self.inventory, timeout_s)

    @contextlib.contextmanager
    def phase(self, key: str, title: str) -> Iterator[PhaseEnd]:
        """A phase of this sortie, timed into ``result.phase_s[key]`` and onto its timeline.
        One that spends (not the wind-down's) starts only while the budget lasts."""
        if key not in WIND_DOWN_PHASES and (reason := self._spent()):
            raise BudgetSpent(reason)
        start, ok = time.perf_counter() - self.started, False
        try:
            with phase(self.reporter, title, self.result.phase_s, key) as end:
                yield end
            ok = end.ok
        except BudgetSpent:
            raise
        except Exception as exc:  # the run's record says what ended it, as the command does
            self.result.phase_failed = self.result.phase_failed or \
                (" ".join(str(exc).split()) or type(exc).__name__)[:1000]
            raise
        finally:
            self.result.timeline.append(PhaseSpan(key, start, time.perf_counter() - self.started,
                                                  ok))

    def timeline_retry(self, started: float, ended: float) -> None:
        """A failed launch attempt (perf_counter times), on the timeline within "up"."""
        self.result.timeline.append(PhaseSpan("launch retry", started - self.started,
                                              ended - self.started, ok=False))

    def bootstrap(self, title: str) -> None:
        """Connect to every node (pinned host keys), check it, install the trainer; say what
        the checks found to say (`facts_to_say`)."""
        assert self.inventory is not None
        wait = self.request.limits.ssh_wait(self.backend)
        if self.inventory.booted:  # nodes that boot: how long SSH may take them, and why
            title = f"{title} (SSH {wait.line()})"
        with self.phase("bootstrap", title):
            self.conns = prepare(self.inventory, wait.seconds, facts=self.node_facts)
            self.inventory = with_interfaces(self.inventory, self.node_facts)
        for note in facts_to_say(self.node_facts):
            self.reporter.note(note)

    @property
    def health(self) -> HealthGate:
        """The run's health gate (the instance type as launched: a fallback may change it)."""
        return HealthGate(self.request.limits.health, self.reporter, expected_of(self.backend))

    def check_health(self) -> None:
        """The health gate before training: check until every node is healthy, replacing bad
        ones (each a recovery) while recoveries are left; else stop there, naming them."""
        limits = self.request.limits
        if limits.health == "off" or self.inventory is None:
            return
        while True:
            with self.phase("health", f"Health check ({limits.health}): each node, then the "
                                      "network across them") as end:
                report = self.health.check(self.conns, self.inventory)
                end.ok = report.ok
            self.result.health = report
            if report.ok:
                return
            bad, done = list(report.bad), len(self.result.recoveries)
            if done >= limits.max_recoveries:
                raise health_gate.refusal(report, done, limits.max_recoveries)
            failed_at = time.perf_counter()
            with self.phase("recover", f"Replacing {', '.join(bad)}: {HEALTH_REASON}"):
                self.replace_nodes(bad, ready=False)
            self.result.recoveries.append(Recovery(
                lost=bad, reason=HEALTH_REASON, failed_at_step=None, failed_at=failed_at,
                step_s=0.0, detail="; ".join(f"{n}: {why}" for n, why in report.bad.items())))

    def ready_user_job(self, nodes: list[Node] | None = None) -> None:
        """The job's image, then the user's job, ready on every node (or the replaced ones)
        (`job_ready.py`)."""
        if self.inventory is None:
            return
        targets, before = nodes or self.inventory.nodes, self.job
        if self.job.image:
            self.job = pull_image(self.conns, targets, self.job, self.result, self.phase,
                                  self.reporter, self.request.registry_password)
            if self.job.image and self.job.image != before.image:
                record_image(self.request, self.result, self.job.image)
        if self.user_job is not None:
            self.job = ready_user_job(self.conns, self.inventory, targets, self.job,
                                      self.user_job, self.result, self.node_facts,
                                      self.synced_list, self.phase, self.reporter, not nodes)
            if not self.job.image:  # (an image's digest pins its packages)
                record_packages(self.conns, self.inventory, targets, self.result,
                                self.reporter, self.request.repeats)
        if self.job_saved and self.job != before:  # a takeover relaunches the same images
            self.backend.save_job(self.result.run_id, self.job)

    def train(self, launch: bool = True) -> None:
        """Train until done, failed for good, or out of recoveries (``launch`` False: the first
        attempt already runs, a takeover's)."""
        assert self.inventory is not None
        while True:
            with self.phase("train", f"Training: {counted(self.result.ranks, 'rank')} on "
                                     f"{counted(len(self.inventory.nodes), 'node')}") as end:
                self.launched, attempt_started = True, time.perf_counter()
                self.tracker.started()
                if launch:
                    if (shared := self.backend.shared_ports()) is not None:  # (taken since?)
                        self.inventory = shared.rendezvous_for_launch(self.inventory)
                    # A torchrun started after teardown read the node's pid file would be out of
                    # its reach: let launches already sent finish (each is bounded) first.
                    with shielded(self.reporter, "interrupted: stopping once torchrun is "
                                                 "launched"):
                        train.launch_all(self.conns, self.inventory, self.job,
                                         self.secrets)
                launch = True
                watched = train.watch_all(self.conns, self.inventory, self.job.run_id,
                                          self.tracker, halt=self._halt)
                self.result.exit_codes, self.result.ended_by = watched.codes, watched.ended_by
                if not self.result.budget_reached:
                    self.result.hung = watched.halted
                self.result.first_failed, self.result.stopped = watched.first_failed, \
                    watched.stopped
                end.ok = self.result.trained
            if self.result.trained or not self._recover(attempt_started):
                return

    def _halt(self) -> tuple[str, float] | None:
        """Why to stop the job while it runs, and the grace its ranks get: its budget is spent
        (time to save a checkpoint), or it is silent, waiting on a node the others cannot reach
        (a hung job saves nothing: a short one)."""
        if spent := self._spent():
            return spent, train.STOP_GRACE_S
        if stalled := self.tracker.stalled(self.request.limits.hang_timeout_s):
            assert self.inventory is not None  # a job runs
            self.hung_on = self.health.hung_on(self.conns, self.inventory, stalled)
            if self.hung_on:
                return stalled, train.HUNG_STOP_GRACE_S
            self.tracker.last_line_at = time.monotonic()  # left running: asked again later
        return None

    def _spent(self) -> str | None:
        """Why the budget stops the run now (recorded), if it does."""
        if self.budget is not None and (reason := self.budget.check(self.reporter.note)):
            self.result.budget_reached = reason
            return reason
        return None

    def _recover(self, attempt_started: float) -> bool:
        """After a failed attempt, replace the lost nodes and bootstrap them. False when there
        is nothing to recover from (the training itself failed) or no recovery is left."""
        assert self.inventory is not None
        if self.result.budget_reached:
            return False  # stopped on purpose: nothing to recover
        failed_at = time.perf_counter()
        lost, reason = find_lost(self.backend, self.inventory, self.result)
        if self.result.hung and lost is None:
            lost, reason = self.hung_on, self.result.hung  # stopped for these nodes alone
        if lost is None:
            return False  # the training itself failed: recovering would fail the same way
        if len(self.result.recoveries) >= self.request.limits.max_recoveries:
            if lost:  # its loss ended the others' jobs: the failure is named by it, first
                self.result.first_failed = lost[0]
            done = len(self.result.recoveries)
            self.result.recovery_error = (
                f"{', '.join(lost) or 'training'} lost again ({reason}) after {done} "
                "recoveries; giving up" if self.request.limits.max_recoveries else
                f"{', '.join(lost) or 'training'} lost ({reason}); nodes of a held or attached "
                "cluster are not replaced")
            self.reporter.note(self.result.recovery_error)
            return False
        tracker = self.tracker
        steps_done = (tracker.last_step or 0) - (tracker.resumed_from or 0)
        recovery = Recovery(
            lost=lost, reason=reason, failed_at_step=tracker.last_step, failed_at=failed_at,
            step_s=(failed_at - attempt_started) / steps_done if steps_done > 0 else 0.0)
        with self.phase("recover", f"Recovering from {reason}: replacing "
                                   f"{', '.join(lost) or 'no node'}"):
            self.replace_nodes(lost)
        self.result.recoveries.append(recovery)
        tracker.pending = recovery
        return True

    def replace_nodes(self, lost: list[str], ready: bool = True) -> None:
        """New machines for ``lost`` (a Slurm allocation's: all), bootstrapped and given the job."""
        assert self.inventory is not None
        if not lost:
            return
        before = self.inventory
        self.inventory = interfaces_kept(self.backend.replace(self.inventory, lost), before)
        replaced = [n for n in self.inventory.nodes if n.name in lost or n != before.node(n.name)]
        for node in replaced:
            self.conns.drop(node.name)
        self.conns |= prepare(self.inventory, self.request.limits.ssh_wait(self.backend).seconds,
                              replaced, self.node_facts)
        self.inventory = with_interfaces(self.inventory, self.node_facts)
        if ready:
            self.ready_user_job(replaced)

    @contextlib.contextmanager
    def stoppable(self) -> Iterator[None]:
        """Around a run's phases: a budget spent between them ends them (`finish` collects);
        Ctrl-C or SIGTERM is recorded (so is each launched job not ended) and goes on up."""
        try:
            yield
        except BudgetSpent:
            pass
        except KeyboardInterrupt as exc:
            self.result.interrupted = interruption(exc)
            if self.launched and self.inventory:
                self.result.exit_codes = {node.name: self.result.exit_codes.get(node.name)
                                          for node in self.inventory.nodes}
            raise

    def finish(self, tear_down: bool = True, collect: bool = True) -> None:
        """Collect what the nodes and the bucket have (unless ``collect`` is False: the cluster
        went away meanwhile), then tear down (unless the cluster is held: `exec`); nothing
        interrupts it."""
        result = self.result
        result.last_step, self.tracker.quiet = self.tracker.last_step, True
        with shielded(self.reporter, "teardown in progress; it finishes in a few seconds"):
            # (A setup that ran, though nothing launched: its output, said to be kept, is.)
            if (self.launched or "setup" in result.phase_s) and self.inventory and collect:
                self._stop_and_collect(tear_down)
            self.conns.close()
            if tear_down:
                with self.phase("down", "Tearing down"):
                    keep = bool(result.collect_error) and self.launched
                    result.teardown = self.backend.down(result.run_id, keep_bucket=keep)
                    for kept in result.teardown.kept:
                        self.reporter.note(f"artifacts not verified: the cluster's bucket is "
                                           f"kept at {kept}")
            result.wall_s = time.perf_counter() - self.started
            self.ended_at = time.time()
            if self.budget is not None:  # what the ledger counts too: the same times
                result.spent_usd = round(self.budget.spent(self.ended_at), 4)
        result.read_summary()
        log = result.artifacts / verified_copy.LOGS_DIR / f"{result.first_failed}.log"
        if result.first_failed and not result.trained:
            result.failure_tail = log_tail(log, FAILURE_TAIL)
            result.last_step_line = self.tracker.finished_line()
        setup = run_setup(self.backend, self.request, self.job, self.inventory, self.started_at,
                          self.node_facts)
        record_run(setup, result, self.reporter, ran=self.launched)
        self.remember(ended=self.ended_at or time.time())

    def remember(self, ended: float | None = None, waiting: State | None = None) -> None:
        """The run in this controller's history: running (its directory claimed; or queued),
        then how it ended (`sortie runs`, `sortie jobs`)."""
        remember_run(self.backend, self.request, self.result, self.reporter, self.started_at,
                     ended, waiting)

    def _stop_and_collect(self, torn_down: bool) -> None:
        """Stop a job still running, collect and verify what the run made (best effort)."""
        assert self.inventory is not None
        stop_and_collect(self.inventory, self.conns, self.result, self.user_job,
                         self.request.limits, self.tracker.rank0_node, self.phase, self.reporter,
                         torn_down, launched=self.launched,
                         own_machines=self.inventory.booted and not self.backend.detaches)
