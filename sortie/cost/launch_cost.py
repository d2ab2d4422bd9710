"""What a cloud cluster will cost, said before it launches: its estimated $/h at its launch
terms, what a fallback to on-demand or to other places would cost, and its TTL's worst case.
A backend with list prices makes one (`PulumiBackend.launch_cost`, from its sites:
`sites.cloud_launch_cost`); local nodes and attached machines have none (a local notional price
is `stacks/local/local_rehearsal.py`'s)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sortie.cost.money import usd, usd_per_hour

if TYPE_CHECKING:  # the spec's models load where a stack is priced, not for every command
    from sortie.infra.spec import CostEstimate


@dataclass(frozen=True)
class LaunchCost:
    """A cloud cluster's estimated compute cost at launch, and its TTL's worst case."""

    profile: str
    nodes: int
    instance_type: str
    spot: bool
    on_demand_fallback: bool  # spot may fall back to on-demand, at its price
    estimate: CostEstimate
    region: str = ""
    fallback_sites: int = 0  # `--gpu`: other places tried when this one has no capacity
    fallback_usd_h: float = 0.0  # ... the dearest of them

    @property
    def usd_per_hour(self) -> float:
        return self.estimate.usd_per_hour(self.spot)

    @property
    def terms(self) -> str:
        from sortie.infra.spec import launch_terms

        return launch_terms(self.spot, self.nodes)

    def line(self) -> str:
        terms = self.terms
        fallback = (f" ({usd_per_hour(self.estimate.on_demand_usd_h)} if it falls back to "
                    "on-demand)" if self.on_demand_fallback else "")
        ttl = self.estimate.ttl_hours
        sites = (f"; without capacity there, {self.fallback_sites} other places, up to "
                 f"{usd_per_hour(self.fallback_usd_h)}" if self.fallback_sites else "")
        return (f"{self.profile}: {self.nodes} x {self.instance_type} in {self.region}, {terms}: "
                f"estimated {usd_per_hour(self.usd_per_hour)}{fallback}; the {ttl:g} h TTL "
                f"caps it at {usd(self.usd_per_hour * ttl)} (compute only, prices of "
                f"{self.estimate.price_date}){sites}")

