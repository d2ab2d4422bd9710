"""Where a cluster is cheapest, offline: every catalog machine, cloud and region that fits a GPU
request (`sortie plan --gpu A100:8 --nodes 2`), with its price at both terms, interconnect, GPU
memory and the quotas it needs, cheapest first. From the shipped catalog alone, which says the
date and source of its prices: no catalog service, no account."""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sortie.infra.cloud_facts import InstanceType

GPU_REQUEST = re.compile(r"(?P<model>[A-Za-z][A-Za-z0-9]{1,15})(:(?P<count>\d{1,2}))?")
CATALOG_MAX_AGE_DAYS = 90
INTERCONNECTS = ("efa", "infiniband", "ib", "gpudirect-tcpx", "gpudirect-tcpxo", "any")


@dataclass(frozen=True)
class Offer:
    cloud: str
    region: str
    instance_type: str
    gpu_model: str
    gpus_per_node: int
    gpu_memory_gb: int
    interconnect: str | None
    nodes: int
    on_demand_usd_h: float  # the whole cluster's
    spot_usd_h: float  # workers on spot, the head on-demand (how sortie launches spot)
    quotas: tuple[str, ...]  # "Running On-Demand P instances: 192 vCPUs"
    price_source: str
    price_date: str
    price_region: str  # the region the price is recorded for: another one = an estimate

    @property
    def estimated(self) -> bool:
        """Priced at the reference region's figure: this region's own was not recorded."""
        return self.price_region != self.region

    def usd_per_hour(self, spot: bool) -> float:
        return self.spot_usd_h if spot else self.on_demand_usd_h


@dataclass(frozen=True)
class GpuAsk:
    """`--gpu A100:8` and the flags that narrow it: what `plan --gpu` lists, and what
    `run/up --gpu` launches (the cheapest offer, then the next ones as fallbacks)."""

    gpu: str
    spot: bool = False
    max_usd_per_hour: float | None = None
    interconnect: str = "any"

    def offers(self, nodes: int, exclude: tuple[str, ...] = ()) -> list[Offer]:
        return offers(self.gpu, nodes, self.spot, self.max_usd_per_hour, self.interconnect,
                      exclude)


def parse_gpu(text: str) -> tuple[str, int]:
    """"A100:8" -> ("A100", 8); "V100" -> ("V100", 1). ValueError naming the form."""
    match = GPU_REQUEST.fullmatch(text.strip())
    if not match or (match["count"] and int(match["count"]) < 1):
        raise ValueError(f"{text[:40]!r} is not a GPU request like A100:8 or V100")
    return match["model"].upper(), int(match["count"] or 1)


def _quotas(kind: InstanceType, region: str, nodes: int, spot: bool) -> tuple[str, ...]:
    from sortie.infra.cloud_facts import SpecError
    from sortie.infra.quotas import quotas_needed
    from sortie.infra.spec import ClusterSpec

    try:
        spec = ClusterSpec.model_validate({
            "cluster": "plan", "cloud": kind.cloud, "region": region, "project": "plan",
            "instanceType": kind.name, "nodes": nodes, "spot": spot,
            "sshAllowedCidrs": ["192.0.2.0/24"]})
        return tuple(f"{q.name}: {q.needed} {q.unit}" for q in quotas_needed(spec))
    except (ValueError, SpecError):
        return ()


def excluded(cloud: str, region: str, exclude: tuple[str, ...]) -> bool:
    """Whether ``region`` of ``cloud`` is one the user's account cannot use: an entry of
    ``exclude`` is "REGION" (on any cloud) or "CLOUD:REGION"."""
    return region in exclude or f"{cloud}:{region}" in exclude


def offers(gpu: str, nodes: int, spot: bool = False, max_usd_per_hour: float | None = None,
           interconnect: str = "any", exclude: tuple[str, ...] = ()) -> list[Offer]:
    """Every catalog machine with ``gpu`` ("A100:8": that model, that many per node) in every
    region that offers it (but ``exclude``d ones), cheapest first at the asked terms;
    ``max_usd_per_hour`` caps the cluster's price at them. Ties keep the catalog's order (its
    reference region first), a recorded price before an estimate."""
    # The catalog loads on first use: every command's flags know GpuAsk (`exec` lists nothing).
    from sortie.infra.catalog import CATALOG

    model, per_node = parse_gpu(gpu)
    wanted = "infiniband" if interconnect == "ib" else interconnect
    found = []
    for kind in CATALOG.values():
        if kind.gpu_model.upper() != model or kind.gpus != per_node:
            continue
        if wanted != "any" and kind.interconnect != wanted:
            continue
        for region in kind.regions:
            if excluded(kind.cloud, region, exclude):
                continue
            price = kind.price(region)
            offer = Offer(kind.cloud, region, kind.name, kind.gpu_model, kind.gpus,
                          kind.gpu_memory_gb, kind.interconnect, nodes,
                          round(nodes * price.on_demand_usd_h, 4),
                          round(price.on_demand_usd_h + (nodes - 1) * price.spot_usd_h, 4),
                          _quotas(kind, region, nodes, spot), price.source, price.date,
                          price.region)
            if max_usd_per_hour is None or offer.usd_per_hour(spot) <= max_usd_per_hour:
                found.append(offer)
    return sorted(found, key=lambda o: (o.usd_per_hour(spot), o.estimated))


def why_none(gpu: str) -> str:
    """Why no catalog machine fits ``gpu`` when its model or count is the reason (a typo, a
    count machines are not made with), in words; "" when it is the other limits."""
    from sortie.infra.catalog import CATALOG

    model, per_node = parse_gpu(gpu)
    counts = sorted({kind.gpus for kind in CATALOG.values() if kind.gpu_model.upper() == model})
    if not counts:
        models = sorted({kind.gpu_model.upper() for kind in CATALOG.values()})
        return f"the catalog has no {model} machines; its GPUs: {', '.join(models)}"
    if per_node not in counts:
        shown = [str(count) for count in counts]
        either = " or ".join([", ".join(shown[:-1]), shown[-1]] if len(shown) > 1 else shown)
        return (f"the catalog's {model} machines have {either} GPUs each: ask "
                f"{model}:{shown[-1]}, say")
    return ""


def not_built(gpu: str) -> list[tuple[str, str, str]]:
    """(cloud, instance type, why) of the machines with ``gpu``'s model that sortie does not
    build yet: `plan --gpu` names them, so that a missing row is said, not silent."""
    from sortie.infra.clouds import CLOUDS, facts

    model, _ = parse_gpu(gpu)
    return [(cloud, name, why) for cloud in CLOUDS
            for name, gpu_model, why in facts(cloud).not_built if gpu_model.upper() == model]


def catalog_age_days(today: datetime.date | None = None, date: str | None = None) -> int:
    """Days since prices of ``date`` (a day, "2026-11-09", or a month, "2025-05": its first
    day) were recorded; by default the catalog's reference prices."""
    from sortie.infra.cloud_facts import PRICE_DATE

    year, month, *day = map(int, (date or PRICE_DATE).split("-"))
    return ((today or datetime.date.today()) - datetime.date(year, month, *(day or [1]))).days
