"""One plan per launch (`sortie/engine/launch_plan.py`): where, how many nodes, at what price,
and the budget's verdict, decided before anything starts (before: `run` and `up` each repeated
target, count, cost, pricing and budget check in the command line)."""

from __future__ import annotations

import getpass
from pathlib import Path

import pytest

from sortie.core.errors import UsageError
from sortie.cost.budgets import OwnerBudgets, write_budgets
from sortie.engine.launch_plan import plan_launch
from sortie.fleet.launch_ask import LaunchAsk

pytestmark = pytest.mark.unit


def test_local_nodes_are_planned_at_their_notional_price_or_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("SORTIE_LOCAL_USD_PER_HOUR", raising=False)
    plan = plan_launch(tmp_path, LaunchAsk(nodes=3))
    assert plan.nodes == 3 and plan.cost is None and plan.pricing.usd_per_hour is None
    assert plan_launch(tmp_path, LaunchAsk()).nodes == 2, "the local default"
    with pytest.raises(UsageError, match="--max-cost: this cluster has no price"):
        plan_launch(tmp_path, LaunchAsk(), 5.0)
    monkeypatch.setenv("SORTIE_LOCAL_USD_PER_HOUR", "3600")
    plan = plan_launch(tmp_path, LaunchAsk(nodes=2), 5.0)
    assert plan.pricing.usd_per_hour == 7200.0 and "$3600/h a node" in plan.pricing.terms


def test_the_owners_budget_is_the_plans_to_refuse(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SORTIE_LOCAL_USD_PER_HOUR", "36")
    write_budgets(tmp_path, OwnerBudgets(monthly_usd={getpass.getuser(): 5.0}))
    assert plan_launch(tmp_path, LaunchAsk(nodes=1), 4.0).nodes == 1
    with pytest.raises(UsageError, match=r"may cost up to \$6.00 \(its --max-cost\)"):
        plan_launch(tmp_path, LaunchAsk(nodes=1), 6.0)
    with pytest.raises(UsageError, match=r"has no bound \(\$36.00/h, and no TTL ends it\)"):
        plan_launch(tmp_path, LaunchAsk(nodes=1))
    with pytest.raises(UsageError, match="nodes: 999"):
        plan_launch(tmp_path, LaunchAsk(nodes=999))
