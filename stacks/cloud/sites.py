"""Where a cloud backend may launch: its sites (a profile's config; `sortie run --gpu`: one per
offer, cheapest first), each site's placements (zones, then on-demand), which launch errors
move on to the next (`launch_error`), and the TTL a budget allows at each."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sortie.cost.launch_cost import LaunchCost
from sortie.infra.clouds import facts
from sortie.infra.launch_errors import classify
from sortie.infra.spec import NAMESPACE, ClusterSpec, CostEstimate, estimate_cost
from sortie.stacks.backend import LaunchError, Placement
from sortie.stacks.cloud.stack_api import spec_from_config


@dataclass(frozen=True)
class Site:
    """One place a cluster may be launched: a profile's config, validated."""

    profile: str
    config: dict[str, Any]
    spec: ClusterSpec

    def describe(self) -> str:
        return f"{self.spec.cloud} {self.spec.region} {self.spec.instance_type}"

    def estimate(self, nodes: int) -> CostEstimate:
        """What ``nodes`` of this site's machines cost, before anything is launched."""
        return estimate_cost(self.spec.model_copy(update={"nodes": nodes}))

    def placements(self, offered: list[str]) -> list[Placement]:
        """The profile's zone, or without one each of the ``offered`` zones (the program's own
        pick without any); then each fallback zone; then on-demand in the first zone if spot
        may fall back."""
        spec = self.spec
        zones: list[str | None] = [spec.zone] if spec.zone else [*offered] or [None]
        zones += [zone for zone in spec.fallback_zones if zone not in zones]
        attempts = [Placement(zone=zone) for zone in zones]
        if spec.spot and spec.spot_fallback_on_demand:
            attempts.append(Placement(zone=zones[0], spot=False))
        return attempts

    def capped(self, max_usd: float, nodes: int) -> Site:
        """This site with a node-side TTL no longer than what ``max_usd`` buys ``nodes`` of its
        machines at the worst rate of its terms (on-demand, where spot may fall back to it)."""
        spec, cost = self.spec, self.estimate(nodes)
        worst = cost.on_demand_usd_h if not spec.spot or spec.spot_fallback_on_demand \
            else cost.spot_usd_h
        hours = max_usd / worst
        return self if hours >= spec.ttl_hours else self.setting("ttlHours", max(hours, 1 / 60))

    def setting(self, key: str, value: Any) -> Site:
        """This site with ``key`` (of the sortie namespace) set to ``value``."""
        config = {**self.config, f"{NAMESPACE}:{key}": value}
        return Site(self.profile, config, spec_from_config("profile-check", config))


def launch_error(cloud: str, message: str) -> LaunchError:
    """A failed `pulumi up` as a launch error: one that lacked capacity moves on to the next
    placement; any other (quota, permission, image, or an error no rule names) stops the
    launch, saying what to fix."""
    problem = classify(facts(cloud).launch_errors, message)
    if problem.moves_on:
        return LaunchError(message)
    return LaunchError(f"{problem.describe()}; {cloud} said: {message}", moves_on=False)


def cloud_launch_cost(sites: Sequence[Site], nodes: int) -> LaunchCost:
    """What ``nodes`` machines cost at the first of a cloud backend's ``sites`` (where its
    launch starts), and at the others, its fallback places, at worst."""
    first, spec = sites[0], sites[0].spec
    elsewhere = [site.estimate(nodes).usd_per_hour(site.spec.spot) for site in sites[1:]]
    return LaunchCost(profile=first.profile, nodes=nodes, instance_type=spec.instance_type,
                      spot=spec.spot, on_demand_fallback=spec.spot and spec.spot_fallback_on_demand,
                      estimate=first.estimate(nodes), region=spec.region,
                      fallback_sites=len(elsewhere), fallback_usd_h=max(elsewhere, default=0.0))
