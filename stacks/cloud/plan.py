"""`sortie plan`: what a profile will create and cost, from the real program run offline."""

from __future__ import annotations

from typing import Any

import pydantic

from sortie.core.errors import UsageError
from sortie.infra.cloud_facts import Quota
from sortie.infra.offline import evaluate
from sortie.infra.program import describe_interconnect, summarize_security
from sortie.infra.quotas import quotas_needed
from sortie.infra.review import Evaluation, SecuritySummary
from sortie.infra.spec import CostEstimate, SpecError, estimate_cost
from sortie.stacks.profiles import apply_overrides, load_profile, profile_names, profile_path

SECRET_OUTPUTS = ("client_private_key",)
PLANNED_SPEC_FIELDS = {"cloud", "region", "zone", "instance_type", "nodes", "spot", "ttl_hours"}


class PlannedResource(pydantic.BaseModel):
    type: str  # the type token, e.g. "aws:ec2/vpc:Vpc"
    name: str
    urn: str
    parent: str  # the parent's URN: a part, the cluster component, or the stack
    inputs: dict[str, Any]  # as declared, secrets "[secret]" (as `pulumi preview --json`)


class Plan(pydantic.BaseModel):
    """What `sortie plan --json` prints: the profile's cluster, every resource the program
    declares, the security reading, the cost, and the outputs (secrets left out)."""

    model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)

    stack: str
    cloud: str
    region: str
    zone: str | None
    instance_type: str
    nodes: int
    spot: bool
    ttl_hours: float
    # What every node boots: an AMI name filter (its newest available match), a GCP image, an
    # Azure URN, or the profile's `image`; `image_line` says which image line it is.
    image: str
    image_line: str
    interconnect: str  # between the nodes, and why (e.g. Azure: InfiniBand or TCP)
    resources: list[PlannedResource]
    security: SecuritySummary
    cost: CostEstimate
    quotas: list[Quota]  # what the cluster counts against: ask for these before launching
    outputs: dict[str, Any]
    evaluation: Evaluation = pydantic.Field(exclude=True, repr=False)  # what `plan` draws


def make_plan(stack: str, overrides: tuple[str, ...] = ()) -> Plan:
    """Evaluate profile `stack` (plus `--set` overrides) offline. Bad settings: UsageError."""
    config = apply_overrides(load_profile(stack), overrides)
    try:
        evaluation = evaluate(config, stack)
    except SpecError as exc:
        raise UsageError(f"profile {stack}: {exc}") from None
    spec = evaluation.spec
    return Plan(
        stack=stack, **spec.model_dump(include=PLANNED_SPEC_FIELDS),
        image=spec.image or spec.instance.image,
        image_line="the profile's own image (sortie:image)" if spec.image else
        spec.instance.image_line, interconnect=describe_interconnect(spec),
        resources=[PlannedResource(type=r.type, name=r.name, urn=r.urn, parent=r.parent,
                                   inputs=r.inputs) for r in evaluation.resources],
        security=summarize_security(evaluation), cost=estimate_cost(spec),
        quotas=quotas_needed(spec),
        outputs={k: v for k, v in evaluation.outputs.items() if k not in SECRET_OUTPUTS},
        evaluation=evaluation)


class ProfileRow(pydantic.BaseModel):
    """A line of `sortie profiles`: what a profile makes and costs (or why it cannot be read)."""

    name: str
    path: str
    cloud: str | None = None
    region: str | None = None
    instance_type: str | None = None
    nodes: int | None = None
    spot: bool | None = None
    usd_per_hour: float | None = None  # at its launch terms
    error: str | None = None


def profile_rows() -> list[ProfileRow]:
    """Every profile found (the user's directories first, then the shipped ones), read without
    evaluating the program: a profile that cannot be read says why in its row."""
    from sortie.stacks.cloud.stack_api import spec_from_config

    rows = []
    for name in profile_names():
        path = profile_path(name)
        assert path is not None
        try:
            spec = spec_from_config(name, load_profile(name))
        except UsageError as exc:
            rows.append(ProfileRow(name=name, path=str(path), error=str(exc)))
            continue
        rows.append(ProfileRow(
            name=name, path=str(path), cloud=spec.cloud, region=spec.region,
            instance_type=spec.instance_type, nodes=spec.nodes, spot=spec.spot,
            usd_per_hour=round(estimate_cost(spec).usd_per_hour(spec.spot), 2)))
    return rows
