"""What a user chooses of bootstrap on the command line (the health gate's levels, how much is
collected), in a module that loads nothing: the flags are declared beside commands such as
`status` that reach no node, which then need not load SSH (paramiko, Fabric) and the gate."""

from __future__ import annotations

from typing import Literal

HealthLevel = Literal["quick", "full", "off"]
HEALTH_LEVELS = ("quick", "full", "off")
DEFAULT_COLLECT_BYTES = 1 << 30  # the job's own files collected without being named
DEFAULT_MAX_BYTES = 50 * 2**30  # all of a run's files collected (`--max-collect`)
