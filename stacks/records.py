"""What sortie records about a sortie besides its machines: which controller drives it and whether
that controller is still alive, and what job it launched (so that another controller can take
over: `sortie watch`, `sortie reap`).

"Orphaned" is a fact, not a guess: a controller writes a heartbeat every ``HEARTBEAT_S``; one
older than ``STALE_S`` means it is gone, from any machine that reads the record. On the machine
the controller ran on, a process that no longer exists says so at once.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Self

import psutil
from pydantic import BaseModel, ConfigDict, Field

from sortie.core import statefile
from sortie.core.errors import SortieError
from sortie.core.inventory import INVENTORY_FILE, Inventory
from sortie.core.job import Job
from sortie.core.naming import check_name
from sortie.core.shared_store import SharedStore
from sortie.core.statefile import EpochSeconds, Usd

HEARTBEAT_S = 30.0
STALE_S = 180.0  # six missed heartbeats
# In a sortie's state directory here: the process it belongs to (absent: held), and what was
# launched on it, for a controller that takes over.
CONTROLLER_FILE, JOB_FILE = "controller.json", "job.json"


def this_machine() -> str:
    """This machine as a controller record names it: host name and boot id (a pid means
    something only on the machine, and the boot, it was read on)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "unknown-boot"
    return f"{socket.gethostname()}/{boot}"


class Process(BaseModel):
    """A process of one machine, named so that it is known again: its pid means something only
    on that machine and that boot, and with its start time a recycled pid is another process."""

    model_config = ConfigDict(frozen=True)

    host: str = Field(max_length=255)
    pid: int = Field(gt=0, le=1 << 22)  # Linux's pid_max at most
    started: EpochSeconds  # the process's start time: a recycled pid has another
    # The machine, surer than its host name (two machines may share one): the name and the
    # kernel's boot id; "" in records written before it was kept.
    machine: str = ""

    @classmethod
    def me(cls, **fields: Any) -> Self:
        """This process."""
        process = psutil.Process()
        return cls(host=socket.gethostname(), pid=process.pid, started=process.create_time(),
                   machine=this_machine(), **fields)

    def here(self) -> bool:
        """Whether it ran on this machine (and this boot of it)."""
        return self.machine == this_machine() if self.machine else \
            self.host == socket.gethostname()

    def exists(self) -> bool:
        """Whether its pid runs on this machine (perhaps as another process: `alive`)."""
        return psutil.pid_exists(self.pid)

    def alive(self) -> bool:
        """Whether it still runs (on this machine: ask `here` first)."""
        try:
            process = psutil.Process(self.pid)
            return abs(process.create_time() - self.started) <= 1 and \
                process.status() != psutil.STATUS_ZOMBIE  # (dead, its parent not told yet)
        except psutil.NoSuchProcess:
            return False


class Controller(Process):
    """The process that drives a sortie (`sortie run`, or `sortie watch` after it)."""

    heartbeat: EpochSeconds  # epoch seconds of its last sign of life

    @classmethod
    def me(cls, **fields: Any) -> Self:
        """This process, beating now."""
        return super().me(heartbeat=time.time(), **fields)

    def gone(self, now: float | None = None) -> bool:
        """Whether this controller has stopped driving its sortie."""
        if (now or time.time()) - self.heartbeat > STALE_S:
            return True
        return self.here() and not self.alive()  # elsewhere, a recent heartbeat: alive


