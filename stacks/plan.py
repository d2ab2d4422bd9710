"""`sortie plan`: what a profile will create and cost, from the real program run offline."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from bootstrap.errors import UsageError
from infra.offline import evaluate
from infra.program import summarize_security
from infra.review import Evaluation, SecuritySummary
from infra.spec import CostEstimate, SpecError, estimate_cost
from stacks.profiles import apply_overrides, load_profile

SECRET_OUTPUTS = ("client_private_key",)


@dataclass
class Plan:
    stack: str
    evaluation: Evaluation
    security: SecuritySummary
    cost: CostEstimate

    def to_json(self) -> dict[str, Any]:
        spec = self.evaluation.spec
        return {
            "stack": self.stack,
            "cloud": spec.cloud, "region": spec.region, "zone": spec.zone,
            "instance_type": spec.instance_type, "nodes": spec.nodes, "spot": spec.spot,
            "ttl_hours": spec.ttl_hours,
            "resources": [{"type": r.type, "name": r.name, "urn": r.urn, "parent": r.parent}
                          for r in self.evaluation.resources],
            "security": {**asdict(self.security), "world_ssh": self.security.world_ssh},
            "cost": {**asdict(self.cost), "on_demand_ttl_usd": self.cost.on_demand_ttl_usd,
                     "spot_ttl_usd": self.cost.spot_ttl_usd},
            "outputs": {k: v for k, v in self.evaluation.outputs.items()
                        if k not in SECRET_OUTPUTS},
        }


def make_plan(stack: str, overrides: tuple[str, ...] = ()) -> Plan:
    """Evaluate profile `stack` (plus `--set` overrides) offline. Bad settings: UsageError."""
    config = apply_overrides(load_profile(stack), overrides)
    try:
        evaluation = evaluate(config, stack)
    except SpecError as exc:
        raise UsageError(f"profile {stack}: {exc}") from None
    return Plan(stack, evaluation, summarize_security(evaluation),
                estimate_cost(evaluation.spec))
