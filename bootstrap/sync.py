"""Send the user's workdir to every node: rsync over SSH with the cluster's pinned host keys.
What is sent is `bootstrap/workdir.py`'s plan.

A sync with nothing to send costs one round trip per node: over the connection sortie already
holds, the node lists the names, sizes and modification times (to the nanosecond, which rsync
keeps) of its copies; when they are the workdir's, rsync is not started there.

What is deleted on the nodes: only files an earlier sync sent that are gone from the workdir or
ignored now. The sync remembers what it sent (``synced_list``, on the controller); each sync
deletes those on the node over SSH (`DELETE_SCRIPT`), not with rsync's `--delete-missing-args`:
a security fix in rsync 3.4.3, backported to Debian 12's 3.2.7-1+deb12u6 (the booted nodes',
2026-12-01), makes the receiver refuse a missing name that follows a present one ("invalid
file mode 00", "protocol incompatibility (code 2)"; RsyncProject/rsync#910), so a sync after
a file was deleted from the workdir failed on such nodes.
Whatever the job wrote there (outputs, checkpoints, a `.venv` made by setup) was never sent, so
no sync deletes it, as plain `rsync --delete` would.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import stat
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from sortie.bootstrap.node_layout import job_dir
from sortie.bootstrap.ssh import (
    NodeError,
    files_host,
    on_all,
    openssh_args,
    ssh_host,
)
from sortie.bootstrap.ssh_channel import run_with_input
from sortie.bootstrap.transport import NodeTransport
from sortie.bootstrap.workdir import SyncPlan, always_excluded
from sortie.core import statefile
from sortie.core.errors import SortieError, last_line
from sortie.core.inventory import Inventory, LoginHost, Node
from sortie.core.progress import some_of
from sortie.core.sizes import readable_bytes
from sortie.core.statefile import CorruptStateError

RSYNC_TIMEOUT_S = 600


def _encoded(names: Iterable[str]) -> bytes:
    """Names NUL-separated as the file system has them (a name that is not UTF-8 included)."""
    return "\0".join(names).encode("utf-8", "surrogateescape")


def _decoded(data: bytes) -> list[str]:
    return data.decode("utf-8", "surrogateescape").split("\0")


def ssh_transport(node: Node | LoginHost, known_hosts: Path) -> str:
    """rsync's `-e`: the cluster's own key and pinned known_hosts, never trust on first use."""
    return shlex.join(["ssh", *openssh_args(node, known_hosts), "-o", "BatchMode=yes",
                       "-o", "ConnectTimeout=15"])


# One line per change rsync made: its itemized change (`<f…` a file sent to the node, `>f…` one
# copied on this machine, `.f…` only its permissions, `cL…` a symlink made there, `*deleting` a
# deletion), the file's length and its name. `--stats` would be shorter, but it names nothing.
CHANGE_FORMAT = "%i\t%l\t%n"


@dataclass(frozen=True)
class Sent:
    """What one node's sync changed: files (and symlinks) sent, their bytes, files deleted;
    compared by the counts, the names kept to be said."""

    files: int = 0
    bytes: int = 0
    deleted: int = 0
    sent_names: tuple[str, ...] = field(default=(), compare=False)
    deleted_names: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def from_changes(cls, out: str) -> Sent:
        """Read rsync's `CHANGE_FORMAT` lines (anything else is skipped)."""
        size, sent, deleted = 0, [], []
        for line in out.splitlines():
            change, _, rest = line.partition("\t")
            length, _, name = rest.partition("\t")
            if change.startswith("*deleting"):
                deleted.append(name or rest)
            elif change.startswith(("<f", ">f", ".f", "cL")):  # (">": a copy on this machine,
                sent.append(name)  # to a Slurm login node's shared disk when sortie runs there)
                size += int(length) if length.isdigit() and change.startswith(("<f", ">f")) \
                    else 0
        return cls(len(sent), size, len(deleted), tuple(sorted(sent)), tuple(sorted(deleted)))

    def plus_deleted(self, names: list[str]) -> Sent:
        return replace(self, deleted=self.deleted + len(names),
                       deleted_names=(*self.deleted_names, *names))

    def describe(self) -> str:
        """"sent 2 files (3.1 KiB): a.py, b.py; deleted 1: old.py", or "nothing changed"."""
        said = [f"sent {self.files:,} file{'' if self.files == 1 else 's'} "
                f"({readable_bytes(self.bytes)})"
                + (f": {some_of(self.sent_names)}" if self.sent_names else "")] \
            if self.files else []
        said += [f"deleted {self.deleted:,}"
                 + (f": {some_of(self.deleted_names)}" if self.deleted_names else "")] \
            if self.deleted else []
        return "; ".join(said) or "nothing changed"


