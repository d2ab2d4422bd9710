"""`sortie plan --gpu`: where a cluster is cheapest, from the shipped catalog alone."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from infra.catalog import CATALOG
from infra.offers import catalog_age_days, offers, parse_gpu
from tests.helpers import sortie


@pytest.mark.unit
def test_every_cloud_with_the_gpu_is_listed_cheapest_first():
    found = offers("A100:8", nodes=2)
    clouds_with_a100 = {k.cloud for k in CATALOG.values() if k.gpu_model == "A100"}
    assert {o.cloud for o in found} == clouds_with_a100 == {"aws", "gcp", "azure"}
    prices = [o.on_demand_usd_h for o in found]
    assert prices == sorted(prices) and all(o.gpus_per_node == 8 for o in found)
    p4d = next(o for o in found if o.instance_type == "p4d.24xlarge")
    assert p4d.on_demand_usd_h == pytest.approx(2 * CATALOG["p4d.24xlarge"].on_demand_usd_h)
    assert p4d.interconnect == "efa" and p4d.price_date and "aws.amazon.com" in p4d.price_source
    assert "Running On-Demand P instances: 192 vCPUs" in p4d.quotas


@pytest.mark.unit
def test_filters_and_spot_ranking():
    assert {o.interconnect for o in offers("A100:8", 2, interconnect="efa")} == {"efa"}
    assert {o.interconnect for o in offers("A100:8", 2, interconnect="ib")} == {"infiniband"}
    spot = offers("A100:8", 4, spot=True)
    assert [o.spot_usd_h for o in spot] == sorted(o.spot_usd_h for o in spot)
    cheapest = spot[0].spot_usd_h
    assert offers("A100:8", 4, spot=True, max_usd_per_hour=cheapest) == spot[:1]
    assert offers("V100", 1)[0].instance_type == "p3.2xlarge"
    assert offers("A100:3", 2) == []
    with pytest.raises(ValueError, match="not a GPU request like A100:8"):
        parse_gpu("8xA100")


@pytest.mark.unit
def test_the_catalog_says_how_old_its_prices_are():
    assert catalog_age_days(datetime.date(2025, 5, 31)) == 30


@pytest.mark.e2e
def test_plan_gpu_prints_json_and_warns_about_an_old_catalog(tmp_path: Path):
    done = sortie("plan", "--gpu", "A100:8", "--nodes", "2", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["catalog_date"] and len(document["offers"]) >= 3
    table = sortie("plan", "--gpu", "A100:8", "--nodes", "2", cwd=tmp_path)
    if catalog_age_days() > 90:
        assert "the catalog's prices are" in table.stdout
    neither = sortie("plan", cwd=tmp_path)
    assert neither.returncode == 2 and "--stack or --gpu" in neither.stderr
