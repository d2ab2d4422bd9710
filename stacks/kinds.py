"""Every kind of sortie a controller keeps, one entry each: the folder its sorties' state is in
(``$SORTIE_HOME/<folder>/<name>/``), the class that lists and acts on them, and whether they
have nodes to reach. The registry (`sortie/fleet/registry.py`) reads this table, and imports a
kind's module only when it acts on one of its sorties: `sortie exec` on a local cluster loads
no cloud, Slurm or attached code.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sortie.core import naming
from sortie.stacks.cloud.access import DEFAULT_ACCESS, CloudAccess
from sortie.stacks.listing import Listing, LiveListing


@dataclass(frozen=True)
class Kind:
    name: str  # `Seen.kind`: "local", "kept", "cloud", "attached", "slurm", "slurm-site"
    folder: str  # under $SORTIE_HOME
    module: str  # in `sortie.stacks`, with...
    listing: str  # ...the class, made with (home), or (home, access) where it ``reaches``
    live: bool  # its sorties have nodes: jobs run on them (kept buckets have none)
    marker: str = ""  # a file each sortie's folder must hold to count (a cloud's record)
    reaches: bool = False  # it reaches the clouds' state (`CloudAccess`)
    # sortie made its machines: an orphan is reaped, `down` destroys; False (attached): used
    # as it is, never reaped, only detached (`down --forget`, `--destroy-stack` when asked)
    own: bool = True

    def names(self, home: Path) -> list[str]:
        """Its sorties' names, from the folders alone: what its listing's `cluster_ids` says
        (`tests/test_kinds.py` holds the two together)."""
        names = naming.names_in(home / self.folder)
        return [n for n in names if (home / self.folder / n / self.marker).is_file()] \
            if self.marker else names

    def load(self, home: Path, access: CloudAccess = DEFAULT_ACCESS) -> Listing:
        return self._made(home, access)

    def load_live(self, home: Path, access: CloudAccess = DEFAULT_ACCESS) -> LiveListing:
        """Its listing, whose backend runs jobs (a kind with nodes only: `live`)."""
        assert self.live, self.name
        return self._made(home, access)

    def _made(self, home: Path, access: CloudAccess) -> Any:
        made = getattr(importlib.import_module(f"sortie.stacks.{self.module}"), self.listing)
        return made(home, access) if self.reaches else made(home)


# In the order a NAME is looked up.
KINDS = (
    Kind("local", naming.CLUSTERS, "local.local_backend", "LocalBackend", live=True),
    Kind("kept", naming.KEPT, "kept", "KeptBuckets", live=False),
    Kind("cloud", naming.STACKS, "cloud.cloud_records", "CloudRecords", live=True,
         marker="sortie.json", reaches=True),
    Kind("attached", naming.ATTACHED, "attached.attached_backend", "AttachedBackend", live=True,
         own=False),
    Kind("slurm", "allocations", "slurm.slurm_backend", "SlurmBackend", live=True),
    # Last: a Slurm cluster attached to allocate on is no cluster of sortie's (`down` forgets it)
    Kind("slurm-site", "slurm", "slurm.site_listing", "SlurmSiteListing", live=False,
         own=False),
)
LIVE_KINDS = tuple(kind.name for kind in KINDS if kind.live)


def kind_named(name: str) -> Kind:
    """The entry of a `Seen.kind` ("elsewhere": another controller's cloud sortie)."""
    name = "cloud" if name == "elsewhere" else name
    return next(kind for kind in KINDS if kind.name == name)

