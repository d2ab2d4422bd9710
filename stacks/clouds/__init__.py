"""One home per cloud: `stacks/clouds/<cloud>.py` holds everything the controller knows about
it (preemption notice lead time, credential check, bucket, the tag sweep and how to remove each
leftover) behind the one small interface of `base.Cloud`, found by the cloud's name in
`infra/clouds.py`. The cloud's Pulumi program and facts are in `infra/<cloud>/`, and the node
side of its preemption notice is in `trainer/preempt.py` (the trainer runs alone on the nodes)."""

from __future__ import annotations

import importlib

from infra.clouds import CLOUDS as CLOUD_NAMES
from infra.spec import ClusterSpec
from sortie.core.errors import first_line
from stacks.backend import Leftover
from stacks.clouds.base import Cloud

CLOUDS: dict[str, Cloud] = {
    name: importlib.import_module(f"stacks.clouds.{name}").CLOUD for name in CLOUD_NAMES}


def sweep(spec: ClusterSpec) -> list[Leftover]:
    """Every resource the cloud still has that carries the cluster's tag. A sweep that cannot
    run (no SDK, no project or subscription, an API error) is itself a leftover: an unproven
    teardown never reads as "0 resources remain"."""
    try:
        return CLOUDS[spec.cloud].leftovers(spec)
    except Exception as exc:  # any failure to ask leaves the teardown unproven
        reason = first_line(exc)
        label = "=".join(spec.sweep_tag)
        return [Leftover("unswept", f"{spec.cloud} resources tagged {label}",
                         f"the tag sweep failed ({reason}); fix that and run "
                         f"`sortie down {spec.cluster}` again")]
