"""Per-region prices (`infra/<cloud>/prices.csv`): every row dated and sourced, within the
catalog's machines and regions; the refresh tool builds them from a SkyPilot catalog file (GCP:
a machine type plus its GPUs) and holds out a figure far from the reference."""

from __future__ import annotations

from pathlib import Path

import pytest

from sortie.infra.catalog import CATALOG
from sortie.infra.offers import catalog_age_days
from sortie.infra.price_refresh import Machine, catalog_machines, main, refresh
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
    import sortie.infra.prices as prices

    monkeypatch.setattr(prices, "HERE", tmp_path)
    (tmp_path / "gcp").mkdir()
    source = tmp_path / "vms.csv"
    source.write_text(GCP_VMS)
    assert main(["gcp", str(source), "--source", "catalog @abc", "--date", "2026-11"]) == 0
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
            assert "skypilot-org/skypilot-catalog" in price.source and "@" in price.source
            assert catalog_age_days(date=price.date) >= 0
            low, high = 0.75 * kind.on_demand_usd_h, 2 * kind.on_demand_usd_h
            assert low <= price.on_demand_usd_h <= high, (name, region)
            assert price.spot_usd_h is None or price.spot_usd_h < price.on_demand_usd_h
            assert kind.price(region).date == price.date  # the catalog reads them


def test_a_region_with_a_row_is_priced_at_its_own_spot_figure():
    kind = CATALOG["Standard_ND96asr_v4"]
    south = kind.price("southcentralus")
    assert south.region == "southcentralus" and south.on_demand_usd_h > kind.on_demand_usd_h
    assert south.spot_usd_h == kind.regional["southcentralus"].spot_usd_h
    europe = kind.price("westeurope")  # no row: the reference figures, and said to be
    assert europe.region == kind.reference_region and europe.spot_usd_h == kind.spot_usd_h


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
