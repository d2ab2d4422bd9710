"""Per-region prices (`infra/<cloud>/prices.csv`): every row dated by its source's own date and
sourced, within the catalog's machines and regions; the refresh tool builds them from the
providers' price lists as public repositories keep them (Karpenter's providers' generated files,
SkyPilot's catalog: GCP there a machine type plus its GPUs) and holds out a figure far from the
reference."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sortie.infra.catalog import CATALOG
from sortie.infra.offers import catalog_age_days
from sortie.infra.price_refresh import (
    MOVED,
    PLAUSIBLE,
    Machine,
    catalog_machines,
    main,
    refresh,
)
from sortie.infra.prices import regional_prices, write_rows

pytestmark = pytest.mark.unit

# A SkyPilot vms.csv, as its GCP file is laid out: machine types, then GPUs priced apart.
GCP_VMS = """InstanceType,vCPUs,MemoryGiB,AcceleratorName,AcceleratorCount,GpuInfo,Region,\
AvailabilityZone,Price,SpotPrice
a2-highgpu-8g,96.0,680.0,,,,us-central1,us-central1-a,5.91582,2.36604
a2-highgpu-8g,96.0,680.0,,,,us-central1,us-central1-b,5.91582,2.36604
a2-highgpu-8g,96.0,680.0,,,,europe-west4,europe-west4-a,6.51251,2.54592
a2-highgpu-8g,96.0,680.0,,,,us-west1,us-west1-b,5.91582,
,,,A100,8,{'Gpus': [{'MemoryInfo': {'SizeInMiB': 40960}}]},us-central1,us-central1-a,23.47126,9.1776
,,,A100,8,{'Gpus': [{'MemoryInfo': {'SizeInMiB': 40960}}]},europe-west4,europe-west4-a,12.90919,9.35
,,,A100,8,{'Gpus': [{'MemoryInfo': {'SizeInMiB': 40960}}]},us-west1,us-west1-b,23.47126,9.1776
,,,A100-80GB,8,{'Gpus': [{'MemoryInfo': {'SizeInMiB': 81920}}]},us-central1,us-central1-a,40,20
"""
def source_in_prices_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cloud: str,
                          name: str, text: str) -> Path:
    """The clouds' price files moved under ``tmp_path`` (the shipped ones untouched), and a
    source file ``name`` holding ``text`` beside them."""
    import sortie.infra.prices as prices

    monkeypatch.setattr(prices, "HERE", tmp_path)
    (tmp_path / cloud).mkdir()
    source = tmp_path / name
    source.write_text(text)
    return source


A2 = Machine("gcp", "a2-highgpu-8g", "A100", 8, 40, ("us-central1", "europe-west4", "us-west1",
                                                      "us-east1"), 29.384)


def test_gcp_rows_add_the_gpus_and_hold_out_an_implausible_figure():
    rows, held_out = refresh([A2], GCP_VMS, "catalog @abc", "2026-11")
    by_region = {row["region"]: row for row in rows}
    assert set(by_region) == {"us-central1", "us-west1"}  # us-east1: not in the file
    central = by_region["us-central1"]
    assert float(central["on_demand_usd_h"]) == pytest.approx(5.91582 + 23.47126)
    assert float(central["spot_usd_h"]) == pytest.approx(2.36604 + 9.1776)
    assert (central["source"], central["date"]) == ("catalog @abc", "2026-11")
    assert by_region["us-west1"]["spot_usd_h"] == "", "no spot figure: the reference stands"
    # 6.5 + 12.9 = 19.4 against 29.4: a 40 GB A100 far under us-central1's is not a price
    assert held_out == ["a2-highgpu-8g in europe-west4: $19.4217/h against the reference "
                        "$29.38708/h"]


def test_the_tool_writes_the_clouds_file_that_the_catalog_then_reads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    source = source_in_prices_home(tmp_path, monkeypatch, "gcp", "vms.csv", GCP_VMS)
    assert main(["gcp", str(source), "--source", "catalog @abc", "--date", "2026-11-02"]) == 0
    out, err = capsys.readouterr()
    assert "gcp/prices.csv: 2 rows" in out and "held out (implausible): a2-highgpu-8g in " \
        "europe-west4" in err
    read = regional_prices("gcp")
    assert read["a2-highgpu-8g"]["us-central1"].on_demand_usd_h == pytest.approx(29.38708)
    assert read["a2-highgpu-8g"]["us-west1"].spot_usd_h is None
    assert {"a2-highgpu-1g", "a2-megagpu-16g"}.isdisjoint(read), "the 8-GPU rows only"
    write_rows(tmp_path / "gcp" / "prices.csv", [])
    assert regional_prices("gcp") == {}


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_every_shipped_row_is_a_catalog_machine_in_its_region_dated_and_sourced(cloud: str):
    rows = regional_prices(cloud)
    assert rows, f"{cloud}: no per-region prices shipped"
    machines = {m.name: m for m in catalog_machines(cloud)}
    for name, regions in rows.items():
        kind = CATALOG[name]
        for region, price in regions.items():
            assert region in machines[name].regions, (name, region)
            # a repository, a file and its commit; the source's own day, not a month read
            assert re.search(r"[\w-]+/[\w-]+ \S+ @[0-9a-f]{7}", price.source), price.source
            assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", price.date)
            assert catalog_age_days(date=price.date) >= 0
            # the reference region within a price change of the catalog's reference figure,
            # the others within a regional multiplier of it
            reference = regions.get(kind.reference_region)
            if region == kind.reference_region or reference is None:
                low, high = (f * kind.on_demand_usd_h for f in MOVED)
            else:
                low, high = (f * reference.on_demand_usd_h for f in PLAUSIBLE)
            assert low <= price.on_demand_usd_h <= high, (name, region)
            assert price.spot_usd_h is None or price.spot_usd_h < price.on_demand_usd_h
            assert kind.price(region).date == price.date  # the catalog reads them


def test_a_region_with_a_row_is_priced_at_its_own_spot_figure():
    kind = CATALOG["a2-highgpu-8g"]
    tokyo = kind.price("asia-northeast1")
    assert tokyo.region == "asia-northeast1" and tokyo.on_demand_usd_h > kind.on_demand_usd_h
    assert tokyo.spot_usd_h == kind.regional["asia-northeast1"].spot_usd_h


def test_a_region_without_a_row_is_priced_at_the_reference_regions_row_and_said_to_be():
    kind = CATALOG["p4d.24xlarge"]
    virginia = kind.regional["us-east-1"]
    ohio = kind.price("us-east-2")
    assert "us-east-2" not in kind.regional and ohio.region == "us-east-1"
    assert (ohio.on_demand_usd_h, ohio.source, ohio.date) == (
        virginia.on_demand_usd_h, virginia.source, virginia.date)
    # AWS's list has no spot figure: the reference's discount, and the source says estimate
    assert virginia.spot_usd_h is None and "spot: estimate" in virginia.source
    assert ohio.spot_usd_h == pytest.approx(
        virginia.on_demand_usd_h * kind.spot_usd_h / kind.on_demand_usd_h, abs=1e-3)


def test_a_spot_figure_no_cloud_would_give_is_held_out():
    """Fourth review (issue 61), Low 14: a spot price of $0.0001 against $32.77 on demand was
    written as the region's spot price (a launch then priced spot at nearly nothing)."""
    vms = GCP_VMS.replace("us-central1,us-central1-a,5.91582,2.36604",
                          "us-central1,us-central1-a,5.91582,0.00005").replace(
        "us-central1,us-central1-b,5.91582,2.36604", "us-central1,us-central1-b,5.91582,")
    vms = vms.replace("us-central1,us-central1-a,23.47126,9.1776",
                      "us-central1,us-central1-a,23.47126,0.00005")
    rows, held_out = refresh([A2], vms, "catalog @abc", "2026-11")
    central = next(row for row in rows if row["region"] == "us-central1")
    assert central["spot_usd_h"] == "", "held out: the reference spot figure stands"
    assert "a2-highgpu-8g in us-central1: spot $0.0001/h against $29.38708/h on demand" in \
        held_out


