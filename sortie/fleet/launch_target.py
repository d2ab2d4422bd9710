"""Where `sortie run` and `sortie up` launch: a stack profile's cloud or local sshd nodes, the
cluster shape each defaults to, and what it costs, shown before launch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.offers import GpuAsk
from infra.spec import MAX_NODES, CostEstimate, launch_terms
from sortie.core.errors import UsageError
from sortie.fleet.gpu_sites import gpu_sites
from sortie.fleet.registry import refuse_taken
from stacks.local import LocalBackend
from stacks.local_rehearsal import check_local_torch
from stacks.loopback import LOCAL_MAX_NODES
from stacks.node_network import check_local_network
from stacks.profiles import apply_overrides, load_profile
from stacks.pulumi_backend import PulumiBackend
from stacks.stack_api import spec_from_config


@dataclass(frozen=True)
class LaunchTarget:
    """Where `sortie run` or `sortie up` launches, and the cluster shape it defaults to there."""

    backend: LocalBackend | PulumiBackend
    nodes: int
    gpus_per_node: int = 0
    max_nodes: int = MAX_NODES
    notes: tuple[str, ...] = ()  # said before launch (`--gpu`: the sites not tried, and why)

    def node_count(self, asked: int | None) -> int:
        """How many nodes to launch: ``asked`` (the task's, or --nodes), else the default; more
        than the backend can make is a UsageError, before anything starts."""
        count = asked or self.nodes
        if count > self.max_nodes:
            raise UsageError(f"nodes: {count}: a {self.backend.name} cluster has at most "
                             f"{self.max_nodes}")
        return count

    def cost(self, nodes: int, max_usd: float | None = None) -> LaunchCost | None:
        """What ``nodes`` machines cost, shown before launch (None: local nodes cost nothing).
        With a budget, a cloud cluster's TTL is first cut to what it buys at the worst rate
        (on-demand, where spot may fall back to it)."""
        if max_usd is not None and isinstance(self.backend, PulumiBackend):
            self.backend.cap_budget(max_usd, nodes)
        return cluster_cost(self.backend, nodes)


def cluster_cost(backend: object, nodes: int) -> LaunchCost | None:
    """What ``nodes`` machines of a cloud backend cost (None: not a cloud sortie's)."""
    if not isinstance(backend, PulumiBackend):
        return None
    spec = backend.spec
    elsewhere = [site.estimate(nodes).usd_per_hour(site.spec.spot) for site in backend.sites[1:]]
    return LaunchCost(profile=backend.profile, nodes=nodes, instance_type=spec.instance_type,
                      spot=spec.spot, on_demand_fallback=spec.spot and spec.spot_fallback_on_demand,
                      estimate=backend.estimate(nodes), region=spec.region,
                      fallback_sites=len(elsewhere), fallback_usd_h=max(elsewhere, default=0.0))


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
        return launch_terms(self.spot, self.nodes)

    def line(self) -> str:
        terms = self.terms
        fallback = (f" (${self.estimate.on_demand_usd_h:,.2f}/h if it falls back to on-demand)"
                    if self.on_demand_fallback else "")
        ttl = self.estimate.ttl_hours
        sites = (f"; without capacity there, {self.fallback_sites} other places, up to "
                 f"${self.fallback_usd_h:,.2f}/h" if self.fallback_sites else "")
        return (f"{self.profile}: {self.nodes} x {self.instance_type} in {self.region}, {terms}: "
                f"estimated ${self.usd_per_hour:,.2f}/h{fallback}; the {ttl:g} h TTL caps it at "
                f"${self.usd_per_hour * ttl:,.2f} (compute only, prices of "
                f"{self.estimate.price_date}){sites}")


def launch_target(home: Path, profile: str | None, overrides: tuple[str, ...] = (),
                  backend_url: str | None = None, name: str | None = None,
                  gpu: GpuAsk | None = None, nodes: int | None = None) -> LaunchTarget:
    """A stack profile's cloud (its nodes), the cheapest places for ``gpu`` (``nodes`` of
    them, 1 by default), else local sshd nodes (2). A NAME already taken (here, or by a stack
    in the state backend) is refused first."""
    if name is not None:
        refuse_taken(home, name, "--name")
    if gpu is not None:
        if profile is not None or overrides:
            raise UsageError("--gpu: places the cluster itself; --stack and --set do not apply "
                             "(set each cloud's profile in gpu_profiles, $SORTIE_HOME/config.yaml)")
        return _gpu_target(home, gpu, nodes or 1, backend_url, name)
    if profile is None:
        if overrides:
            raise UsageError("--set: applies to a stack profile; add --stack PROFILE")
        check_local_network()  # a bad setting is named before anything starts
        check_local_torch()
        return LaunchTarget(LocalBackend(home), nodes=2, max_nodes=LOCAL_MAX_NODES)
    backend = backend_for_profile(profile, apply_overrides(load_profile(profile), overrides),
                                  home, backend_url)
    _refuse_existing(backend, name)
    return LaunchTarget(backend, backend.spec.nodes, backend.spec.instance.gpus)


def _refuse_existing(backend: PulumiBackend, name: str | None) -> None:
    """A NAME that a stack in the state backend has (another controller's) is refused."""
    if name is not None and backend.exists(name):
        raise UsageError(f"--name: stack {name!r} exists in the state backend (see `sortie "
                         "status --backend-url`)")


def _gpu_target(home: Path, gpu: GpuAsk, nodes: int, backend_url: str | None,
                name: str | None) -> LaunchTarget:
    from stacks.automation import AutomationStacks

    found = gpu_sites(home, gpu, nodes)
    first, *fallbacks = found.sites
    backend = PulumiBackend(first.profile, first.config, AutomationStacks(home, backend_url),
                            home, spec=first.spec, fallbacks=tuple(fallbacks))
    _refuse_existing(backend, name)
    return LaunchTarget(backend, nodes, first.spec.instance.gpus,
                        notes=tuple(f"not tried: {why}" for why in found.skipped))


def backend_for_profile(profile: str, config: dict[str, Any], home: Path,
                        backend_url: str | None = None) -> PulumiBackend:
    """The real backend for a profile, after checking the CLI and credentials are there."""
    from stacks.automation import AutomationStacks, require_cloud_ready, require_cloud_tools

    spec = spec_from_config("profile-check", config)  # a bad profile is named first
    require_cloud_tools(spec.cloud, f"run stack {profile}")
    require_cloud_ready(spec, f"run stack {profile}")
    return PulumiBackend(profile, config, AutomationStacks(home, backend_url), home, spec=spec)
