"""Owners' monthly budgets (`sortie budget set`): the file that keeps them (here, or in a shared
state backend, where every controller launching there is held to them), what each owner has
spent this month (the ledger's lines and their running sorties), and the check a launch passes
first."""

from __future__ import annotations

import datetime
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, ClassVar

from pydantic import BaseModel, Field, ValidationError

from sortie.core import statefile
from sortie.core.errors import UsageError
from sortie.core.shared_store import SharedStore
from sortie.core.statefile import CorruptStateError, Usd
from sortie.cost.launch_cost import LaunchCost
from sortie.cost.ledger import MAX_ENTRIES, read_costs
from sortie.cost.money import usd, usd_per_hour

Running = Iterable[tuple[str, float]]  # each running sortie: (its owner, what it cost so far)


BUDGETS_FILE = "budgets.json"


OWNER = r"[A-Za-z0-9_.@+-]{1,100}"  # a profile's `owner`, a user name


class OwnerBudgets(BaseModel):
    """Monthly budgets by owner (`sortie budget set`): in a shared state backend, every
    controller launching there is held to them."""

    monthly_usd: dict[Annotated[str, Field(pattern=f"^{OWNER}$")], Usd] = Field(
        default_factory=dict)
    # What could not be read back (not stored): owners whose entry is damaged, or the whole
    # file, each named with why. A launch by such an owner is refused until it is set again.
    damaged: dict[str, str] = Field(default_factory=dict, exclude=True)

    WHOLE_FILE: ClassVar[str] = "*"  # `damaged`'s key when the file itself could not be read


def _budgets_at(home: Path, backend_url: str | None) -> tuple[SharedStore | None, str]:
    if backend_url is None:
        return None, str(home / BUDGETS_FILE)
    store = SharedStore(backend_url)
    return store, f"{store.root}/{BUDGETS_FILE}"


def read_budgets(home: Path, backend_url: str | None = None) -> OwnerBudgets:
    """The budgets, each owner's entry on its own: one damaged entry (NaN, a negative or huge
    figure, a bad name) is skipped and named in ``damaged``, never fatal to the others."""
    store, path = _budgets_at(home, backend_url)
    try:
        data = store.read(path) if store else statefile.read_regular(Path(path),
                                                                      statefile.MAX_STATE_BYTES)
        raw = statefile.loads(data, path, strict=False)  # each entry is judged on its own
        entries = raw.get("monthly_usd") if isinstance(raw, dict) else None
        if not isinstance(entries, dict):
            raise CorruptStateError(f"{path}: damaged (no monthly_usd)")
    except FileNotFoundError:
        return OwnerBudgets()
    except (OSError, CorruptStateError) as exc:
        why = str(exc) if isinstance(exc, CorruptStateError) else f"{path}: {exc}"
        return OwnerBudgets(damaged={OwnerBudgets.WHOLE_FILE: why})
    budgets = OwnerBudgets()
    for owner, monthly in list(entries.items())[:MAX_ENTRIES]:
        try:
            budgets.monthly_usd.update(OwnerBudgets.model_validate(
                {"monthly_usd": {owner: monthly}}).monthly_usd)
        except ValidationError:
            budgets.damaged[str(owner)[:100]] = f"{path}: {str(owner)[:100]!r}: damaged " \
                f"({str(monthly)[:40]!r} is no budget in dollars)"
    return budgets


def write_budgets(home: Path, budgets: OwnerBudgets, backend_url: str | None = None) -> None:
    store, path = _budgets_at(home, backend_url)
    text = budgets.model_dump_json(indent=2) + "\n"
    if store is None:
        home.mkdir(parents=True, exist_ok=True)
        statefile.write_text(Path(path), text)
    else:
        store.put(path, text)


class OwnerBudget(BaseModel):
    owner: str
    monthly_usd: float
    spent_usd: float  # this calendar month (UTC), so far
    left_usd: float


def month_start(now: float) -> float:
    today = datetime.datetime.fromtimestamp(now, datetime.timezone.utc)
    return today.replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp()


def spent_this_month(home: Path, owners: list[str], running: Running,
                     backend_url: str | None = None, now: float | None = None
                     ) -> dict[str, float]:
    """Each owner's ledger lines, the part of each within this month, and their running
    sorties' cost so far (``running``); the ledger is read once for all of them."""
    now = now or time.time()
    start = month_start(now)
    entries, _ = read_costs(home, backend_url, start)
    spent = dict.fromkeys(owners, 0.0)
    for e in entries:
        if e.owner in spent:
            spent[e.owner] += e.cost_since(start)
    for owner, usd_so_far in running:
        if owner in spent:
            spent[owner] += usd_so_far
    return spent


def owner_budgets(home: Path, running: Running, backend_url: str | None = None,
                  budgets: OwnerBudgets | None = None) -> list[OwnerBudget]:
    """Every owner with a budget: set, spent this month, left."""
    budgets = budgets or read_budgets(home, backend_url)
    if not budgets.monthly_usd:
        return []
    spent_by = spent_this_month(home, list(budgets.monthly_usd), running, backend_url)
    found = []
    for owner, monthly in sorted(budgets.monthly_usd.items()):
        spent = round(spent_by[owner], 2)
        found.append(OwnerBudget(owner=owner, monthly_usd=monthly, spent_usd=spent,
                                 left_usd=round(monthly - spent, 2)))
    return found


def check_launch(home: Path, owner: str, cost: LaunchCost | None, max_usd: float | None,
                 running: Callable[[], Running], backend_url: str | None = None,
                 open_usd_per_hour: float | None = None) -> None:
    """Refuse a launch whose most (its --max-cost, else its $/h for the whole TTL) would pass
    what is left of its owner's monthly budget; nothing to check without a budget or a price.
    ``open_usd_per_hour``: the price of a cluster no TTL ends (local nodes' notional price):
    without --max-cost its most has no bound, so under a budget it needs one. ``running``:
    the sorties running now, asked only when the owner has a budget."""
    if max_usd is not None:
        most, how = max_usd, "its --max-cost"
    elif cost:
        most, how = cost.usd_per_hour * cost.estimate.ttl_hours, "its $/h for the whole TTL"
    elif open_usd_per_hour:
        most, how = math.inf, f"{usd_per_hour(open_usd_per_hour)}, and no TTL ends it"
    else:
        return
    budgets = read_budgets(home, backend_url)
    damaged = budgets.damaged.get(owner) or budgets.damaged.get(OwnerBudgets.WHOLE_FILE)
    if damaged:  # a budget that cannot be read is no reason to spend without one
        raise UsageError(f"budget: {damaged}: `sortie budget set {owner} --monthly USD` writes "
                         "it anew")
    if owner not in budgets.monthly_usd:
        return
    left = owner_budgets(home, running(), backend_url,
                         OwnerBudgets(monthly_usd={owner: budgets.monthly_usd[owner]}))[0]
    if most > left.left_usd:
        may = "has no bound" if math.isinf(most) else f"may cost up to {usd(most)}"
        fix = (f"give --max-cost (at most {usd(max(left.left_usd, 0))})" if math.isinf(most)
               else "give a lower --max-cost")
        raise UsageError(f"budget: {owner} has {usd(left.left_usd)} of {usd(left.monthly_usd)} "
                         f"left this month; this launch {may} ({how}): {fix}, or `sortie "
                         "budget set` more")
