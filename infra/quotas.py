"""The cloud quotas a cluster needs, so that a user can ask for them before the first launch
(`sortie plan` lists them). A new account's GPU quotas are often 0, and a launch that hits one
fails after the network and bucket were made.

Each cloud says what it counts (`infra/<cloud>/facts.py`): quota names are the ones the clouds'
quota pages show; the defaults given are the documented ones for a new account, where a cloud
documents one (otherwise None: look it up).
"""

from __future__ import annotations

from sortie.infra.cloud_facts import Quota
from sortie.infra.clouds import facts
from sortie.infra.spec import ClusterSpec


def quotas_needed(spec: ClusterSpec) -> list[Quota]:
    """What the cluster counts against, at most: a spot worker may fall back to on-demand, so
    it counts against both."""
    spot = sum(spec.is_spot(i) for i in range(spec.nodes))
    on_demand = spec.nodes if spec.spot_fallback_on_demand else spec.nodes - spot
    return facts(spec.cloud).quotas(spec, on_demand, spot)
