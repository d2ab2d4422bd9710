"""Every sortie this controller can see, and the backend that acts on each: NAME -> backend.

Each kind of sortie is listed and described by its own backend (`stacks.listing.Listing`):

- local clusters, ``$SORTIE_HOME/clusters/<name>/`` (`LocalBackend`);
- buckets a teardown kept because their artifacts were not verified, ``$SORTIE_HOME/kept/<name>/``
  (`KeptBuckets`; a cloud sortie's kept bucket is in its record);
- cloud sorties this controller launched, ``$SORTIE_HOME/stacks/<name>/sortie.json``, and those
  of other controllers in a shared state backend (`CloudRecords`, `--backend-url`);
- clusters sortie did not create, ``$SORTIE_HOME/attached/<name>/`` (`AttachedBackend`): never
  destroyed, never reaped;
- allocations on a Slurm cluster, ``$SORTIE_HOME/allocations/<name>/`` (`SlurmBackend`).

A new backend is one module with a `Listing` and one entry in `stacks/kinds.py` (`KINDS`): its
folder, its class, whether it has nodes. A kind's module loads only when one of its sorties is
acted on (`status` lists them all).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from sortie.core import naming
from sortie.core.errors import SortieError, UsageError
from sortie.core.inventory import Inventory
from sortie.cost.ledger import CostEntry, record_cost
from sortie.fleet.held_state import mark_going
from sortie.infra.cloud_home import Leftover
from sortie.stacks.backend import Backend, Teardown

if TYPE_CHECKING:  # (the attached backend loads only when an attached cluster is acted on;
    # the clouds' stack code, when a stack is)
    from sortie.stacks.attached.attached_backend import Forgotten
    from sortie.stacks.cloud.stack_api import StackHandle, StackStore
from sortie.stacks.cloud.access import DEFAULT_ACCESS, CloudAccess
from sortie.stacks.kinds import KINDS, LIVE_KINDS, kind_named
from sortie.stacks.listing import REAPED_STATES, Listing, LiveListing, Removable, Seen


def listings(home: Path, access: CloudAccess = DEFAULT_ACCESS) -> list[Listing]:
    """Every kind of sortie this controller keeps one of, in the order a NAME is looked up: a
    kind's module is loaded only where its folder names a sortie (what its listing would list,
    `tests/test_kinds.py`), so `status` of local clusters loads no other backend."""
    return [kind.load(home, access) for kind in KINDS if kind.names(home)]


def _listing(home: Path, kind: str, access: CloudAccess = DEFAULT_ACCESS) -> Listing:
    return kind_named(kind).load(home, access)


def _live(home: Path, kind: str, access: CloudAccess = DEFAULT_ACCESS) -> LiveListing:
    """The listing of a kind of sortie with nodes (`LIVE_KINDS`), whose backend runs jobs."""
    entry = kind_named(kind)
    if not entry.live:
        raise UsageError(f"NAME: a sortie of kind {kind!r} has no nodes to act on")
    return entry.load_live(home, access)


# -- what there is --------------------------------------------------------------------------------


def survey(home: Path, access: CloudAccess = DEFAULT_ACCESS, elsewhere: bool = False
           ) -> list[Seen]:
    """Every sortie of this controller; with ``elsewhere``, also the others in the state
    backend (--backend-url, or this controller's own when it has one and the Pulumi CLI is
    here)."""
    now = time.time()
    kinds = listings(home, access)
    seen = [listing.describe(name, now) for listing in kinds for name in listing.cluster_ids()]
    if elsewhere:  # only cloud records are kept where other controllers keep theirs
        from sortie.stacks.cloud.cloud_records import CloudRecords

        seen += CloudRecords(home, access).elsewhere({s.row.name for s in seen}, now)
    return seen


def spending(home: Path, access: CloudAccess = DEFAULT_ACCESS) -> list[tuple[str, float]]:
    """Each sortie's owner and what it has cost so far: what owners' budgets count besides
    the ledger."""
    return [seen.row.spend for seen in survey(home, access)]


# -- acting on one --------------------------------------------------------------------------------


def _named(home: Path, name: str) -> Listing | None:
    """Which of this controller's kinds of sortie holds NAME, if any: from the state
    directories alone, without reaching any node."""
    return next((kind.load(home) for kind in KINDS if name in kind.names(home)), None)


def refuse_taken(home: Path, name: str, field: str) -> None:
    """A new sortie's (or attached cluster's) NAME must be a sortie name that no sortie of this
    controller has: a usage error naming ``field`` otherwise, before anything is made."""
    naming.check_name(name, field)
    if _named(home, name) is not None:
        raise UsageError(f"{field}: a sortie named {name!r} exists (see `sortie status`)")


def find(home: Path, name: str) -> Seen:
    """The sortie NAME of this controller; a NAME that is not a sortie name, or names none, is a
    usage error before anything is touched."""
    naming.check_name(name, "NAME")
    listing = _named(home, name)
    if listing is None:
        raise UsageError(f"NAME: no sortie named {name!r} (see `sortie status`)")
    return listing.describe(name, time.time())


def backend_for(home: Path, seen: Seen, access: CloudAccess = DEFAULT_ACCESS) -> Backend:
    """The backend that made a sortie with nodes: local, or the stack it was launched on; for
    an attached cluster, the one that detaches it."""
    return _live(home, seen.kind, access).backend(seen)


def remover_for(home: Path, seen: Seen, access: CloudAccess = DEFAULT_ACCESS) -> Removable:
    """What removes a sortie (`down`): its backend, or for a kept bucket, the bucket's."""
    return _listing(home, seen.kind, access).backend(seen)