AWS_VMS = """InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,\
SpotPrice,Region,AvailabilityZone
p4d.24xlarge,A100,8.0,96.0,1152.0,,21.95764,9.8,us-east-1,use1-az1
p4d.24xlarge,A100,8.0,96.0,1152.0,,21.95764,,us-west-2,usw2-az1
p4d.24xlarge,A100,8.0,96.0,1152.0,,27.43,,eu-west-1,euw1-az2
"""
P4D = Machine("aws", "p4d.24xlarge", "A100", 8, 40, ("us-east-1", "us-west-2", "eu-west-1"),
              32.7726)


def test_a_price_cut_is_taken_and_a_tenfold_move_held_out():
    """Issue 64: AWS cut P4d by a third in June 2025; held against the old reference each
    region was "implausible", and the catalog kept pricing p4d at $32.77 for $21.96."""
    rows, held_out = refresh([P4D], AWS_VMS, "catalog @new", "2026-11-09")
    assert held_out == [] and {r["region"]: float(r["on_demand_usd_h"]) for r in rows} == {
        "us-east-1": 21.95764, "us-west-2": 21.95764, "eu-west-1": 27.43}
    tenfold = AWS_VMS.replace("21.95764", "3.27726").replace("27.43", "4.1")
    rows, held_out = refresh([P4D], tenfold, "catalog @bad", "2026-11-09")
    assert [r["region"] for r in rows] == [] and len(held_out) == 3, held_out


def test_a_source_dated_to_the_day_is_aged_from_that_day():
    import datetime

    today = datetime.date(2026, 11, 28)
    assert catalog_age_days(today, "2026-11-09") == 19
    assert catalog_age_days(today, "2026-11") == 27


