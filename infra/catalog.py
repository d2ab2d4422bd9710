"""The instance catalog: which GPU machines sortie launches, where, and what they cost, from every
cloud's facts (`infra/<cloud>/facts.py`).

Prices are public list prices (Linux, on-demand) for one region per cloud, with the date they were
recorded and where they come from; spot figures are typical prices, which move daily. They are for
estimates before launch (`sortie plan`), never for billing. Refresh them when they age.
"""

from __future__ import annotations

from sortie.core.inventory import Expected
from sortie.infra.cloud_facts import InstanceType
from sortie.infra.clouds import CLOUDS, facts


def _by_name() -> dict[str, InstanceType]:
    """Every cloud's machines by name: a name two clouds' facts give is refused (a profile
    names its machine alone: the second would hide the first)."""
    found: dict[str, InstanceType] = {}
    for cloud in CLOUDS:
        for machine in facts(cloud).instance_types:
            if (seen := found.get(machine.name)) is not None:
                raise ValueError(f"instance type {machine.name} is in both {seen.cloud}'s and "
                                 f"{cloud}'s facts: the catalog names each machine once")
            found[machine.name] = machine
    return found


CATALOG = _by_name()


def expected_busbw(instance_type: str | None) -> tuple[float, str] | None:
    """(GB/s, source) of a published all-reduce bus bandwidth for the instance type, if any."""
    kind = CATALOG.get(instance_type or "")
    return (kind.busbw_gbs, kind.busbw_source) if kind and kind.busbw_gbs else None


def expected(instance_type: str | None) -> Expected | None:
    """What the health gate holds a node of the instance type to (None: not a catalog machine,
    as local, attached and Slurm nodes are): its bus bandwidth and its fabric's devices."""
    kind = CATALOG.get(instance_type or "")
    if kind is None:
        return None
    counted = kind.interconnect in ("efa", "infiniband") and kind.network_cards
    return Expected(expected_busbw(instance_type), kind.interconnect if counted else None,
                    kind.network_cards if counted else 0, kind.fabric_gbps)


def instance_types(cloud: str) -> list[str]:
    """The catalog's instance type names for one cloud."""
    return [t.name for t in CATALOG.values() if t.cloud == cloud]
