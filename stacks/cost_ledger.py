"""What every sortie cost, kept after it is gone: one small file per sortie run or held cluster,
written when it is torn down, in ``$SORTIE_HOME/costs/`` and, for a cloud sortie on a shared
state backend, beside its records (``<backend>/.sortie/costs/``), so that `sortie costs` shows
every controller's. Costs are at the launch terms (nodes × $/h) for the actual duration:
estimates from list prices, never a bill. Beside it, monthly budgets by owner
(`OwnerBudgets`), which a launch is held to."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, computed_field

from sortie.core import statefile
from sortie.core.naming import NAME
from sortie.core.statefile import CorruptStateError
from stacks.records import RecordStore

COSTS = "costs"
MAX_ENTRIES = 100_000  # a ledger is untrusted input too: read no more than this many


class CostEntry(BaseModel):
    name: str = Field(pattern=f"^{NAME.pattern}$")
    kind: str = Field(pattern="^(run|held)$")  # a whole `sortie run`, or a cluster held with `up`
    backend: str = Field(max_length=20)  # local, aws, gcp, azure
    profile: str | None = Field(default=None, max_length=100)
    owner: str = Field(default="unknown", max_length=100)
    nodes: int = Field(ge=0, le=100_000)
    usd_per_hour: float = Field(ge=0, le=1e7)
    terms: str = Field(default="", max_length=100)
    started: float  # epoch seconds
    ended: float

    @computed_field  # type: ignore[prop-decorator]
    @property
    def cost(self) -> float:
        """Dollars at the launch terms for the actual duration (derived: never read back)."""
        return round(max(0.0, self.ended - self.started) / 3600 * self.usd_per_hour, 4)

    @property
    def file_name(self) -> str:
        return f"{self.name}-{int(self.started)}.json"


def record_cost(home: Path, entry: CostEntry, backend_url: str | None = None) -> str | None:
    """Keep ``entry`` here, and in the shared state backend when there is one. Never raises (a
    sortie that ended is not undone by its cost line): returns why a copy was not kept."""
    try:
        (home / COSTS).mkdir(parents=True, exist_ok=True, mode=0o700)
        statefile.write_text(home / COSTS / entry.file_name, entry.model_dump_json() + "\n")
        if backend_url is not None:
            store = RecordStore(backend_url)
            store.fs.makedirs(f"{store.root}/{COSTS}", exist_ok=True)  # (object stores: none)
            store.fs.pipe_file(f"{store.root}/{COSTS}/{entry.file_name}",
                               entry.model_dump_json().encode())
    except Exception as exc:  # noqa: BLE001 - said, never raised
        return f"its cost line was not kept: {type(exc).__name__}: {exc}"[:300]
    return None


def read_costs(home: Path, backend_url: str | None = None, since: float = 0.0
               ) -> tuple[list[CostEntry], list[str]]:
    """(entries that ended after ``since``, by file name once: here and in the shared backend;
    the files that could not be read, named)."""
    found: dict[str, bytes] = {}
    unreadable: list[str] = []
    local = home / COSTS
    if local.is_dir():
        for path in sorted(local.glob("*.json"))[:MAX_ENTRIES]:
            handle = statefile.open_regular(path)
            if handle is not None:
                with handle:
                    found[path.name] = handle.read(1 << 16)
    if backend_url is not None:
        store = RecordStore(backend_url)
        try:
            names = store.fs.ls(f"{store.root}/{COSTS}", detail=False)[:MAX_ENTRIES]
        except FileNotFoundError:
            names = []
        for name in names:
            found.setdefault(Path(name).name, store.fs.cat_file(name)[:1 << 16])
    entries = []
    for name, data in found.items():
        try:
            entry = statefile.parse_model(CostEntry, statefile.loads(data, name), name)
        except (CorruptStateError, ValueError):
            unreadable.append(name)
            continue
        if entry.ended >= since:
            entries.append(entry)
    return sorted(entries, key=lambda e: e.started), unreadable


BUDGETS_FILE = "budgets.json"


class OwnerBudgets(BaseModel):
    """Monthly budgets by owner (`sortie budget set`): in a shared state backend, every
    controller launching there is held to them."""

    monthly_usd: dict[str, float] = Field(default_factory=dict)


def _budgets_at(home: Path, backend_url: str | None) -> tuple[Any, str]:
    if backend_url is None:
        import fsspec

        return fsspec.filesystem("file"), str(home / BUDGETS_FILE)
    store = RecordStore(backend_url)
    return store.fs, f"{store.root}/{BUDGETS_FILE}"


def read_budgets(home: Path, backend_url: str | None = None) -> OwnerBudgets:
    fs, path = _budgets_at(home, backend_url)
    try:
        data = fs.cat_file(path)[:1 << 20]
    except FileNotFoundError:
        return OwnerBudgets()
    return statefile.parse_model(OwnerBudgets, statefile.loads(data, path), path)


def write_budgets(home: Path, budgets: OwnerBudgets, backend_url: str | None = None) -> None:
    fs, path = _budgets_at(home, backend_url)
    text = budgets.model_dump_json(indent=2) + "\n"
    if backend_url is None:
        home.mkdir(parents=True, exist_ok=True)
        statefile.write_text(Path(path), text)
    else:
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        fs.pipe_file(path, text.encode())