def describe_sync(sent: dict[str, Sent], nodes: Iterable[str]) -> list[str]:
    """One line per distinct outcome over ``nodes``, naming its nodes: what `sync` sent to
    each, and "unchanged" where rsync was not needed or changed nothing."""
    outcomes: dict[str, list[str]] = {}
    for name in nodes:
        done = sent.get(name, Sent())
        said = "workdir unchanged" if done == Sent() else f"workdir: {done.describe()}"
        outcomes.setdefault(said, []).append(name)
    return [f"{said} on {', '.join(names)}" for said, names in outcomes.items()]


def rsync_command(node: Node, known_hosts: Path, source: Path, destination: str,
                  file_list: Path, compress: bool = True, by_content: bool = False) -> list[str]:
    """Compression pays over a network; between local nodes it only costs CPU. Modification
    times are compared to the nanosecond (`--modify-window=-1`): to the second, rsync skips a file
    edited within the second of its last sync when its size stayed the same. ``by_content``:
    files are compared by checksum (a file edited within one tick of the file system's clock
    keeps its size and time). Each change is printed (`CHANGE_FORMAT`) so that the sync can
    say what it sent."""
    return ["rsync", "--archive", "--modify-window=-1", *(["--compress"] if compress else []),
            *(["--checksum"] if by_content else []),
            "--partial", "--from0", f"--out-format={CHANGE_FORMAT}",
            # (A file gone since the plan was made: skipped, and deleted by the next sync.)
            f"--files-from={file_list}", "--ignore-missing-args", "--mkpath",
            *_destination(node, known_hosts, source, destination)]


def _destination(node: Node, known_hosts: Path, source: Path, destination: str) -> list[str]:
    """Over SSH; a Slurm node's workdir is on the file system its login node shares: there.
    The destination is made first by a `mkdir -p`, which takes another's making it in its
    stride: hosts that share a file system (an NFS home) sync into one directory at once, and
    rsync's own mkdir of it fails when the other's came first ("error in file IO (code 11)")."""
    host = files_host(node)
    if host is None:  # (`_rsync_all` makes it here)
        return [f"{source}/", f"{destination}/"]
    return ["-e", ssh_transport(host, known_hosts),
            f"--rsync-path=mkdir -p {shlex.quote(destination)} && rsync", f"{source}/",
            f"{ssh_host(host.address)}:{destination}/"]


# GNU stat --printf: name, size, mtime to the nanosecond, permissions (a `chmod +x` changes no
# mtime, and rsync --archive sends it).
STAT_FORMAT = "%n\t%s\t%.9Y\t%a\n"


