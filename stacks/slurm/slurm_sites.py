"""The Slurm clusters a controller may allocate on (`sortie attach NAME --slurm`), each recorded
in ``$SORTIE_HOME/slurm/<name>/site.json``: where its sorties work on the shared file system,
the nodes' Python, and what a GPU-hour costs per partition."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from pathlib import Path

from pydantic import BaseModel, Field

from sortie.core import naming, statefile
from sortie.core.errors import UsageError
from sortie.core.inventory import LoginHost, NodePath, NodeProgram
from sortie.stacks.slurm import slurm_queue as queue
from sortie.stacks.slurm.slurm_queue import SlurmQueue

SITES, SITE_FILE = "slurm", "site.json"
ALLOCATION_FILE = "allocation.json"  # in a sortie's state directory (`Allocation`)


class SlurmSite(BaseModel):
    """A Slurm cluster sortie may allocate on (`sortie attach NAME --slurm`)."""

    name: str
    shared_dir: str  # where each sortie's workdir is made: seen by the login and every node
    python: NodeProgram = "python3"  # the nodes' Python with torch (a venv on the shared disk)
    usd_per_gpu_hour: dict[str, float] = Field(default_factory=dict)  # by partition; else 0
    attached_at: float
    login: LoginHost | None = None  # reached over SSH (None: this machine is its login node)


DEFAULT_PARTITION = "default"  # the price key of the cluster's default partition


class GpuHourPrice(BaseModel):
    """An allocation's price: GPU-hours at the $ its partition's GPU-hour costs, as the user
    set it when attaching the cluster."""

    usd_per_gpu_hour: float = Field(gt=0, lt=1e6, allow_inf_nan=False)
    gpus: int = Field(ge=1)
    partition: str

    @property
    def usd_per_hour(self) -> float:
        return self.usd_per_gpu_hour * self.gpus

    @property
    def terms(self) -> str:
        return f"${self.usd_per_gpu_hour:g} per GPU-hour ({self.partition}, as attached)"


@dataclass(frozen=True)
class SlurmAsk:
    """What one allocation asks of Slurm (`sortie run --slurm`)."""

    partition: str | None = None  # one, or several ("gpu,debug": whichever starts it first)
    gpus_per_node: int = 0
    time: str | None = None  # Slurm's own format: "2:00:00", "2-0", "90"
    account: str | None = None
    qos: str | None = None
    mem: str | None = None  # per node, Slurm's format: "64G", "500M"
    cpus_per_task: int = 0  # (one task a node: the node's CPUs; 0: see `with_cpus_for`)
    exclusive: bool = False
    constraint: str | None = None  # node features: "a100&ib"
    reservation: str | None = None
    exclude: str | None = None  # nodes never to use: "n[3-4],gpu7"
    extra: tuple[str, ...] = ()  # `--sbatch-arg`s, passed through (checked: `slurm_options`)

    def with_cpus_for(self, ranks_per_node: int, node_cpus: int | None) -> SlurmAsk:
        """The ask with CPUs for ``ranks_per_node`` ranks and the agent (torchrun) when none
        were asked, as many as the partition's smallest node has at most: a site that counts
        memory per CPU (`DefMemPerCPU`) gives one CPU's worth otherwise, and the ranks were
        killed for it."""
        if self.cpus_per_task or not ranks_per_node:
            return self
        wanted = ranks_per_node + 1
        return replace(self, cpus_per_task=min(wanted, node_cpus) if node_cpus else wanted)

    def options(self, nodes: int) -> list[str]:
        given = (("partition", self.partition), ("time", self.time),
                 ("account", self.account), ("qos", self.qos), ("mem", self.mem),
                 ("constraint", self.constraint), ("reservation", self.reservation),
                 ("exclude", self.exclude))
        return [f"--nodes={nodes}", "--ntasks-per-node=1",
                *([f"--gres=gpu:{self.gpus_per_node}"] if self.gpus_per_node else []),
                *([f"--cpus-per-task={self.cpus_per_task}"] if self.cpus_per_task else []),
                *(["--exclusive"] if self.exclusive else []),
                *(f"--{flag}={value}" for flag, value in given if value), *self.extra]


@dataclass(frozen=True)
class SlurmRequest:
    """`--slurm NAME` and what it asks: the cluster, and the allocation."""

    site: str
    ask: SlurmAsk
    queue_timeout_s: float | None = None  # how long it may wait in the queue (None: no limit)
    ranks_per_node: int = 0  # what `run` starts on each node (its CPU default; `up`: 0)


def held_time_limit(asked: str | None, usd_per_hour: float, max_usd: float,
                    wind_down_s: float) -> str:
    """A held allocation's time limit (Slurm's format) cut to what ``max_usd`` buys at
    ``usd_per_hour``, less the wind-down, in whole minutes; ``asked`` where it is shorter
    (never lengthened). An unpriced allocation is counted at $0: it never spends a budget."""
    minutes = int((max_usd / usd_per_hour * 3600 - wind_down_s) // 60)
    if minutes < 1:
        raise UsageError(f"--max-cost: ${max_usd:g} buys under a minute of this allocation "
                         f"at ${usd_per_hour:g}/h, Slurm's least time limit")
    given = queue.time_limit_s(asked) if asked else 0.0
    return asked if asked and given and given <= minutes * 60 else str(minutes)


def gpu_hour_price(site: SlurmSite, ask: SlurmAsk, nodes: int) -> GpuHourPrice | None:
    """``nodes`` of the ask's partition at the $ per GPU-hour ``site`` was attached with."""
    partition = ask.partition or DEFAULT_PARTITION
    rate, gpus = site.usd_per_gpu_hour.get(partition, 0.0), nodes * ask.gpus_per_node
    return GpuHourPrice(usd_per_gpu_hour=rate, gpus=gpus, partition=partition) \
        if rate and gpus else None


