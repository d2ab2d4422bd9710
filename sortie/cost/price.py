"""What every price a backend says has: dollars an hour and the terms they are at. A local
cluster's notional price (`stacks/local_rehearsal.NotionalPrice`) and a Slurm allocation's
GPU-hours (`stacks/slurm_sites.GpuHourPrice`) are two; the engine reads only this."""

from __future__ import annotations

from typing import Protocol


class Price(Protocol):
    @property
    def usd_per_hour(self) -> float:
        """The whole cluster's $/h."""
        ...

    @property
    def terms(self) -> str:
        """What the figure is, in words: "notional: $2/h a node", "$3 per GPU-hour"."""
        ...