@contextlib.contextmanager
def heartbeat(beat: Callable[[], None], every_s: float = HEARTBEAT_S) -> Iterator[None]:
    """Call ``beat`` now and every ``every_s`` seconds (in a daemon thread) while the block runs.
    A beat that fails is tried again at the next one: a heartbeat is never worth a failed run."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every_s):
            with contextlib.suppress(Exception):
                beat()

    beat()
    thread = threading.Thread(target=loop, daemon=True, name="sortie-heartbeat")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        # A beat under way when the block ended must not land after what follows it (a held
        # cluster's record, written without a controller).
        thread.join(timeout=60)


class SortieRecord(BaseModel):
    """What a cloud sortie's `up` recorded, kept on the controller
    (``$SORTIE_HOME/stacks/<name>/sortie.json``) and beside Pulumi's state in the backend, where
    every controller that shares the backend reads it (`RecordStore`)."""

    cluster: str
    profile: str
    cloud: str
    region: str
    nodes: int = Field(ge=0, le=100_000)
    created: EpochSeconds
    expires_at: EpochSeconds
    usd_per_hour: Usd
    owner: str = Field(default="unknown", max_length=100)  # the fleet view groups by it
    config: dict[str, Any]  # what it was launched with: enough to tear it down from anywhere
    backend_url: str | None = None  # the Pulumi state backend; None: this controller's own
    kept: str | None = None  # what a teardown kept on purpose (the bucket), if it did
    controller: Controller | None = None
    job: Job | None = None
    # Held with `sortie up --stack`: no controller drives it; `sortie exec` runs jobs on it
    # until `sortie down` (or its TTL) ends it.
    held: bool = False

    @property
    def idle_stop_minutes(self) -> int | None:
        """Held with `sortie up --idle-stop`: its nodes power off after this long with nothing
        running (`sortie reap` destroys the rest)."""
        from sortie.infra.spec import NAMESPACE  # (the spec's models load only with a stack's)

        minutes = self.config.get(f"{NAMESPACE}:idleStopMinutes")
        return int(minutes) if isinstance(minutes, int | float) and minutes > 0 else None


class RecordStore(SharedStore):
    """Sortie records beside Pulumi's state: ``<backend>/.sortie/<name>.json``."""

    def _path(self, name: str) -> str:
        return f"{self.root}/{check_name(name, 'record')}.json"

    def save(self, record: SortieRecord) -> None:
        text = record.model_dump_json(indent=2) + "\n"
        if self.local:  # a rename, so that a reader never sees half a record
            Path(self.root).mkdir(parents=True, exist_ok=True, mode=0o700)
            statefile.write_text(Path(self._path(record.cluster)), text)
        else:  # one PUT: object stores replace an object whole
            self.fs.pipe_file(self._path(record.cluster), text.encode())

    def load(self, name: str) -> SortieRecord | None:
        """The record, None when there is none; CorruptStateError when it is damaged."""
        where = self._path(name)
        try:
            data = self.read(where)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise statefile.CorruptStateError(f"{where}: cannot read it ({exc})") from None
        return statefile.parse_model(SortieRecord, statefile.loads(data, where), where)

    def remove(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._path(name))



def controller_in(state: Path) -> Controller | None:
    """The controller a sortie's state directory names; None for a held sortie."""
    path = state / CONTROLLER_FILE
    return statefile.read_model(Controller, path) if path.is_file() else None


def controller_files() -> dict[str, str]:
    """A new sortie's state directory's files (`naming.take`): this process drives it."""
    return {CONTROLLER_FILE: Controller.me().model_dump_json(indent=2) + "\n"}


def beat_in(state: Path) -> None:
    """Record this process as the sortie's controller, with a fresh heartbeat."""
    statefile.write_json(state / CONTROLLER_FILE, Controller.me().model_dump())


class Heartbeats:
    """A backend's heartbeats into its sorties' state directories, from a thread of their own:
    once `down` closes a sortie none is written, so none makes its directory again, half, after
    it was removed."""

    def __init__(self) -> None:
        self._lock, self._closing = threading.Lock(), set[str]()

    def open(self, cluster_id: str) -> None:
        with self._lock:
            self._closing.discard(cluster_id)

    def beat(self, cluster_id: str, state: Path) -> None:
        with self._lock:
            if cluster_id not in self._closing and state.is_dir():
                beat_in(state)

    def close(self, cluster_id: str) -> None:
        with self._lock:
            self._closing.add(cluster_id)


def inventory_in(state: Path, missing: str) -> Inventory:
    """The sortie's saved inventory; a SortieError saying ``missing`` when it has none."""
    path = state / INVENTORY_FILE
    if not path.is_file():
        raise SortieError(missing)
    return Inventory.load(path)


def save_job_in(state: Path, job: Job) -> None:
    statefile.write_json(state / JOB_FILE, job.model_dump())


def job_in(state: Path) -> Job | None:
    """The job launched on the sortie, as its controller recorded it."""
    path = state / JOB_FILE
    return statefile.read_model(Job, path) if path.is_file() else None
