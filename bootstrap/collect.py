"""Copy a run's artifacts and logs from the nodes to the controller, before teardown."""

from __future__ import annotations

import stat
from pathlib import Path, PurePosixPath

from fabric import Connection

from bootstrap.train import run_dir
from stacks.inventory import Node


def _copy_tree(conn: Connection, remote: PurePosixPath, local: Path) -> list[Path]:
    sftp = conn.sftp()
    copied: list[Path] = []
    try:
        entries = sftp.listdir_attr(str(remote))
    except FileNotFoundError:
        return copied
    for entry in entries:
        source, target = remote / entry.filename, local / entry.filename
        if stat.S_ISDIR(entry.st_mode or 0):
            copied += _copy_tree(conn, source, target)
        elif entry.filename.endswith(".tmp"):
            continue  # an interrupted atomic write, never a result
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            sftp.get(str(source), str(target))
            copied.append(target)
    return copied


def collect(conn: Connection, node: Node, run_id: str, dest: Path) -> list[Path]:
    """Copy the node's trainer outputs into ``dest`` and its torchrun log to ``dest/logs``.

    Outputs from all nodes merge into one directory: rank 0 writes them on whichever node the
    rendezvous placed it."""
    remote = PurePosixPath(run_dir(node, run_id))
    copied = _copy_tree(conn, remote / "out", dest)
    log = dest / "logs" / f"{node.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        conn.sftp().get(str(remote / "torchrun.log"), str(log))
        copied.append(log)
    except FileNotFoundError:
        pass
    return copied
