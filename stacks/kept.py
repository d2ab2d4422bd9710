"""Local buckets a teardown kept because their artifacts were not verified: listed by `sortie
status` until `sortie down NAME` removes one."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from sortie.core import naming
from sortie.stacks.backend import Teardown
from sortie.stacks.listing import Seen, SortieRow


class KeptBuckets:
    """Local buckets a teardown kept because their artifacts were not verified
    (``home/kept/<cluster>``): listed until `sortie down NAME` removes one."""

    kind = "kept"

    def __init__(self, home: Path) -> None:
        self.kept_dir = home / naming.KEPT

    def state_dir(self, cluster_id: str) -> Path:
        return naming.state_dir(self.kept_dir, cluster_id)

    def cluster_ids(self) -> list[str]:
        return naming.names_in(self.kept_dir)

    def describe(self, name: str, now: float) -> Seen:
        path = self.kept_dir / name
        return Seen(SortieRow(
            name=name, backend="local", state="kept", age_s=round(now - path.stat().st_mtime),
            detail=f"its bucket (checkpoints) at {path}; `sortie down {name}` removes it"),
            self.kind)

    def backend(self, seen: Seen) -> KeptBuckets:
        return self

    def down(self, cluster_id: str, keep_bucket: bool = False) -> Teardown:
        shutil.rmtree(self.state_dir(cluster_id))
        return Teardown(cluster_id, removed=1, unit="kept buckets", state_removed=True)


if TYPE_CHECKING:  # mypy holds the class to what its kind's listing does (`stacks/listing.py`)
    from sortie.stacks.listing import Listing

    _conforms: type[Listing] = KeptBuckets
