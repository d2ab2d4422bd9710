"""What a launch will be, decided before anything starts: where (a stack profile's cloud, the
cheapest place for a GPU ask, or local nodes), how many nodes, what they cost and on what terms,
and whether the owner's budget allows it. `sortie run` and `sortie up` ask for one plan and
render it; a job on a held cluster is priced as that cluster is."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sortie.cost.budgets import check_launch
from sortie.cost.launch_cost import LaunchCost
from sortie.cost.price import Pricing
from sortie.fleet import registry
from sortie.fleet.launch_ask import LaunchAsk
from sortie.fleet.launch_target import LaunchTarget, launch_target
from sortie.stacks.backend import Backend
from sortie.stacks.cloud.access import CloudAccess


@dataclass(frozen=True)
class LaunchPlan:
    target: LaunchTarget
    backend: Backend  # the target's, with what the budget buys where the nodes enforce it
    nodes: int
    cost: LaunchCost | None  # a cloud's estimate, its TTL cut to what the budget buys
    pricing: Pricing  # the terms the spend is counted at (a cloud's, or local nodes' notional)

    @property
    def notes(self) -> tuple[str, ...]:
        return self.target.notes


def plan_launch(home: Path, ask: LaunchAsk, max_cost: float | None = None,
                held: bool = False) -> LaunchPlan:
    """The plan of a new cluster (``held``: by `sortie up`); a UsageError (nothing started)
    when a flag, the node count, the budget's price or the owner's monthly budget says no."""
    target = launch_target(home, ask, held)
    count, backend = target.node_count(ask.nodes), target.backend
    if max_cost is not None:  # first: a cloud's TTL cut to what the budget buys, then priced
        backend = backend.capped(max_cost, count, held=held)
    cost = backend.launch_cost(count)
    pricing = Pricing.at_launch(cost, lambda: backend.notional_price(count), max_cost)
    check_launch(home, backend.owner, cost, max_cost,
                 lambda: registry.spending(home, CloudAccess(ask.backend_url)), ask.backend_url,
                 open_usd_per_hour=None if cost else pricing.usd_per_hour)
    return LaunchPlan(target, backend, count, cost, pricing)

