"""`sortie plan --gpu`: where a cluster is cheapest, from the shipped catalog alone."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from sortie.infra.catalog import CATALOG
from sortie.infra.offers import catalog_age_days, offers, parse_gpu, why_none
from tests.helpers import sortie


@pytest.mark.unit
def test_every_cloud_and_region_with_the_gpu_is_listed_cheapest_first():
    found = offers("A100:8", nodes=2)
    clouds_with_a100 = {k.cloud for k in CATALOG.values() if k.gpu_model == "A100"}
    assert {o.cloud for o in found} == clouds_with_a100 == {"aws", "gcp", "azure"}
    prices = [o.on_demand_usd_h for o in found]
    assert prices == sorted(prices) and all(o.gpus_per_node == 8 for o in found)
    # one row per region that offers the machine
    p4d = [o for o in found if o.instance_type == "p4d.24xlarge"]
    assert {o.region for o in p4d} == set(CATALOG["p4d.24xlarge"].regions)
    virginia = next(o for o in p4d if o.region == "us-east-1")
    # AWS's June 2025 cut, as AWS's price list has it since (issue 64): $21.96, not $32.77
    assert virginia.on_demand_usd_h == pytest.approx(2 * 21.95764)
    assert found[0].instance_type == "p4d.24xlarge", "the cheapest 8 x A100 machine since"
    assert virginia.interconnect == "efa" and virginia.price_date and not virginia.estimated
    assert "Running On-Demand P instances: 192 vCPUs" in virginia.quotas


@pytest.mark.unit
def test_regions_are_priced_at_their_own_figure_where_the_catalog_has_one():
    found = {(o.instance_type, o.region): o for o in offers("A100:8", nodes=1)}
    tokyo, iowa = found["a2-highgpu-8g", "asia-northeast1"], found["a2-highgpu-8g", "us-central1"]
    assert tokyo.on_demand_usd_h > iowa.on_demand_usd_h and not tokyo.estimated
    assert "karpenter-provider-gcp" in tokyo.price_source and tokyo.price_date == "2026-08-03"
    # a region without its own figure: the reference region's recorded one, and said to be
    kind = CATALOG["p4d.24xlarge"]
    ireland = found["p4d.24xlarge", "eu-west-1"]
    assert "eu-west-1" not in kind.regional and ireland.estimated
    assert ireland.price_region == kind.reference_region == "us-east-1"
    assert ireland.on_demand_usd_h == pytest.approx(
        kind.regional["us-east-1"].on_demand_usd_h, abs=1e-3)
    assert ireland.price_date == kind.regional["us-east-1"].date != kind.price_date


@pytest.mark.unit
def test_excluded_regions_are_not_listed():
    everywhere = offers("A100:8", 2)
    some = offers("A100:8", 2, exclude=("us-east-1", "aws:us-west-2"))
    assert {o.region for o in some} >= {"us-east-2"}
    assert "us-east-1" not in {o.region for o in some}
    assert ("aws", "us-west-2") not in {(o.cloud, o.region) for o in some}
    assert len(some) < len(everywhere)


@pytest.mark.unit
def test_filters_and_spot_ranking():
    assert {o.interconnect for o in offers("A100:8", 2, interconnect="efa")} == {"efa"}
    assert {o.interconnect for o in offers("A100:8", 2, interconnect="ib")} == {"infiniband"}
    spot = offers("A100:8", 4, spot=True)
    assert [o.spot_usd_h for o in spot] == sorted(o.spot_usd_h for o in spot)
    cheapest = spot[0].spot_usd_h
    assert all(o.spot_usd_h == cheapest
               for o in offers("A100:8", 4, spot=True, max_usd_per_hour=cheapest))
    assert offers("V100", 1)[0].instance_type == "p3.2xlarge"
    assert offers("A100:3", 2) == []
    with pytest.raises(ValueError, match="not a GPU request like A100:8"):
        parse_gpu("8xA100")


@pytest.mark.unit
def test_the_catalog_says_how_old_its_prices_are():
    assert catalog_age_days(datetime.date(2025, 5, 31)) == 30
    assert catalog_age_days(datetime.date(2026, 11, 2), date="2026-11") == 1


@pytest.mark.e2e
def test_plan_gpu_prints_json_and_warns_about_an_old_catalog(tmp_path: Path):
    done = sortie("plan", "--gpu", "A100:8", "--nodes", "2", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["catalog_date"] and len(document["offers"]) >= 3
    table = sortie("plan", "--gpu", "A100:8", "--nodes", "2", cwd=tmp_path)
    oldest = min(offer["price_date"] for offer in document["offers"])
    assert document["catalog_date"] == oldest
    assert document["catalog_age_days"] == catalog_age_days(date=oldest)
    # the warning is true: there past 90 days, not before
    assert ("the catalog's prices are" in table.stdout) == (catalog_age_days(date=oldest) > 90)
    # the H200 machines sortie does not build are named in both forms, each with why
    h200 = sortie("plan", "--gpu", "H200:8", "--nodes", "2", "--json", cwd=tmp_path)
    unbuilt = {row["instance_type"]: row["why"] for row in json.loads(h200.stdout)["not_built"]}
    assert set(unbuilt) == {"p5e.48xlarge", "a3-ultragpu-8g"} and "Capacity Blocks" in \
        unbuilt["p5e.48xlarge"]
    assert "not built here: gcp a3-ultragpu-8g" in sortie(
        "plan", "--gpu", "H200:8", cwd=tmp_path).stdout
    # nothing built for B200 yet: said, and no price age to warn of (before: "577 days old")
    b200 = json.loads(sortie("plan", "--gpu", "B200:8", "--json", cwd=tmp_path).stdout)
    assert b200["offers"] == [] and b200["catalog_age_days"] == 0 and b200["catalog_date"] is None
    assert {row["instance_type"] for row in b200["not_built"]} >= {"p6-b200.48xlarge",
                                                                  "a4-highgpu-8g"}
    neither = sortie("plan", cwd=tmp_path)
    assert neither.returncode == 2 and "--stack or --gpu" in neither.stderr


@pytest.mark.unit
def test_a_gpu_no_machine_is_made_with_says_what_the_catalog_has():
    # Before: "nothing in the catalog fits", and --gpu's error spoke of excluded regions that
    # were none.
    counts = sorted({kind.gpus for kind in CATALOG.values() if kind.gpu_model == "V100"})
    assert offers("V100:3", 1) == [] and 3 not in counts
    assert why_none("V100:3") == (f"the catalog's V100 machines have {counts[0]}, {counts[1]} "
                                  f"or {counts[2]} GPUs each: ask V100:{counts[-1]}, say")
    assert why_none("h100:8") == ""  # it fits: any other miss is the price or the regions
    models = sorted({kind.gpu_model for kind in CATALOG.values()})
    assert why_none("A10G:1") == f"the catalog has no A10G machines; its GPUs: {', '.join(models)}"
