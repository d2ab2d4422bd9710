"""The instance catalog: which GPU machines sortie launches, where, and what they cost, from every
cloud's facts (`infra/<cloud>/facts.py`).

Prices are public list prices (Linux, on-demand) for one region per cloud, with the date they were
recorded and where they come from; spot figures are typical prices, which move daily. They are for
estimates before launch (`sortie plan`), never for billing. Refresh them when they age.
"""

from __future__ import annotations

from sortie.infra.cloud_facts import InstanceType
from sortie.infra.clouds import CLOUDS, facts

CATALOG: dict[str, InstanceType] = {
    machine.name: machine for cloud in CLOUDS for machine in facts(cloud).instance_types}


def expected_busbw(instance_type: str | None) -> tuple[float, str] | None:
    """(GB/s, source) of a published all-reduce bus bandwidth for the instance type, if any."""
    kind = CATALOG.get(instance_type or "")
    return (kind.busbw_gbs, kind.busbw_source) if kind and kind.busbw_gbs else None


def instance_types(cloud: str) -> list[str]:
    """The catalog's instance type names for one cloud."""
    return [t.name for t in CATALOG.values() if t.cloud == cloud]
