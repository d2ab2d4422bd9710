"""`sortie costs`: what sorties and held clusters cost, from the cost ledger (this controller's,
and a shared state backend's), with totals by owner, profile, backend or day."""

from __future__ import annotations

import datetime
import time
from collections import defaultdict
from pathlib import Path

from pydantic import BaseModel

from sortie.cost.ledger import CostEntry, read_costs

GROUPINGS = ("owner", "profile", "backend", "day")


class Costs(BaseModel):
    since: str  # ISO 8601, UTC
    by: str
    entries: list[CostEntry]
    totals: dict[str, float]  # by the grouping
    total_usd: float
    unreadable: list[str]  # ledger files that could not be read, named


def group_of(entry: CostEntry, by: str) -> str:
    if by == "day":
        return datetime.datetime.fromtimestamp(entry.started, datetime.timezone.utc).strftime(
            "%Y-%m-%d")
    return str(getattr(entry, by) or "-")


def costs(home: Path, since_s: float, by: str = "owner", backend_url: str | None = None,
          now: float | None = None) -> Costs:
    """Every sortie that ended in the last ``since_s`` seconds, grouped ``by``."""
    start = (now or time.time()) - since_s
    entries, unreadable = read_costs(home, backend_url, start)
    totals: dict[str, float] = defaultdict(float)
    for entry in entries:
        totals[group_of(entry, by)] += entry.cost
    return Costs(
        since=datetime.datetime.fromtimestamp(start, datetime.timezone.utc).isoformat(
            timespec="seconds"), by=by,
        entries=entries,
        totals={key: round(value, 2) for key, value in sorted(totals.items())},
        total_usd=round(sum(e.cost for e in entries), 2), unreadable=unreadable)
