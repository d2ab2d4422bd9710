"""What every sortie cost, kept after it is gone: one small file per sortie run or held cluster,
written when it is torn down, in ``$SORTIE_HOME/costs/`` and, for a cloud sortie on a shared
state backend, beside its records (``<backend>/.sortie/costs/``), so that `sortie costs` shows
every controller's. Costs are at the launch terms (nodes × $/h) for the actual duration:
estimates from list prices, never a bill. Owners' monthly budgets, held to it, are
`budgets.py`."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, computed_field

from sortie.core import statefile
from sortie.core.naming import NAME
from sortie.core.shared_store import SharedStore
from sortie.core.statefile import CorruptStateError, EpochSeconds

COSTS = "costs"
MAX_ENTRIES = 100_000  # a ledger is untrusted input too: read no more than this many
MAX_ENTRY_BYTES = 64 << 10  # one entry is a few hundred bytes


class CostEntry(BaseModel):
    name: str = Field(pattern=f"^{NAME.pattern}$")
    kind: str = Field(pattern="^(run|held)$")  # a whole `sortie run`, or a cluster held with `up`
    backend: str = Field(max_length=20)  # local, aws, gcp, azure
    profile: str | None = Field(default=None, max_length=100)
    owner: str = Field(default="unknown", max_length=100)
    nodes: int = Field(ge=0, le=100_000)
    usd_per_hour: float = Field(ge=0, le=1e7, allow_inf_nan=False)
    terms: str = Field(default="", max_length=100)
    started: EpochSeconds
    ended: EpochSeconds
    # The seconds the cluster's own accounting says it held the nodes (Slurm's `sacct`: not the
    # time queued), where it keeps one; else the time from start to end is counted.
    accounted_s: float | None = Field(default=None, ge=0, le=1e9, allow_inf_nan=False)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def cost(self) -> float:
        """Dollars at the launch terms for the actual duration (derived: never read back)."""
        held_s = self.accounted_s if self.accounted_s is not None else self.ended - self.started
        return round(max(0.0, held_s) / 3600 * self.usd_per_hour, 4)

    def cost_since(self, start: float) -> float:
        """The part of the cost after ``start`` (a month's beginning), by the time in it."""
        span = self.ended - self.started
        if span <= 0:
            return self.cost if self.ended >= start else 0.0
        return self.cost * max(0.0, self.ended - max(self.started, start)) / span

    @property
    def file_name(self) -> str:
        return f"{self.name}-{int(self.started)}.json"


def record_cost(home: Path, entry: CostEntry, backend_url: str | None = None) -> str | None:
    """Keep ``entry`` here, and in the shared state backend when there is one. Never raises (a
    sortie that ended is not undone by its cost line): returns why a copy was not kept. A line
    of nothing held (0 s by the cluster's accounting: an allocation refused while queued, or
    one that never ran) is not kept: it cost nothing, and was no run."""
    if entry.accounted_s == 0:
        return None
    try:
        (home / COSTS).mkdir(parents=True, exist_ok=True, mode=0o700)
        statefile.write_text(home / COSTS / entry.file_name, entry.model_dump_json() + "\n")
        if backend_url is not None:
            store = SharedStore(backend_url)
            store.put(f"{store.root}/{COSTS}/{entry.file_name}", entry.model_dump_json())
    except Exception as exc:  # noqa: BLE001 - said, never raised
        return f"its cost line was not kept: {type(exc).__name__}: {exc}"[:300]
    return None


def read_costs(home: Path, backend_url: str | None = None, since: float = 0.0
               ) -> tuple[list[CostEntry], list[str]]:
    """(entries that ended after ``since``, by file name once: here and in the shared backend;
    the files that could not be read, named). A ledger is untrusted input (a shared backend's
    above all): regular files only, each read up to MAX_ENTRY_BYTES; one bad entry is skipped
    and named, never fatal."""
    found: dict[str, bytes] = {}
    unreadable: list[str] = []
    local = home / COSTS
    if local.is_dir():
        for path in sorted(local.glob("*.json"))[:MAX_ENTRIES]:
            try:
                found[path.name] = statefile.read_regular(path, MAX_ENTRY_BYTES)
            except OSError as exc:
                unreadable.append(f"{path} ({exc.strerror or exc})")
    if backend_url is not None:
        store = SharedStore(backend_url)
        try:
            names = store.fs.ls(f"{store.root}/{COSTS}", detail=False)[:MAX_ENTRIES]
        except FileNotFoundError:
            names = []
        for name in names:
            if Path(name).name in found or not name.endswith(".json"):
                continue
            try:
                found[Path(name).name] = store.read(name, MAX_ENTRY_BYTES)
            except OSError as exc:
                unreadable.append(f"{name} ({exc.strerror or exc})")
    entries = []
    for name, data in found.items():
        try:
            entry = statefile.parse_model(CostEntry, statefile.loads(data, name), name)
        except CorruptStateError as exc:
            unreadable.append(str(exc))
            continue
        if entry.ended >= since:
            entries.append(entry)
    return sorted(entries, key=lambda e: e.started), unreadable

