"""Refresh `infra/<cloud>/prices.csv` (`infra/prices.py`) from a provider's price list as a
public repository keeps it:

    python -m sortie.infra.price_refresh CLOUD FILE --format FORMAT --source 'WHAT @COMMIT'
        [--date YYYY-MM-DD]

The formats (each refreshed from the provider's own price API, and dated):
- `karpenter-aws`: aws/karpenter-provider-aws `pkg/providers/pricing/zz_generated.pricing_aws.go`
  (the AWS Price List API, on-demand Linux; its "generated at" line dates it);
- `karpenter-azure`: Azure/karpenter-provider-azure `pkg/providers/pricing/zz_generated.pricing.go`
  (the Azure Retail Prices API, on-demand, every region; dated the same way);
- `karpenter-gcp`: cloudpilot-ai/karpenter-provider-gcp `pkg/providers/pricing/initial-prices.json`
  (the Cloud Billing Catalog, on-demand and spot, a machine type with its GPUs; `--date`: the
  commit's date);
- `skypilot`: skypilot-org/skypilot-catalog `catalogs/v7/{aws,gcp}/vms.csv`,
  `catalogs/v6/azure/vms.csv` (on GCP the machine type plus its GPUs, priced apart; `--date`).

A row is dated by its source's own date (when the figures were set), never by when it was read.
Each of the cloud's catalog machines is taken in each of its regions (the lowest of a region's
zones) and the cloud's file is rewritten: a region the source lacks has no row (the reference
region's figure stands for it, said as an estimate). A figure far from the machine's reference
(below 3/4 or above twice it), or a spot figure under a twentieth of the on-demand one, is held
out and said, not written: such a row is likelier an error of the source (a committed-use rate,
another GPU's row) than a regional price.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sortie.infra.clouds import CLOUDS, facts
from sortie.infra.prices import prices_file, write_rows

PLAUSIBLE = (0.75, 2.0)  # a regional on-demand figure, as a multiple of the reference one
# How far the reference region's own figure may have moved since the catalog's reference was
# set: providers do cut GPU prices by a third or more at once (AWS, June 2025: P4d by 33 %,
# P5 by up to 45 %), which the regional rule above held out as an error; a tenfold move is not
# a price change.
MOVED = (0.4, 2.5)
# A spot figure below this share of the on-demand one is no discount a cloud gives (theirs reach
# ~90% off): a source's error, held out and said like an on-demand one.
SPOT_FLOOR = 0.05


@dataclass(frozen=True)
class Machine:
    """What the refresh needs of a catalog machine."""

    cloud: str
    name: str
    gpu_model: str
    gpus: int
    gpu_memory_gb: int
    regions: tuple[str, ...]
    reference_usd_h: float


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text else None
    except ValueError:
        return None
    return value if value and value > 0 else None


FORMATS = ("karpenter-aws", "karpenter-azure", "karpenter-gcp", "skypilot")
GENERATED_AT = re.compile(r"^// generated at (\d{4}-\d{2}-\d{2})T", re.MULTILINE)
# A Go map's region key ("us-east-1": {, or initialOnDemandPrices["eastus"] = map[...]{) and
# an entry ("p4d.24xlarge": 21.957642,).
GO_REGION = re.compile(r'^\s*(?:initialOnDemandPrices\[)?"([a-z0-9-]+)"\]?\s*(?::|=)[^"\n]*\{\s*$')
GO_PRICE = re.compile(r'"([A-Za-z0-9_.-]+)":\s*([0-9.]+)')
Row = dict[str, str]


def _go_rows(text: str) -> list[Row]:
    """The (region, machine, on-demand) entries of a Karpenter provider's generated Go map."""
    rows: list[Row] = []
    region = ""
    for line in text.splitlines():
        if (start := GO_REGION.match(line)) is not None:
            region = start[1]
            continue
        rows.extend({"InstanceType": name, "Region": region, "Price": price, "SpotPrice": ""}
                    for name, price in GO_PRICE.findall(line) if region)
    return rows


def _gcp_json_rows(text: str) -> list[Row]:
    """cloudpilot-ai/karpenter-provider-gcp's {"prices": {region: {"on_demand": {..},
    "spot": {..}}}}: a machine type's figure there includes its GPUs."""
    rows: list[Row] = []
    for region, terms in json.loads(text)["prices"].items():
        spot = terms.get("spot") or {}
        rows.extend({"InstanceType": name, "Region": region, "Price": str(price),
                     "SpotPrice": str(spot.get(name, ""))}
                    for name, price in (terms.get("on_demand") or {}).items())
    return rows


def read_source(text: str, form: str) -> tuple[list[Row], str | None]:
    """A source file's rows in SkyPilot's columns, and the date the file carries (if any)."""
    if form == "skypilot":
        return list(csv.DictReader(io.StringIO(text))), None
    stamp = GENERATED_AT.search(text)
    rows = _gcp_json_rows(text) if form == "karpenter-gcp" else _go_rows(text)
    return rows, stamp[1] if stamp else None


def _lowest(rows: Iterable[dict[str, str]]) -> tuple[float, float | None] | None:
    """(on-demand, spot) of a region's rows (its zones): the lowest of each."""
    rows = list(rows)
    on_demand = [v for r in rows if (v := _number(r.get("Price"))) is not None]
    spot = [v for r in rows if (v := _number(r.get("SpotPrice"))) is not None]
    return (min(on_demand), min(spot) if spot else None) if on_demand else None