def state_of(home: Path, seen: Seen) -> Path:
    """Where this controller keeps the state of a sortie it found."""
    return _listing(home, seen.kind).state_dir(seen.row.name)


def to_take_over(home: Path, name: str) -> Backend:
    """The backend of sortie NAME, which `watch` takes over: only one whose controller is gone."""
    seen = find(home, name)
    if seen.row.state not in REAPED_STATES:
        raise UsageError(f"NAME: sortie {name!r} is {seen.row.state}: only a sortie whose "
                         "controller is gone can be taken over")
    return backend_for(home, seen)


def to_tear_down(home: Path, name: str | None) -> list[Seen]:
    """NAME (an unknown or invalid NAME stops here), or with None every sortie of this
    controller but kept buckets and attached Slurm clusters, removed only when named."""
    if name is not None:
        return [find(home, name)]
    return [seen for seen in survey(home)
            if kind_named(seen.kind).live and seen.row.state != "kept"]


def held_cluster(home: Path, name: str, access: CloudAccess = DEFAULT_ACCESS,
                 degraded: bool = False) -> tuple[Backend, Inventory]:
    """Cluster NAME, held with `sortie up` (local or `--stack`) or attached, and up (or, with
    ``degraded``, a node short: `sortie repair`), for `exec` and `run --on`. A sortie that a
    `run` (or another controller) drives is refused: its job is not ours to replace."""
    seen = find(home, name)
    driven = UsageError(f"NAME: {name!r} is a sortie `sortie run` drives, not a cluster held "
                        "with `sortie up`")
    if seen.kind not in LIVE_KINDS:
        raise UsageError(f"NAME: {name!r} is not a cluster held with `sortie up` or attached "
                         "with `sortie attach`")
    kind = kind_named(seen.kind)
    if kind.own and not is_held(home, seen):
        raise driven
    if seen.row.state != "up" and not kind.own and not degraded:  # (not ours to replace)
        raise SortieError(f"NAME: {name!r} is {seen.row.state}: {seen.row.nodes_up} of "
                          f"{seen.row.nodes} nodes accept SSH connections")
    # (a held allocation queued again: Slurm requeued it, its nodes are lost; `repair` mends it)
    if seen.row.state != "up" and not (degraded and seen.row.state in ("degraded", "queued")):
        why = seen.row.detail or "see `sortie status`"
        raise UsageError(f"NAME: {name!r} is {seen.row.state} ({why}); `sortie repair {name}` "
                         f"mends it (or `sortie down {name}` and `sortie up` again)")
    backend = backend_for(home, seen, access)
    return backend, backend.inventory(name)


