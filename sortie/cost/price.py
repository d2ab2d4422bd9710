"""What every price a backend says has: dollars an hour and the terms they are at. A local
cluster's notional price (`stacks/local/local_rehearsal.NotionalPrice`) and a Slurm allocation's
GPU-hours (`stacks/slurm/slurm_sites.GpuHourPrice`) are two; the engine reads only this. And the
terms a run's cost is counted at (`Pricing`): a cloud's estimate, or such a price."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from sortie.core.errors import UsageError
from sortie.cost.launch_cost import LaunchCost

RATE_ENV = "SORTIE_LOCAL_USD_PER_HOUR"  # a notional price per local node, for budget rehearsals


class Price(Protocol):
    @property
    def usd_per_hour(self) -> float:
        """The whole cluster's $/h."""
        ...

    @property
    def terms(self) -> str:
        """What the figure is, in words: "notional: $2/h a node", "$3 per GPU-hour"."""
        ...


@dataclass(frozen=True)
class Pricing:
    """What the cluster costs at its launch terms, for the report (None: local, no cost)."""

    usd_per_hour: float | None = None
    terms: str = ""  # "on-demand", "spot", "spot workers, on-demand head"

    @classmethod
    def at_launch(cls, cost: LaunchCost | None, notional: Callable[[], Price | None],
                  max_cost: float | None) -> Pricing:
        """The terms a run's cost is counted at: a cloud's estimate, or the backend's
        ``notional`` price, asked only without one (local nodes' $SORTIE_LOCAL_USD_PER_HOUR; on
        a held cluster, the one it started with, as `status` and the ledger count it); a budget
        needs one of them."""
        price = None if cost else notional()
        pricing = cls(cost.usd_per_hour, cost.terms) if cost else \
            cls(price.usd_per_hour, price.terms) if price else cls()
        if max_cost is not None and not pricing.usd_per_hour:
            raise UsageError(f"--max-cost: this cluster has no price to count it at (local "
                             f"nodes: set {RATE_ENV} to rehearse a budget)")
        return pricing
