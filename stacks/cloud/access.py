"""How a controller reaches the clouds' state (`CloudAccess`): light to import, since every kind's
listing takes one (`stacks/kinds.py`) and a command on a local cluster should not load the
clouds' spec and catalog to name its type."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (types only: `stack_api` loads the spec and the catalog)
    from sortie.stacks.cloud.stack_api import RunningMachines, StackStore, Sweep


@dataclass(frozen=True)
class CloudAccess:
    """How to reach the clouds: the state backend (--backend-url) and, for tests, the stack
    store and tag sweep to use instead of the real Pulumi CLI and cloud APIs."""

    backend_url: str | None = None
    stacks: StackStore | None = None
    sweep: Sweep | None = None
    running: RunningMachines | None = None  # which machines the cloud says are not stopped


DEFAULT_ACCESS = CloudAccess()  # this controller's own backend, the real CLI and sweeps
