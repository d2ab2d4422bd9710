"""Looking inside a sortie's nodes: an SSH command pinned to a node's host key, and the
torchrun logs (live from the nodes while it runs, from the run's directory once collected)."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path

from bootstrap import ssh
from bootstrap.errors import UsageError
from bootstrap.inventory import Inventory, Node
from bootstrap.statefile import read_tail
from bootstrap.sync import job_dir
from bootstrap.train import MAX_LOG_READ, read_log
from sortie import registry
from stacks import naming


def _node(inventory: Inventory, name: str) -> Node:
    try:
        return inventory.node(name)
    except KeyError as exc:
        raise UsageError(f"NODE: {exc.args[0]}") from None


def ssh_command(home: Path, name: str | None, node: str, command: tuple[str, ...]) -> list[str]:
    """The `ssh` command line into NODE of sortie NAME (the only one running when None),
    trusting only the node's pinned host key."""
    inventory, known_hosts = registry.running_nodes(home, name)
    target = _node(inventory, node)
    options = [*ssh.openssh_args(target, known_hosts), "-o", "LogLevel=ERROR"]
    if not command:  # a shell where the job runs ($SORTIE_WORKDIR), else in sortie's workdir
        job, base = shlex.quote(job_dir(target)), shlex.quote(target.workdir)
        options.append("-t")
        command = (f'cd {job} 2>/dev/null || cd {base}; exec "${{SHELL:-/bin/sh}}" -l',)
    return ["ssh", *options, "--", target.address, *command]


def logs(home: Path, name: str, node: str | None, runs_dir: Path) -> Iterator[tuple[str, str]]:
    """(node, its torchrun log) for every node of sortie NAME, or NODE only: live from the
    nodes (a held cluster's: its newest `exec`'s; an `exec`'s run id: that run's, while its
    cluster holds it), else as collected into RUNS_DIR/NAME/logs."""
    naming.check_name(name, "NAME")
    live = registry.live_run(home, name)
    if live:
        cluster, run_id = live
        inventory, _ = registry.running_nodes(home, cluster)
        for target in [_node(inventory, node)] if node else inventory.nodes:
            conn = ssh.connect(target)
            try:
                text = read_log(conn, target, run_id)
            finally:
                conn.close()
            yield target.name, text
        return
    directory = runs_dir / name / "logs"
    files = [directory / f"{naming.check_name(node, 'NODE')}.log"] if node else \
        sorted(directory.glob("*.log"))
    files = [f for f in files if f.is_file() and not f.is_symlink()]
    if not files:
        raise UsageError(f"NAME: no running sortie named {name!r} and no logs in {directory}")
    for path in files:
        tail = read_tail(path, MAX_LOG_READ)  # never through a symlink
        if tail is not None:
            text, skipped = tail
            cut = f"[the first {skipped} bytes of {path} are not shown]\n" if skipped else ""
            yield path.stem, cut + text.decode("utf-8", "replace")
