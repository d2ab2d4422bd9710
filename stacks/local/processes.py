"""What runs for a local cluster: found from its state directory, so that `reclaim` and `down`
stop exactly what sortie started, whichever process asks."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import psutil

from sortie.stacks.machine.held_limits import TAG_ENV, tag_of
from sortie.stacks.machine.loopback import alive_now
from sortie.stacks.machine.node_cgroup import NodeCgroup
from sortie.stacks.machine.node_network import NodeNetwork


def node_cgroups(state: Path, index: int | None = None) -> list[NodeCgroup]:
    """The cgroups of the cluster's sshd nodes (or node ``index``'s) that exist: named as the
    nodes' network namespaces are, whether or not the cluster has its own network."""
    network = NodeNetwork(state)
    indexes = [index] if index is not None else sorted(
        int(p.name.removeprefix("node-")) for p in state.glob("nodes/node-*")
        if p.name.removeprefix("node-").isdigit())
    return [group for i in indexes if (group := NodeCgroup(network.namespace(i))).exists()]


def cluster_processes(state: Path, node: str | None = None) -> list[psutil.Process]:
    """Every live process sortie started for the local cluster at ``state`` (or one node): its
    sshd daemons' trees, what left them (a job in a session of its own) or was started apart
    (a relay, a booted node's nspawn) by the tag in its environment, what runs in a node's own
    namespace; never this process nor its ancestors."""
    pid_files = state.glob(f"nodes/{node or '*'}/sshd.pid")  # (not below: a booted node's root)
    marker = f"{state / 'nodes' / node if node else state}/"  # "c1/" never matches "c10"
    found: dict[int, psutil.Process] = {}
    for pid_file in pid_files:
        try:
            daemon = psutil.Process(int(pid_file.read_text()))
            if marker in " ".join(daemon.cmdline()):  # never a recycled pid
                for proc in (daemon, *daemon.children(recursive=True)):
                    found[proc.pid] = proc
        except (ValueError, OSError, psutil.Error):
            continue
    tag = tag_of(state)
    if tag:
        wanted = f"{tag}:{node}" if node else f"{tag}:"
        for proc in psutil.process_iter():
            try:
                value = proc.environ().get(TAG_ENV, "")
            except (psutil.Error, OSError):
                continue
            if value == wanted or (node is None and value.startswith(wanted)):
                found[proc.pid] = proc
    index = int(node.removeprefix("node-")) if node else None
    in_cgroups = {pid for group in node_cgroups(state, index) for pid in group.pids()}
    for pid in NodeNetwork(state).pids(index) | in_cgroups:
        with contextlib.suppress(psutil.Error):
            found.setdefault(pid, psutil.Process(pid))
    spared = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    return [p for p in found.values() if p.pid not in spared and alive_now(p)]