def unpriced_note(site: SlurmSite, ask: SlurmAsk, nodes: int) -> str | None:
    """What is said before launch when the allocation has no price (counted at $0)."""
    if gpu_hour_price(site, ask, nodes) is not None:
        return None
    partition = ask.partition or DEFAULT_PARTITION
    return (f"no $ per GPU-hour for partition {partition} of {site.name}: counted at $0 "
            f"(`sortie attach {site.name} --slurm --usd-per-gpu-hour {partition}=USD` sets one)")


OLDEST_SLURM = (20, 11)  # steps that share the allocation's CPUs: `srun --overlap`


def too_old(version_said: str) -> str | None:
    """Why the Slurm that said ``version_said`` (`sinfo --version`: "slurm 22.05.8") cannot
    run sortie's steps; None when it can, or when it said no version sortie reads."""
    found = re.search(r"\b(\d{2})\.(\d{2})\.\d+", version_said)
    if found is None or (int(found[1]), int(found[2])) >= OLDEST_SLURM:
        return None
    return (f"Slurm {found[0]} is older than 20.11: sortie's job steps share the allocation "
            "(`srun --overlap`), which it lacks")


class SlurmSites:
    """The Slurm clusters this controller has attached, by name."""

    def __init__(self, home: Path) -> None:
        self.home, self.directory = home, home / SITES

    def names(self) -> list[str]:
        return naming.names_in(self.directory)

    def attach(self, name: str, shared_dir: str | None, python: str = "python3",
               usd_per_gpu_hour: dict[str, float] | None = None,
               login: LoginHost | None = None) -> SlurmSite:
        """Record a Slurm cluster once Slurm answers on its login node (here, or ``login``
        over SSH) and the shared directory is there (default: the user's home there); attached
        again, its record is replaced (its allocations keep theirs)."""
        naming.check_name(name, "NAME")
        login_node, where = SlurmQueue(login), f"on {login.address}" if login else "here"
        missing = login_node.on_login("sh", "-c", 'for t; do command -v "$t" >/dev/null || '
                                      'echo "$t"; done', "sh", *queue.SLURM_TOOLS).stdout.split()
        if missing:
            raise UsageError(f"--slurm: {', '.join(missing[:5])} not found {where}: sortie runs "
                             "Slurm's commands on the cluster's login node, where its client "
                             "commands are")
        answer = login_node.slurm("sinfo", "-h", "-o", "%P")
        if answer.returncode != 0:
            raise UsageError(f"--slurm: Slurm does not answer {where}: "
                             f"{queue.slurm_message(answer)}")
        refused = too_old(login_node.slurm("sinfo", "--version").stdout)
        if refused:
            raise UsageError(f"--slurm: {refused} {where}")
        # The nodes' Python, on the login node (the shared disk's, or one every node has): one
        # that is not there failed the run later, as "exit code 127".
        if login_node.on_login("sh", "-c", 'command -v -- "$1" >/dev/null', "sh",
                               python).returncode != 0:
            raise UsageError(f"--python: {python[:80]!r} not found {where} (the nodes run it: "
                             "a Python with torch on the shared file system, or one every "
                             "node has)")
        # The directory as the login node resolves it (its home when not given).
        found = login_node.on_login("sh", "-c", 'cd -P -- "${1:-$HOME}" && pwd -P', "sh",
                                    shared_dir or "")
        resolved = found.stdout.strip()
        if (found.returncode != 0 or (shared_dir and not shared_dir.startswith("/"))
                or not resolved.startswith("/")):
            raise UsageError(f"--shared-dir: {shared_dir or '~'!r} is not an existing absolute "
                             f"directory {where} (one the login node shares with every compute "
                             "node)")
        try:
            site = SlurmSite(name=name, shared_dir=resolved, python=python,
                             usd_per_gpu_hour=usd_per_gpu_hour or {}, attached_at=time.time(),
                             login=login)
        except ValueError as exc:
            raise UsageError(f"--python: {python[:80]!r} is not a program path") from exc
        try:
            naming.take(self.directory, name, {SITE_FILE: site.model_dump_json(indent=2) + "\n"})
        except naming.NameTakenError:  # attached before: the new settings replace the old
            statefile.write_json(self.directory / name / SITE_FILE, site.model_dump(mode="json"))
        return site

    def site(self, name: str) -> SlurmSite:
        path = naming.state_dir(self.directory, name, "--slurm") / SITE_FILE
        if not path.is_file():
            raise UsageError(f"--slurm: no Slurm cluster named {name!r} (`sortie attach "
                             f"{name} --slurm` records one)")
        return statefile.read_model(SlurmSite, path)


