"""A run's hard budget (`--max-cost`): what the cluster has cost so far at its launch terms
(nodes × $/h, from the start of the launch, replacements included: the cluster keeps its size),
a warning at 80 %, and the reason to stop the job at 100 %, less what stopping and teardown will
still cost: it is stopped the way a preemption stops it (SIGTERM: the bundled trainer
checkpoints first), collected and torn down."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sortie.core.errors import SortieError
from sortie.cost.money import usd, usd_per_hour

WARN_AT = 0.8
SHOWN_AT = (0.25, 0.5, WARN_AT)  # spend said as it passes each share of the budget


class BudgetSpent(SortieError):
    """The budget ran out between phases (a slow bootstrap, setup or health check): no phase
    after it starts; the run is collected and torn down like one stopped while training."""


@dataclass
class Budget:
    max_usd: float
    usd_per_hour: float  # the whole cluster's, at its launch terms
    # Stopping and teardown, still billed: stop this much early (asked at each check: a local
    # cluster's grows with the machine's load).
    wind_down_s: Callable[[], float] = lambda: 0.0
    started: float = field(default_factory=time.time)  # the launch's start, as the ledger has it
    shown: float = 0.0  # the last share of the budget said

    def spent(self, now: float | None = None) -> float:
        """At the launch terms from ``started`` to ``now`` (wall clock: the ledger's)."""
        return (max(0.0, (now or time.time()) - self.started)) / 3600 * self.usd_per_hour

    def reserve(self) -> tuple[float, float]:
        """(seconds, dollars) kept for stopping and teardown, still billed after the stop."""
        seconds = max(0.0, self.wind_down_s())
        return seconds, seconds / 3600 * self.usd_per_hour

    def check(self, warn: Callable[[str], None]) -> str | None:
        """Why the job must stop now (what is spent and what stopping and teardown will cost
        reach the budget), or None; says the spend as that total passes a quarter, half and
        80 % (the warning) of the budget, so the warning comes before the stop."""
        spent = self.spent()
        seconds, kept = self.reserve()
        committed = spent + kept
        reserved = (f" + {usd(kept)} for the {seconds:.0f} s that stopping and teardown take"
                    if kept >= 0.005 else "")
        if committed >= self.max_usd:
            return f"budget of {usd(self.max_usd)} reached ({usd(spent)} spent{reserved})"
        passed = [share for share in SHOWN_AT if self.shown < share <= committed / self.max_usd]
        if passed:
            self.shown = passed[-1]
            warn(f"budget: {usd(spent)} of {usd(self.max_usd)} spent{reserved} "
                 f"({committed / self.max_usd:.0%} at {usd_per_hour(self.usd_per_hour)})"
                 + ("; the job is stopped at 100 %" if self.shown >= WARN_AT else ""))
        return None
