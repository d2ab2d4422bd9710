"""What the local backend takes from the environment to rehearse what clouds do: running out
of capacity half-way through a launch, and a price per node (budgets)."""

from __future__ import annotations

import os

from sortie.core.errors import UsageError
from stacks.loopback import LOCAL_MAX_NODES

# Rehearse a launch that runs out of capacity half-way: the local "cloud" then has room for this
# many nodes only, and the node after them fails to start after the first ones did.
CAPACITY_ENV = "SORTIE_LOCAL_CAPACITY"
RATE_ENV = "SORTIE_LOCAL_USD_PER_HOUR"  # a notional price per local node, for budget rehearsals


def notional_usd_per_node_hour() -> float | None:
    """$SORTIE_LOCAL_USD_PER_HOUR: what a local node is taken to cost, to rehearse budgets."""
    given = os.environ.get(RATE_ENV, "")
    if not given:
        return None
    try:
        rate = float(given)
    except ValueError:
        rate = -1.0
    if not 0 < rate < 1e6:
        raise UsageError(f"{RATE_ENV}: {given!r} is not a price in dollars per node-hour")
    return rate


def capacity() -> int:
    """How many nodes this "cloud" has room for ($SORTIE_LOCAL_CAPACITY, a rehearsal)."""
    given = os.environ.get(CAPACITY_ENV, str(LOCAL_MAX_NODES))
    if not (given.isascii() and given.isdigit()) or int(given) > LOCAL_MAX_NODES:
        raise UsageError(f"{CAPACITY_ENV}: {given!r} is not a number of nodes, 0 to "
                         f"{LOCAL_MAX_NODES}")
    return int(given)
