"""Per-region prices of the catalog's machines: `infra/<cloud>/prices.csv`, one row per machine and
region with its on-demand and spot $/h and, per row, where the figure is from and the source's
own date (when the figures were set, not when they were read). A region without a row is priced
at its reference region's row (else the catalog's reference figure, `InstanceType.on_demand_usd_h`).
The rows are made by `infra/price_refresh.py`, not typed."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
COLUMNS = ("instance_type", "region", "on_demand_usd_h", "spot_usd_h", "source", "date")


@dataclass(frozen=True)
class RegionPrice:
    """One machine's prices in one region, and where they come from."""

    on_demand_usd_h: float
    spot_usd_h: float | None  # None: the source has none (the reference spot figure stands)
    source: str
    date: str  # "2026-07-20": the source's own date, when its figures were set


def prices_file(cloud: str) -> Path:
    return HERE / cloud / "prices.csv"


def regional_prices(cloud: str) -> dict[str, dict[str, RegionPrice]]:
    """The cloud's rows by machine, then region ({} where it has no file)."""
    path = prices_file(cloud)
    if not path.is_file():
        return {}
    found: dict[str, dict[str, RegionPrice]] = {}
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            spot = row["spot_usd_h"]
            found.setdefault(row["instance_type"], {})[row["region"]] = RegionPrice(
                float(row["on_demand_usd_h"]), float(spot) if spot else None, row["source"],
                row["date"])
    return found


def write_rows(path: Path, rows: list[dict[str, str]]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
