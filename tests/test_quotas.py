"""What `sortie plan` says a cluster needs and costs beyond compute: quotas to ask for before a
first launch hits them, and what stays billed after the TTL until teardown."""

from __future__ import annotations

import pytest

from sortie.infra.azure.facts import AZURE_FAMILIES
from sortie.infra.catalog import CATALOG
from sortie.infra.quotas import quotas_needed
from sortie.stacks.cloud.plan import make_plan

pytestmark = pytest.mark.unit


def by_name(stack: str, *settings: str) -> dict:
    return {q.name: q for q in make_plan(stack, settings).quotas}


def test_p4d_counts_vcpus_and_one_elastic_ip_per_node():
    quotas = by_name("aws-p4d", "nodes=6")
    assert quotas["Running On-Demand P instances"].needed == 6 * 96
    ips = quotas["EC2-VPC Elastic IPs"]
    assert (ips.needed, ips.default, ips.over_default) == (6, 5, True)
    assert not by_name("aws-p4d", "nodes=5")["EC2-VPC Elastic IPs"].over_default
    assert "All P Spot Instance Requests" not in quotas  # the profile runs on-demand


def test_a_spot_worker_that_may_fall_back_counts_against_both():
    quotas = by_name("aws-p4d", "nodes=3", "spot=true")
    assert quotas["All P Spot Instance Requests"].needed == 2 * 96  # the head is on-demand
    assert quotas["Running On-Demand P instances"].needed == 3 * 96
    no_fallback = by_name("aws-p4d", "nodes=3", "spot=true", "spotFallbackOnDemand=false")
    assert no_fallback["Running On-Demand P instances"].needed == 96
    assert "EC2-VPC Elastic IPs" not in by_name("aws-p3-dev"), "one card: no Elastic IP"


def test_gcp_counts_gpus_by_memory_and_spot():
    quotas = by_name("gcp-a2", "instanceType=a2-ultragpu-8g", "zone=us-central1-a",
                     "nodes=2", "spot=true", "spotFallbackOnDemand=false")
    assert quotas["PREEMPTIBLE_NVIDIA_A100_80GB_GPUS"].needed == 8
    assert quotas["NVIDIA_A100_80GB_GPUS"].needed == 8  # the head
    assert quotas["GPUS_ALL_REGIONS"].needed == 16 and quotas["A2_CPUS"].needed == 192
    accounts = quotas["Service accounts"]  # one per node (each reads its own host key)
    assert (accounts.needed, accounts.default, accounts.over_default) == (2, 100, False)
    # 101 nodes' accounts: counted from the plan's spec (running the program for 101 nodes
    # took 5 s of the unit half to say the same)
    spec = make_plan("gcp-a2").evaluation.spec
    assert spec.nodes < 101  # (so that the copy below asks for more)
    [accounts] = [q for q in quotas_needed(spec.model_copy(update={"nodes": 101}))
                  if q.name == "Service accounts"]
    assert accounts.needed == 101 and accounts.over_default


def test_every_azure_size_has_its_family_quota():
    assert {t.name for t in CATALOG.values() if t.cloud == "azure"} == set(AZURE_FAMILIES)
    quotas = by_name("azure-nd96")
    assert quotas["Standard NDASv4_A100 Family vCPUs"].needed == \
        make_plan("azure-nd96").nodes * 96


def test_plan_json_carries_the_quotas():
    plan = make_plan("aws-p4d")
    document = plan.model_dump(mode="json")
    assert document["quotas"][0]["name"] == "Running On-Demand P instances"
    assert quotas_needed(plan.evaluation.spec) == plan.quotas


def test_what_stays_billed_after_the_ttl_until_teardown():
    azure = make_plan("azure-nd96").cost
    assert azure.idle_usd_h > 0 and "OS disks" in azure.idle_what  # deallocated, not deleted
    p4d = make_plan("aws-p4d").cost
    assert p4d.idle_usd_h == 2 * 0.005 and "Elastic IPs" in p4d.idle_what
    assert make_plan("gcp-a2").cost.idle_usd_h == 0  # GCP deletes the VMs and their disks
    assert make_plan("aws-p3-dev").cost.idle_usd_h == 0  # its address goes with the node