class Allocation(BaseModel):
    """A sortie's allocation, as recorded here (read back as untrusted)."""

    site: str
    job_id: str = Field(pattern=r"^[0-9]{1,12}$")
    workdir: NodePath
    ask: dict[str, str | bool | int | list[str] | None]
    started: float
    earlier: list[str] = Field(default_factory=list)  # the jobs it replaced (recoveries)
    restarts: int = Field(default=0, ge=0)  # Slurm's requeues of it when its nodes were read
    login: LoginHost | None = None  # its cluster's login node over SSH (None: this machine)
    # Where the cluster keeps no accounting, its cost counts the time it held nodes by sortie's
    # clock: since the current job started running, and the replaced ones' before it.
    ran_from: float | None = None
    held_before_s: float = Field(default=0.0, ge=0)

    def held_s(self, now: float) -> float:
        return self.held_before_s + (max(0.0, now - self.ran_from) if self.ran_from else 0.0)

    def save(self, state: Path) -> None:
        """Into the sortie's state directory ``state`` (ALLOCATION_FILE)."""
        statefile.write_json(state / ALLOCATION_FILE, self.model_dump(mode="json"))

    @property
    def queue(self) -> SlurmQueue:
        return SlurmQueue(self.login)

    def asked(self) -> SlurmAsk:
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in self.ask.items()
                  if k != "nodes"}
        return SlurmAsk(**fields)  # type: ignore[arg-type]