def _gpu_name(machine: Machine) -> str:
    """SkyPilot's accelerator name for the machine's GPUs ("A100-80GB" for 80 GB A100s)."""
    return f"{machine.gpu_model}-80GB" if machine.gpu_memory_gb == 80 else machine.gpu_model


def _figures(table: list[Row], machine: Machine, region: str,
             gpus_apart: bool) -> tuple[float, float | None] | None:
    """(on-demand, spot) of ``machine`` in ``region`` from a source's rows (``gpus_apart``:
    SkyPilot's GCP file, the machine type plus its GPUs, priced apart), or None."""
    vm = _lowest(r for r in table if r.get("InstanceType") == machine.name
                 and r.get("Region") == region)
    if gpus_apart and vm is not None:
        gpus = _lowest(r for r in table if not r.get("InstanceType")
                       and r.get("AcceleratorName") == _gpu_name(machine)
                       and r.get("AcceleratorCount") in (str(machine.gpus), f"{machine.gpus}.0")
                       and r.get("Region") == region)
        vm = None if gpus is None else (
            vm[0] + gpus[0], None if vm[1] is None or gpus[1] is None else vm[1] + gpus[1])
    return vm


def refresh(machines: Iterable[Machine], text: str, source: str, date: str,
            form: str = "skypilot") -> tuple[list[Row], list[str]]:
    """The rows for ``machines`` from a source file of ``form``, and what was held out (and
    why)."""
    table, _ = read_source(text, form)
    rows, held_out = [], []
    for machine in machines:
        gpus_apart = form == "skypilot" and machine.cloud == "gcp"
        figures = {region: vm for region in machine.regions
                   if (vm := _figures(table, machine, region, gpus_apart)) is not None}
        # Regions are held against the source's own reference-region figure (a regional
        # multiplier), that one against the catalog's reference (a move over time).
        reference = machine.reference_usd_h
        now = figures.get(machine.regions[0])
        if now is not None and MOVED[0] * reference <= now[0] <= MOVED[1] * reference:
            reference = round(now[0], 5)
        for region, vm in figures.items():
            on_demand, spot = round(vm[0], 5), None if vm[1] is None else round(vm[1], 5)
            low, high = (f * reference for f in PLAUSIBLE)
            if not low <= on_demand <= high:
                held_out.append(f"{machine.name} in {region}: ${on_demand}/h against the "
                                f"reference ${reference}/h")
                continue
            if spot is not None and spot >= on_demand:
                spot = None  # not a discount: the reference spot figure stands
            elif spot is not None and spot < SPOT_FLOOR * on_demand:
                held_out.append(f"{machine.name} in {region}: spot ${spot}/h against "
                                f"${on_demand}/h on demand")
                spot = None
            rows.append({"instance_type": machine.name, "region": region,
                         "on_demand_usd_h": str(on_demand),
                         "spot_usd_h": "" if spot is None else str(spot),
                         "source": source, "date": date})
    return rows, held_out


def catalog_machines(cloud: str) -> list[Machine]:
    return [Machine(cloud, kind.name, kind.gpu_model, kind.gpus, kind.gpu_memory_gb,
                    tuple(kind.regions), kind.on_demand_usd_h)
            for kind in facts(cloud).instance_types]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sortie.infra.price_refresh",
        description="Refresh infra/<cloud>/prices.csv from a provider's price list as a public "
                    "repository keeps it (the formats: this module's docstring).")
    parser.add_argument("cloud", choices=CLOUDS)
    parser.add_argument("file", type=Path, help="the source file, as its repository has it")
    parser.add_argument("--format", dest="form", choices=FORMATS, default="skypilot")
    parser.add_argument("--source", required=True,
                        help="what the file is, e.g. 'aws/karpenter-provider-aws "
                             "pkg/providers/pricing/zz_generated.pricing_aws.go @6fc13b5'")
    parser.add_argument("--date", help="the source's own date, YYYY-MM-DD (its commit's date); "
                                       "a file that says when it was generated needs none")
    args = parser.parse_args(argv)
    try:
        text = args.file.read_text()
        table, stamp = read_source(text, args.form)
    except (OSError, UnicodeDecodeError, ValueError, KeyError, AttributeError) as exc:
        parser.error(f"{args.file}: not a readable {args.form} price list ({exc})")
    if not table:
        parser.error(f"{args.file}: no prices in it as {args.form} lays them out (--format?)")
    date = args.date or stamp
    if date is None or not re.fullmatch(r"\d{4}-\d{2}(-\d{2})?", date):
        parser.error("--date: the source's own date (YYYY-MM-DD): when its prices were set, "
                     "not when they were read")
    rows, held_out = refresh(catalog_machines(args.cloud), text, args.source, date, args.form)
    if not rows:  # the wrong file or format: the cloud's file is kept as it is
        parser.error(f"{args.file}: none of {args.cloud}'s catalog machines in it; "
                     f"{prices_file(args.cloud)} is left as it was")
    write_rows(prices_file(args.cloud), rows)
    print(f"{prices_file(args.cloud)}: {len(rows)} rows")
    for line in held_out:
        print(f"held out (implausible): {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