def _stat_digest(plan: SyncPlan) -> str | None:
    """What `_up_to_date` expects a node to list, hashed; None when the quick check cannot
    tell (symlinks: rsync does not keep their modification times)."""
    digest = hashlib.sha256()
    for name in plan.files:
        found = os.lstat(plan.root / name)
        if not stat.S_ISREG(found.st_mode):
            return None
        seconds, nanoseconds = divmod(found.st_mtime_ns, 1_000_000_000)
        digest.update(f"{name}\t{found.st_size}\t{seconds}.{nanoseconds:09d}\t"
                      f"{stat.S_IMODE(found.st_mode):o}\n".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def _up_to_date(conn: NodeTransport, node: Node, plan: SyncPlan, expected: str) -> bool:
    """One round trip: whether the node's copies have the workdir's names, sizes and
    modification times (a missing or changed file, or an older `stat`, says no)."""
    # Every path reads all of stdin: a command that ends first cuts the channel under the sender.
    try:
        listed = run_with_input(
            conn, f"{{ cd {shlex.quote(job_dir(node))} 2>/dev/null && xargs -0 -r stat "
            f"--printf {shlex.quote(STAT_FORMAT)} -- 2>/dev/null; cat > /dev/null; }} "
            "| sha256sum", _encoded(plan.files), 60)
    except Exception:  # noqa: BLE001 - only a shortcut: rsync runs, and says what is wrong
        return False
    return listed.ok and listed.stdout.split()[:1] == [expected]


# Deletes the NUL-separated names on stdin under the job directory, and prints those it
# deleted: only where the name's directory resolves inside the job directory (a symlinked
# directory on the node never leads a deletion out of it); a symlink is deleted, not followed.
DELETE_SCRIPT = r"""cd "$1" 2>/dev/null || { cat >/dev/null; exit 0; }
here=$(pwd -P)
while IFS= read -r -d '' name || [ -n "$name" ]; do
  case "$(realpath -m -- "$(dirname -- "$name")")/" in
    "$here"/*) if [ -e "$name" ] || [ -L "$name" ]; then
                 rm -f -- "$name" && printf '%s\0' "$name"; fi ;;
  esac
done"""


def _delete_on(node: Node, known_hosts: Path, names: Sequence[str]) -> list[str]:
    """Delete ``names`` (files an earlier sync sent, now gone from the workdir or ignored) in
    the node's job directory; returns those that were there."""
    script = ["bash", "-c", DELETE_SCRIPT, "delete", job_dir(node)]
    host = files_host(node)
    command = script if host is None else [
        "ssh", *openssh_args(host, known_hosts), "-o", "BatchMode=yes",
        "-o", "ConnectTimeout=15", "--", ssh_host(host.address), shlex.join(script)]
    try:
        done = subprocess.run(command, input=_encoded(names), capture_output=True,
                              timeout=RSYNC_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise NodeError(f"{node.name}: deleting files no longer synced took over "
                        f"{RSYNC_TIMEOUT_S}s") from None
    if done.returncode != 0:
        why = last_line(done.stderr.decode(errors="replace"), f"exit {done.returncode}")
        raise NodeError(f"{node.name}: deleting files no longer synced failed: {why}")
    return [name for name in _decoded(done.stdout) if name]


def _rsync_all(inventory: Inventory, plan: SyncPlan, stale: list[str], targets: list[Node],
               synced_list: Path, by_content: bool = False) -> list[Sent]:
    """One rsync per node in ``targets``, in parallel: the plan's files; then ``stale`` (sent
    before; gone from the workdir or ignored now) deleted over SSH. Returns what each changed,
    in order."""
    listing = synced_list.with_suffix(".sending")
    listing.write_bytes(_encoded(plan.files))
    known_hosts = synced_list.with_suffix(".known_hosts")  # what rsync's ssh may trust
    known_hosts.write_text(inventory.known_hosts())
    try:
        def send(node: Node) -> Sent:
            command = rsync_command(node, known_hosts, plan.root, job_dir(node), listing,
                                    compress=inventory.backend != "local", by_content=by_content)
            if files_host(node) is None:
                Path(job_dir(node)).mkdir(parents=True, exist_ok=True)
            try:
                done = subprocess.run(command, capture_output=True, text=True,
                                      timeout=RSYNC_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise NodeError(f"{node.name}: syncing the workdir took over "
                                f"{RSYNC_TIMEOUT_S}s") from None
            except OSError as exc:
                raise SortieError(f"syncing the workdir needs rsync here ({exc})") from None
            if done.returncode != 0:
                why = last_line(done.stderr, f"exit {done.returncode}")
                raise NodeError(f"{node.name}: syncing the workdir failed: {why}")
            changed = Sent.from_changes(done.stdout)
            return changed.plus_deleted(_delete_on(node, known_hosts, stale)) if stale else changed

        return on_all(targets, send)
    finally:
        listing.unlink(missing_ok=True)
        known_hosts.unlink(missing_ok=True)


def sync(inventory: Inventory, plan: SyncPlan, synced_list: Path,
         nodes: list[Node] | None = None,
         conns: dict[str, NodeTransport] | None = None,
         digests: Mapping[str, str] | None = None) -> dict[str, Sent]:
    """rsync ``plan`` to every node's `job_dir` in parallel, trusting only the inventory's
    pinned host keys; files a sync listed in ``synced_list`` that the plan no longer has are
    deleted there (gone from the workdir, or ignored now). With ``conns`` (open connections
    by node name), a node whose copies are already the workdir's is skipped. With ``digests``
    (each file's SHA-256), a file whose size and time are those it was last sent with but whose
    content is not is sent all the same (compared by content). Returns what rsync sent to each
    node it ran for, by name. Raises NodeError naming the first node that failed."""
    previous = _decoded(synced_list.read_bytes()) if synced_list.is_file() else []
    current = set(plan.files)
    # A state file is untrusted like any other: only plain relative names may become deletions.
    stale = [name for name in previous if name and name not in current
             and not name.startswith("/") and ".." not in name.split("/")
             and not always_excluded(name)]
    asked = nodes or inventory.nodes
    # Slurm nodes share their workdir (on the login node's file system): it is synced once.
    shared = {node.name: next(n for n in asked if n.srun and n.workdir == node.workdir)
              for node in asked if node.srun}
    targets = [node for node in asked if shared.get(node.name, node) is node]
    tied = _edited_in_a_tick(plan, synced_list, digests)
    expected = _stat_digest(plan) if conns and not stale and not tied else None
    if expected and conns:
        known, live = expected, conns  # (the checker's narrowing does not reach a lambda)
        fresh = on_all(targets, lambda n: n.name in live and _up_to_date(
            live[n.name], n, plan, known))
        targets = [node for node, same in zip(targets, fresh, strict=True) if not same]
    sent = _rsync_all(inventory, plan, stale, targets, synced_list, bool(tied)) \
        if targets else []
    synced_list.write_bytes(_encoded(plan.files))
    _record_contents(plan, synced_list, digests)
    done = {node.name: changed for node, changed in zip(targets, sent, strict=True)}
    return {**done, **{name: done[first.name] for name, first in shared.items()
                       if first.name in done}}


# Beside the sync list: each file's size, time and SHA-256 as last sent (name: [size, ns, hash]).
CONTENTS_SUFFIX = ".contents"
MAX_CONTENTS_BYTES = 64 << 20


def _stat_key(plan: SyncPlan, name: str) -> list[int] | None:
    try:
        found = os.lstat(plan.root / name)
    except OSError:
        return None
    return [found.st_size, found.st_mtime_ns]


def _edited_in_a_tick(plan: SyncPlan, synced_list: Path,
                      digests: Mapping[str, str] | None) -> list[str]:
    """Files whose size and modification time are what they were last sent with, but whose
    content is not: edited within one tick of the file system's clock (or given their old
    time back), which a comparison by size and time never sees."""
    if not digests:
        return []
    try:
        sent = statefile.read_json(synced_list.with_suffix(CONTENTS_SUFFIX), MAX_CONTENTS_BYTES)
    except (OSError, CorruptStateError):
        return []
    if not isinstance(sent, dict):
        return []
    return [name for name, digest in digests.items()
            if isinstance(was := sent.get(name), list) and len(was) == 3
            and was[:2] == _stat_key(plan, name) and was[2] != digest]


def _record_contents(plan: SyncPlan, synced_list: Path,
                     digests: Mapping[str, str] | None) -> None:
    where = synced_list.with_suffix(CONTENTS_SUFFIX)
    if not digests:
        where.unlink(missing_ok=True)
        return
    statefile.write_json(where, {name: [*key, digest] for name, digest in digests.items()
                                 if (key := _stat_key(plan, name)) is not None})
