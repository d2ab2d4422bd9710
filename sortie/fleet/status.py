"""`sortie status`: every sortie, and what is running costs per hour, in all and by owner."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from pydantic import BaseModel

from sortie.cost.budgets import OwnerBudget, owner_budgets
from sortie.fleet.registry import survey
from sortie.stacks.cloud.access import DEFAULT_ACCESS, CloudAccess
from sortie.stacks.listing import SITE_STATE, SortieRow


class OwnerTotal(BaseModel):
    """One owner's share of the fleet."""

    owner: str
    sorties: int
    nodes: int
    usd_per_hour: float


class Fleet(BaseModel):
    """`sortie status`: every sortie, and what is running costs per hour, by owner."""

    sorties: list[SortieRow]
    owners: list[OwnerTotal]  # the most expensive first
    usd_per_hour: float  # everything running
    budgets: list[OwnerBudget] = []  # owners with a monthly budget: spent, left


def status(home: Path, access: CloudAccess = DEFAULT_ACCESS) -> Fleet:
    """What `sortie status` shows: the state backend's other sorties only when asked for
    (--backend-url): listing a backend needs the Pulumi CLI."""
    asked = access.backend_url is not None or access.stacks is not None
    rows = [seen.row for seen in survey(home, access, elsewhere=asked)]
    return fleet(rows).model_copy(
        update={"budgets": owner_budgets(home, [row.spend for row in rows], access.backend_url)})


def fleet(rows: list[SortieRow]) -> Fleet:
    """The rows, and the estimated $/h of everything running, in all and by owner."""
    by_owner: dict[str, list[SortieRow]] = defaultdict(list)
    for row in rows:
        if row.state != SITE_STATE:  # (an attached Slurm cluster: nothing of it runs for us)
            by_owner[row.owner].append(row)
    owners = [OwnerTotal(owner=owner, sorties=len(owned), nodes=sum(r.nodes for r in owned),
                         usd_per_hour=round(sum(r.usd_per_hour for r in owned), 4))
              for owner, owned in by_owner.items()]
    owners.sort(key=lambda total: (-total.usd_per_hour, total.owner))
    return Fleet(sorties=rows, owners=owners,
                 usd_per_hour=round(sum(row.usd_per_hour for row in rows), 4))
