"""Monthly budgets by owner (`sortie budget set OWNER --monthly USD`): what an owner has spent
this month (the cost ledger, and what their running sorties have cost so far), what is left, and
a launch refused, before anything starts, when the most it can cost would pass what is left."""

from __future__ import annotations

import datetime
import math
import time
from pathlib import Path

from pydantic import BaseModel

from sortie.core.errors import UsageError
from sortie.fleet.registry import survey
from sortie.stacks.cloud_records import CloudAccess
from sortie.stacks.cost_ledger import OwnerBudgets, read_budgets, read_costs
from sortie.stacks.launch_cost import LaunchCost
from sortie.stacks.listing import SortieRow


class OwnerBudget(BaseModel):
    owner: str
    monthly_usd: float
    spent_usd: float  # this calendar month (UTC), so far
    left_usd: float


def month_start(now: float) -> float:
    today = datetime.datetime.fromtimestamp(now, datetime.timezone.utc)
    return today.replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp()


def spent_this_month(home: Path, owners: list[str], rows: list[SortieRow],
                     backend_url: str | None = None, now: float | None = None
                     ) -> dict[str, float]:
    """Each owner's ledger lines, the part of each within this month, and their running
    sorties' cost so far (``rows``: `status`'s); the ledger is read once for all of them."""
    now = now or time.time()
    start = month_start(now)
    entries, _ = read_costs(home, backend_url, start)
    spent = dict.fromkeys(owners, 0.0)
    for e in entries:
        if e.owner in spent:
            spent[e.owner] += e.usd_per_hour * max(0.0, e.ended - max(e.started, start)) / 3600
    for row in rows:
        if row.owner in spent:
            spent[row.owner] += row.usd_so_far
    return spent


def owner_budgets(home: Path, rows: list[SortieRow], backend_url: str | None = None,
                  budgets: OwnerBudgets | None = None) -> list[OwnerBudget]:
    """Every owner with a budget: set, spent this month, left."""
    budgets = budgets or read_budgets(home, backend_url)
    if not budgets.monthly_usd:
        return []
    spent_by = spent_this_month(home, list(budgets.monthly_usd), rows, backend_url)
    found = []
    for owner, monthly in sorted(budgets.monthly_usd.items()):
        spent = round(spent_by[owner], 2)
        found.append(OwnerBudget(owner=owner, monthly_usd=monthly, spent_usd=spent,
                                 left_usd=round(monthly - spent, 2)))
    return found


def check_launch(home: Path, owner: str, cost: LaunchCost | None, max_usd: float | None,
                 backend_url: str | None = None,
                 open_usd_per_hour: float | None = None) -> None:
    """Refuse a launch whose most (its --max-cost, else its $/h for the whole TTL) would pass
    what is left of its owner's monthly budget; nothing to check without a budget or a price.
    ``open_usd_per_hour``: the price of a cluster no TTL ends (local nodes' notional price):
    without --max-cost its most has no bound, so under a budget it needs one."""
    if max_usd is not None:
        most, how = max_usd, "its --max-cost"
    elif cost:
        most, how = cost.usd_per_hour * cost.estimate.ttl_hours, "its $/h for the whole TTL"
    elif open_usd_per_hour:
        most, how = math.inf, f"${open_usd_per_hour:,.2f}/h, and no TTL ends it"
    else:
        return
    budgets = read_budgets(home, backend_url)
    damaged = budgets.damaged.get(owner) or budgets.damaged.get(OwnerBudgets.WHOLE_FILE)
    if damaged:  # a budget that cannot be read is no reason to spend without one
        raise UsageError(f"budget: {damaged}: `sortie budget set {owner} --monthly USD` writes "
                         "it anew")
    if owner not in budgets.monthly_usd:
        return
    rows = [seen.row for seen in survey(home, CloudAccess(backend_url))]
    left = owner_budgets(home, rows, backend_url,
                         OwnerBudgets(monthly_usd={owner: budgets.monthly_usd[owner]}))[0]
    if most > left.left_usd:
        may = "has no bound" if math.isinf(most) else f"may cost up to ${most:,.2f}"
        fix = (f"give --max-cost (at most ${max(left.left_usd, 0):,.2f})" if math.isinf(most)
               else "give a lower --max-cost")
        raise UsageError(f"budget: {owner} has ${left.left_usd:,.2f} of ${left.monthly_usd:,.2f} "
                         f"left this month; this launch {may} ({how}): {fix}, or `sortie "
                         "budget set` more")
