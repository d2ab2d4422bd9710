"""Cloud sorties as `sortie status` sees them: this controller's, from the records it keeps
(``$SORTIE_HOME/stacks/<name>/sortie.json``), and the others in a shared state backend, from the
records beside Pulumi's state (`--backend-url`), whichever controller launched them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sortie.core import naming, statefile
from sortie.core.errors import SortieError, first_line
from sortie.infra.spec import NAMESPACE
from sortie.stacks.cloud.access import DEFAULT_ACCESS, CloudAccess
from sortie.stacks.cloud.pulumi_backend import RECORD_FILE, PulumiBackend
from sortie.stacks.cloud.stack_api import StackStore, spec_from_config, usd_per_hour
from sortie.stacks.listing import Seen, SortieRow
from sortie.stacks.records import SortieRecord


class CloudRecords:
    """This controller's cloud sorties, and (`elsewhere`) those of others in a state backend."""

    kind = "cloud"

    def __init__(self, home: Path, access: CloudAccess = DEFAULT_ACCESS) -> None:
        self.home, self.access = home, access
        self.stacks_dir = home / naming.STACKS

    def state_dir(self, cluster_id: str) -> Path:
        return naming.state_dir(self.stacks_dir, cluster_id)

    def cluster_ids(self) -> list[str]:
        return [name for name in naming.names_in(self.stacks_dir)
                if (self.stacks_dir / name / RECORD_FILE).is_file()]

    def describe(self, name: str, now: float) -> Seen:
        try:
            record = statefile.read_model(SortieRecord, self.stacks_dir / name / RECORD_FILE)
        except (SortieError, OSError) as exc:
            return Seen(SortieRow(name=name, backend="cloud", state="broken", detail=str(exc)),
                        self.kind)
        return Seen(cloud_row(record, now), self.kind, record)

    def held(self, seen: Seen) -> bool:
        return bool(seen.record and seen.record.held)  # (so recorded by `sortie up`)

    def backend(self, seen: Seen) -> PulumiBackend:
        """The backend of a cloud sortie, from its record (launched here or elsewhere)."""
        if seen.record is None:
            raise SortieError(f"{seen.row.name}: {seen.row.detail}")
        return self.backend_for_record(seen.record)

    def backend_for_record(self, record: SortieRecord) -> PulumiBackend:
        from sortie.stacks.cloud.automation import AutomationStacks, require_cloud_tools

        stacks = self.access.stacks
        if stacks is None:
            require_cloud_tools(record.cloud, f"tear down {record.cluster}")
            stacks = AutomationStacks(self.home, self.access.backend_url or record.backend_url)
        return PulumiBackend(record.profile, record.config, stacks, self.home,
                             sweep=self.access.sweep, running=self.access.running)

    def elsewhere(self, known: set[str], now: float) -> list[Seen]:
        """The sorties in the state backend that this controller does not know (``known``):
        from their records, or, for a stack launched before records, from its config. Per
        stack, an error is a row. None without a backend to list (no --backend-url and no
        Pulumi CLI)."""
        from sortie.stacks.cloud.automation import backend_stacks

        stacks = self.access.stacks or backend_stacks(self.home, self.access.backend_url)
        if stacks is None:
            return []
        seen = []
        for name in stacks.names():
            if name in known or not naming.NAME.fullmatch(name):
                continue
            try:
                record = stacks.records.load(name) or _record_from_config(stacks, name)
            except Exception as exc:  # a wrong passphrase, a damaged record: this one sortie
                seen.append(Seen(SortieRow(name=name, backend="cloud", state="broken",
                                           detail=first_line(exc), source="state backend"),
                                 "elsewhere"))
                continue
            if record is not None:
                seen.append(Seen(cloud_row(record, now, "state backend"), "elsewhere", record))
        return seen


def cloud_row(record: SortieRecord, now: float, source: str = "this controller") -> SortieRow:
    age, ttl_left = now - record.created, record.expires_at - now
    state = "kept" if record.kept else "expired" if ttl_left <= 0 else \
        "orphaned" if record.controller and record.controller.gone(now) else "up"
    running = state in ("up", "orphaned")  # an expired node has powered itself off
    return SortieRow(name=record.cluster, backend=record.cloud, nodes=record.nodes,
                     age_s=round(age), state=state,
                     usd_so_far=round(record.usd_per_hour * age / 3600, 2),
                     usd_per_hour=record.usd_per_hour if running else 0.0,
                     owner=record.owner, ttl_left_s=round(max(0.0, ttl_left)),
                     profile=record.profile,
                     detail=record.kept or (_held(record.cluster, state, record.idle_stop_minutes)
                                            if record.held else None),
                     idle_stop_s=record.idle_stop_minutes * 60.0
                     if record.held and record.idle_stop_minutes else None,
                     source=source)


def _held(name: str, state: str, idle_min: int | None = None) -> str:
    if state == "expired":
        return (f"held with `sortie up`, past its TTL: its nodes have shut down; `sortie down "
                f"{name}` (or `sortie reap`) destroys the rest")
    idle = f"; its nodes power off after {idle_min}m with nothing running (`sortie reap` " \
        "then destroys the rest)" if idle_min else ""
    return (f"held with `sortie up`: `sortie exec {name}` runs jobs on it; `sortie down {name}` "
            f"destroys it, else its TTL ends it{idle}")


def _record_from_config(stacks: StackStore, name: str) -> SortieRecord | None:
    """A stack without a record: a sortie only if `sortie run` set its expiry."""
    config = stacks.open(name).config()
    if not config.get(f"{NAMESPACE}:expiresAt"):
        return None
    spec = spec_from_config(name, config)
    assert spec.expires_at is not None
    expires = spec.expires_at.timestamp()
    return SortieRecord(cluster=name, profile="(from the state backend)", cloud=spec.cloud,
                        region=spec.region, nodes=spec.nodes,
                        created=expires - spec.ttl_hours * 3600, expires_at=expires,
                        usd_per_hour=usd_per_hour(spec), config=config,
                        backend_url=stacks.backend_url)


if TYPE_CHECKING:  # mypy holds the class to what its kind's listing does (`stacks/listing.py`)
    from sortie.stacks.listing import LiveListing

    _conforms: type[LiveListing] = CloudRecords
