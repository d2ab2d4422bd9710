"""What the local backend takes from the environment to rehearse what clouds do: running out
of capacity half-way through a launch, and a price per node (budgets)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from pydantic import BaseModel, Field

from sortie.core import statefile
from sortie.core.errors import UsageError
from sortie.cost.price import RATE_ENV
from sortie.stacks.machine.loopback import LOCAL_MAX_NODES

# Rehearse a launch that runs out of capacity half-way: the local "cloud" then has room for this
# many nodes only, and the node after them fails to start after the first ones did.
CAPACITY_ENV = "SORTIE_LOCAL_CAPACITY"


def notional_usd_per_node_hour() -> float | None:
    """$SORTIE_LOCAL_USD_PER_HOUR: what a local node is taken to cost, to rehearse budgets."""
    given = os.environ.get(RATE_ENV, "")
    if not given:
        return None
    try:
        rate = float(given)
    except ValueError:
        rate = -1.0
    if not 1e-6 <= rate < 1e6:  # (1e-300 made a budget last longer than any clock counts)
        raise UsageError(f"{RATE_ENV}: {given[:40]!r} is not a price in dollars per node-hour "
                         "(0.000001 to 1000000)")
    return rate


def check_local_torch() -> None:
    """Local nodes run jobs (the bundled trainer, torchrun) with this Python: without torch
    here nothing can train on them, said before anything starts (the controller itself never
    imports it: `pip install sortie` on a laptop that drives clouds has none)."""
    if importlib.util.find_spec("torch") is None:
        raise UsageError(f"local nodes run jobs with this Python ({sys.executable}), which has "
                         "no torch: pip install 'sortie[local]'")


def capacity() -> int:
    """How many nodes this "cloud" has room for ($SORTIE_LOCAL_CAPACITY, a rehearsal)."""
    given = os.environ.get(CAPACITY_ENV, str(LOCAL_MAX_NODES))
    if not (given.isascii() and given.isdigit()) or int(given) > LOCAL_MAX_NODES:
        raise UsageError(f"{CAPACITY_ENV}: {given!r} is not a number of nodes, 0 to "
                         f"{LOCAL_MAX_NODES}")
    return int(given)


PRICE_FILE = "price.json"  # in a local cluster's state: its notional price, from its start


class NotionalPrice(BaseModel):
    """What a local cluster is taken to cost, fixed when it starts: `up`, `status`, `exec`'s
    report and the cost ledger all count it at this price, whatever the environment says
    later."""

    usd_per_node_hour: float = Field(ge=1e-6, lt=1e6, allow_inf_nan=False)
    nodes: int = Field(ge=1, le=LOCAL_MAX_NODES)

    @property
    def usd_per_hour(self) -> float:
        return self.usd_per_node_hour * self.nodes

    @property
    def terms(self) -> str:
        return f"notional: ${self.usd_per_node_hour:g}/h a node ({RATE_ENV})"


def notional_price(nodes: int) -> NotionalPrice | None:
    """What ``nodes`` local nodes started now cost ($SORTIE_LOCAL_USD_PER_HOUR; none without)."""
    rate = notional_usd_per_node_hour()
    return NotionalPrice(usd_per_node_hour=rate, nodes=nodes) if rate else None


def record_price(state: Path, nodes: int) -> None:
    """Fix a new local cluster's price, if it has one."""
    if price := notional_price(nodes):
        statefile.write_text(state / PRICE_FILE, price.model_dump_json() + "\n")


def recorded_price(state: Path) -> NotionalPrice | None:
    """A local cluster's price as fixed at its start (None: it has none, or it is damaged)."""
    try:
        return statefile.read_model(NotionalPrice, state / PRICE_FILE)
    except (FileNotFoundError, statefile.CorruptStateError):
        return None