# Karpenter's providers keep each cloud's price list in their repositories, regenerated from the
# providers' price APIs and dated: the shapes of their files, cut down.
KARPENTER_AWS = """package pricing

// generated at 2026-07-20T13:44:30Z for us-east-1

var InitialOnDemandPricesAWS = map[string]map[ec2types.InstanceType]float64{
\t// us-east-1
\t"us-east-1": {
\t\t// p4d family
\t\t"p4d.24xlarge": 21.957642,
\t\t// p5 family
\t\t"p5.48xlarge": 55.040000, "p5.4xlarge": 6.880000,
\t},
}
"""
KARPENTER_AZURE = """// generated at 2026-06-18T03:43:41Z
func init() {
\t// eastus
\tinitialOnDemandPrices["eastus"] = map[string]float64{
\t\t"Standard_ND96asr_v4":                   27.197000,
\t}
\t// westeurope
\tinitialOnDemandPrices["westeurope"] = map[string]float64{
\t\t"Standard_ND96asr_v4": 35.357000,
\t}
}
"""
KARPENTER_GCP = """{"prices": {"us-central1": {"on_demand": {"a2-highgpu-8g": 29.38708},
 "spot": {"a2-highgpu-8g": 15.42416}}, "us-west1": {"on_demand": {"a2-highgpu-8g": 29.38708}}}}"""


def test_karpenters_price_lists_are_read_with_their_own_dates():
    rows, held_out = refresh([P4D], KARPENTER_AWS, "karpenter-aws @6fc13b5", "2026-07-20",
                             "karpenter-aws")
    assert held_out == [] and [(r["region"], r["on_demand_usd_h"], r["spot_usd_h"])
                               for r in rows] == [("us-east-1", "21.95764", "")]
    from sortie.infra.price_refresh import read_source

    assert read_source(KARPENTER_AWS, "karpenter-aws")[1] == "2026-07-20"
    assert read_source(KARPENTER_AZURE, "karpenter-azure")[1] == "2026-06-18"
    nd = Machine("azure", "Standard_ND96asr_v4", "A100", 8, 40, ("eastus", "westeurope"), 27.197)
    rows, _ = refresh([nd], KARPENTER_AZURE, "karpenter-azure @2b431da", "2026-06-18",
                      "karpenter-azure")
    assert {r["region"]: float(r["on_demand_usd_h"]) for r in rows} == {
        "eastus": 27.197, "westeurope": 35.357}
    # GCP's list prices a machine type with its GPUs: nothing is added to it
    rows, _ = refresh([A2], KARPENTER_GCP, "karpenter-gcp @373e2ba", "2026-08-03",
                      "karpenter-gcp")
    assert {r["region"]: (r["on_demand_usd_h"], r["spot_usd_h"]) for r in rows} == {
        "us-central1": ("29.38708", "15.42416"), "us-west1": ("29.38708", "")}


def test_a_refresh_is_dated_by_its_source_never_by_the_day_it_ran(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    source = source_in_prices_home(tmp_path, monkeypatch, "aws", "pricing_aws.go", KARPENTER_AWS)
    assert main(["aws", str(source), "--format", "karpenter-aws", "--source", "k @6fc13b5"]) == 0
    assert regional_prices("aws")["p4d.24xlarge"]["us-east-1"].date == "2026-07-20"
    undated = tmp_path / "vms.csv"
    undated.write_text(AWS_VMS)
    with pytest.raises(SystemExit) as exit_:
        main(["aws", str(undated), "--source", "catalog @abc"])
    assert exit_.value.code == 2
    assert "--date: the source's own date" in capsys.readouterr().err


def test_an_attached_stack_is_priced_in_its_own_region():
    """A cluster made by `pulumi up` and attached was priced at the catalog's reference figures
    whatever its region said."""
    from sortie.fleet.attach_cluster import _usd_per_hour

    tokyo = CATALOG["a2-highgpu-8g"].price("asia-northeast1")
    outputs = {"instance_type": "a2-highgpu-8g", "region": "asia-northeast1",
               "nodes": [{"spot": False}, {"spot": True}]}
    assert tokyo.region == "asia-northeast1"
    assert _usd_per_hour(outputs) == pytest.approx(tokyo.on_demand_usd_h + tokyo.spot_usd_h)


def test_a_wrong_file_or_format_leaves_the_clouds_file_as_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    from sortie.infra.prices import prices_file

    source = source_in_prices_home(tmp_path, monkeypatch, "aws", "pricing_aws.go", KARPENTER_AWS)
    kept = [{"instance_type": "p4d.24xlarge", "region": "us-east-1", "on_demand_usd_h": "21.9",
             "spot_usd_h": "", "source": "k @6fc13b5", "date": "2026-07-20"}]
    write_rows(prices_file("aws"), kept)
    for form, said in (("karpenter-gcp", "not a readable karpenter-gcp price list"),
                       ("skypilot", "none of aws's catalog machines in it")):
        with pytest.raises(SystemExit) as exit_:
            main(["aws", str(source), "--format", form, "--source", "x", "--date", "2026-07-20"])
        assert exit_.value.code == 2 and said in capsys.readouterr().err
        assert regional_prices("aws")["p4d.24xlarge"]["us-east-1"].on_demand_usd_h == 21.9
