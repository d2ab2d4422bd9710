"""Refresh `infra/<cloud>/prices.csv` (`infra/prices.py`) from a SkyPilot catalog file:

    python -m sortie.infra.price_refresh CLOUD VMS_CSV --source 'WHAT @COMMIT' [--date YYYY-MM]

SkyPilot's catalog (github.com/skypilot-org/skypilot-catalog: `catalogs/v7/{aws,gcp}/vms.csv`,
`catalogs/v6/azure/vms.csv`) is refreshed from the providers' price APIs. Each of the cloud's
catalog machines is taken in each of its regions (on GCP, the machine type plus its GPUs: GCP
prices them apart; the lowest of a region's zones) and the cloud's file is written. A figure far
from the machine's reference (below 3/4 or above twice it), or a spot figure under a twentieth
of the on-demand one, is held out and said, not written:
such a row is likelier an error of the source (a committed-use rate, another GPU's row) than a
regional price; the reference then stands there.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import io
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

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


def _lowest(rows: Iterable[dict[str, str]]) -> tuple[float, float | None] | None:
    """(on-demand, spot) of a region's rows (its zones): the lowest of each."""
    rows = list(rows)
    on_demand = [v for r in rows if (v := _number(r.get("Price"))) is not None]
    spot = [v for r in rows if (v := _number(r.get("SpotPrice"))) is not None]
    return (min(on_demand), min(spot) if spot else None) if on_demand else None


def _gpu_name(machine: Machine) -> str:
    """SkyPilot's accelerator name for the machine's GPUs ("A100-80GB" for 80 GB A100s)."""
    return f"{machine.gpu_model}-80GB" if machine.gpu_memory_gb == 80 else machine.gpu_model


def _figures(table: list[dict[str, str]], machine: Machine,
             region: str) -> tuple[float, float | None] | None:
    """(on-demand, spot) of ``machine`` in ``region`` from a SkyPilot vms.csv (GCP: the
    machine type plus its GPUs, priced apart), or None."""
    vm = _lowest(r for r in table if r.get("InstanceType") == machine.name
                 and r.get("Region") == region)
    if machine.cloud == "gcp" and vm is not None:
        gpus = _lowest(r for r in table if not r.get("InstanceType")
                       and r.get("AcceleratorName") == _gpu_name(machine)
                       and r.get("AcceleratorCount") in (str(machine.gpus), f"{machine.gpus}.0")
                       and r.get("Region") == region)
        vm = None if gpus is None else (
            vm[0] + gpus[0], None if vm[1] is None or gpus[1] is None else vm[1] + gpus[1])
    return vm


def refresh(machines: Iterable[Machine], vms_csv: str, source: str,
            date: str) -> tuple[list[dict[str, str]], list[str]]:
    """The rows for ``machines`` from a SkyPilot vms.csv, and what was held out (and why)."""
    table = list(csv.DictReader(io.StringIO(vms_csv)))
    rows, held_out = [], []
    for machine in machines:
        figures = {region: vm for region in machine.regions
                   if (vm := _figures(table, machine, region)) is not None}
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
    from sortie.infra.clouds import facts

    return [Machine(cloud, kind.name, kind.gpu_model, kind.gpus, kind.gpu_memory_gb,
                    tuple(kind.regions), kind.on_demand_usd_h)
            for kind in facts(cloud).instance_types]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sortie.infra.price_refresh",
        description="Refresh infra/<cloud>/prices.csv from a SkyPilot catalog vms.csv.")
    parser.add_argument("cloud", choices=("aws", "gcp", "azure"))
    parser.add_argument("vms_csv", type=Path, help="the downloaded vms.csv")
    parser.add_argument("--source", required=True,
                        help="what the file is, e.g. 'skypilot-org/skypilot-catalog "
                             "catalogs/v7/gcp/vms.csv @017e250'")
    parser.add_argument("--date", default=datetime.date.today().strftime("%Y-%m-%d"),
                        help="the source's own date (a catalog snapshot's commit date, a price "
                             "list's retrieval date; default: today)")
    args = parser.parse_args(argv)
    rows, held_out = refresh(catalog_machines(args.cloud), args.vms_csv.read_text(),
                             args.source, args.date)
    write_rows(prices_file(args.cloud), rows)
    print(f"{prices_file(args.cloud)}: {len(rows)} rows")
    for line in held_out:
        print(f"held out (implausible): {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
