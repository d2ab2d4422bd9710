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


def test_the_most_nodes_is_what_the_local_backend_says_for_its_network(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A local cluster's limit is its backend's to say (`max_nodes`, as it chooses its network
    when it starts one): loopback's addresses, or its cluster network's; named before launch."""
    import os
    import shutil

    monkeypatch.delenv("SORTIE_LOCAL_USD_PER_HOUR", raising=False)  # (no price: no budget)
    monkeypatch.delenv("SORTIE_LOCAL_NETWORK", raising=False)
    assert plan_launch(tmp_path, LaunchAsk(nodes=254)).nodes == 254, "loopback's every address"
    with pytest.raises(UsageError, match="nodes: 255: a local cluster has at most 254"):
        plan_launch(tmp_path, LaunchAsk(nodes=255))
    if os.geteuid() != 0 or not all(map(shutil.which, ("ip", "tc", "nsenter"))):
        pytest.skip("a cluster network's limit is asked of it as root, with iproute2")
    monkeypatch.setenv("SORTIE_LOCAL_NETWORK", "netns")
    with pytest.raises(UsageError, match="nodes: 254: a local cluster has at most 253"):
        plan_launch(tmp_path, LaunchAsk(nodes=254))


def test_a_dry_run_of_the_bundled_trainer_says_its_limits(tmp_path: Path):
    """`run --dry-run`'s lines for the bundled trainer: no recovery and a budget said as such."""
    from sortie.engine.dry_run import dry_run
    from sortie.engine.request import Limits, RunRequest
    from sortie.stacks.local.local_backend import LocalBackend

    request = RunRequest(nodes=1, procs_per_node=2, steps=7, trainer_args=("--lr", "0.1"),
                         trainer_env={"NCCL_DEBUG": "INFO"}, run_id="exp", runs_dir=Path("r"),
                         limits=Limits(max_recoveries=0, max_cost_usd=2.5))
    said = dry_run(request, LocalBackend(tmp_path)).as_dict()
    assert said == {
        "dry_run": True, "started": False, "where": "1 node x 2 processes (local)",
        "job": "the bundled trainer under torchrun: 7 steps, a checkpoint every 20; its flags: "
               "--lr 0.1",
        "env": "NCCL_DEBUG=INFO", "recovery": "none (--max-recoveries 0)",
        "budget": "$2.50 at most (--max-cost)",
        "results": "r/exp/, verified; then the cluster is torn down", "notes": [],
        "warnings": []}


def test_a_dry_run_on_a_held_cluster_says_its_queue_as_asked(tmp_path: Path):
    """`exec NAME --dry-run`: the job waits for one running there, or with --no-queue is
    refused; the cluster is left running."""
    from sortie.engine.dry_run import dry_run
    from sortie.engine.request import RunRequest
    from sortie.stacks.local.local_backend import LocalBackend

    request = RunRequest(nodes=2, procs_per_node=1, runs_dir=Path("r"))
    waits = dry_run(request, LocalBackend(tmp_path), held="dev").as_dict()
    assert waits["where"] == "2 nodes x 1 process (local cluster dev)"
    assert waits["queue"].startswith("runs when dev is free") and "recovery" not in waits
    assert waits["results"] == "r/<run id>/, verified; dev left running"
    refused = dry_run(request, LocalBackend(tmp_path), held="dev", queue=False).as_dict()
    assert refused["queue"] == "refused if a job runs on dev (--no-queue)"