def teardown(home: Path, seen: Seen, access: CloudAccess = DEFAULT_ACCESS) -> Teardown:
    """Tear one sortie down; a failure is this sortie's report, never an exception. A held
    cluster's cost, up to now, goes into the cost ledger (a run records its own)."""
    try:
        if seen.kind in LIVE_KINDS:
            mark_going(state_of(home, seen))
        held = is_held(home, seen)
        report = remover_for(home, seen, access).down(seen.row.name)
        if held:
            row, record = seen.row, seen.record
            ended = time.time()
            record_cost(home, CostEntry(
                name=row.name, kind="held", backend=row.backend, owner=row.owner,
                profile=record.profile if record else None, nodes=row.nodes,
                usd_per_hour=row.usd_per_hour, started=ended - row.age_s, ended=ended,
                accounted_s=report.accounted_s),
                record.backend_url if record else None)
        return report
    except SortieError as exc:
        return Teardown(seen.row.name, leftovers=[Leftover("sortie", seen.row.name, str(exc))])


def is_held(home: Path, seen: Seen) -> bool:
    """Held with `sortie up`: no controller drives it (as its listing says). A kept bucket is
    not, nor another controller's cloud sortie ("elsewhere": its cost is that controller's)."""
    if seen.kind not in LIVE_KINDS:
        return False
    try:
        return kind_named(seen.kind).load_live(home).held(seen)
    except SortieError:  # damaged state: `down` still cleans it, without a cost line
        return False


def user_stack(name: str, cwd: Path, stacks: StackStore | None = None) -> StackHandle:
    """The user's own stack NAME (of the Pulumi project in ``cwd``), or ``stacks``' in tests."""
    from sortie.stacks.cloud.automation import user_stack as automation_stack

    return stacks.open(name) if stacks is not None else automation_stack(name, cwd)


def forget_attached(home: Path, name: str) -> Forgotten | Teardown:
    """`sortie down NAME --forget`: forget an attached cluster, touching none of its nodes.
    Only an attached one: sortie's own clusters are torn down, with proof. (An attached Slurm
    cluster is only a record: forgetting it is what `down` does.)"""
    seen = find(home, name)
    if kind_named(seen.kind).own:
        raise UsageError(f"--forget: {name!r} is not attached (`sortie down {name}` tears a "
                         "sortie's own cluster down, with proof)")
    if not kind_named(seen.kind).live:
        return teardown(home, seen)
    from sortie.stacks.attached.attached_backend import AttachedBackend

    return AttachedBackend(home).forget_unchecked(name)


def destroy_attached_stack(home: Path, name: str, access: CloudAccess = DEFAULT_ACCESS
                           ) -> list[Teardown]:
    """`sortie down NAME --destroy-stack`: detach NAME, then destroy the Pulumi stack it was
    attached from, with proof. Only for a stack attach, and only when asked."""
    from sortie.stacks.cloud.stack_api import sweep_by_tags
    from sortie.stacks.cloud.teardown import destroy_stack

    seen = find(home, name)
    if kind_named(seen.kind).own:
        raise UsageError(f"--destroy-stack: {name!r} is not attached (`sortie down {name}` "
                         "tears a sortie's own cluster down)")
    from sortie.stacks.attached.attached_backend import AttachedBackend

    backend = AttachedBackend(home)
    attachment = backend.attachment(name)
    if attachment.source != "pulumi stack" or attachment.cwd is None:
        raise UsageError(f"--destroy-stack: {name!r} was attached from a {attachment.source}, "
                         "not a Pulumi stack: sortie never destroys machines it did not create")
    stack = user_stack(attachment.origin, Path(attachment.cwd), access.stacks)
    mark_going(backend.state_dir(name))
    detached = backend.down(name)
    destroyed = destroy_stack(stack, attachment.stack_cluster or attachment.origin,
                              access.sweep or sweep_by_tags)
    if destroyed.clean and not detached.clean:  # its machines are gone: nothing left on them
        backend.forget(name)
        detached = Teardown(name, removed=detached.removed, unit=detached.unit, detached=True,
                            state_removed=True)
    return [detached, destroyed]
